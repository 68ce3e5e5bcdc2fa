#!/usr/bin/env bash
# The whole GPU check in one command, for a lent GPU machine (it has no network: nothing is fetched).
#
#   bash benchmarks/gpu/run_all.sh                   # every step, from the repository root, on CUDA
#   bash benchmarks/gpu/run_all.sh tests text        # only these steps (a device tool that limits one
#                                                    # command to 10 minutes runs them in turn)
#
# Steps, each bounded so that the whole run stays under 25 minutes:
#   device   the device's name and memory (nvidia-smi), versions -> $OUT/gpu_device.txt
#   tests    pytest -m gpu (CUDA tests: half precision, drafts on other devices, device_map, the lean
#            encoder-decoder loop, verification on the device, CUDA graphs) -> $OUT/gpu_tests.log  (300 s)
#   text     the embedded text pair in bf16, batch 1 / 8 / 32 / 64: plain, assisted generation, ours
#            (chains verified on the device; and with cuda_graphs=True) -> $OUT/text_generate_cuda.{json,md}  (420 s)
#   syncs    host syncs per round phase (sync debug mode + profiler; eager and cuda_graphs, batch 1 / 8)
#            -> $OUT/gpu_host_syncs.{json,md}  (90 s)
#   speed    the real-size speed model: random-weight Llama pairs (1B target / ~140M draft; 8B / 1B when
#            the memory and its --max-seconds allow) in bf16 at batch 1 / 8 / 32: c, r(k), our per-round
#            overhead, predicted speedups -> $OUT/gpu_speed_model.{json,md}  (240 s)
#   rl       RL rollouts with --device cuda (when gymnasium is there)  (120 s)
#   physics  Lennard-Jones with --device cuda  (120 s)
# $OUT defaults to benchmarks/results (the device tool sets its own $OUT and brings it back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(device tests text syncs speed rl physics)
# speculate.domains is the checkout's domains/ folder once the package is installed (no deps: the
# image's torch, transformers, numba and scipy are used as they are)
$PY -c "import speculate.domains.text" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation -e . \
    >"$OUT/gpu_install.log" 2>&1 || echo "editable install failed: see gpu_install.log"
status=0
for step in "${STEPS[@]}"; do
    echo "== $step"
    case $step in
    device)
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu_device.txt"
        $PY -c "import torch, transformers, numba; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numba', numba.__version__)" | tee -a "$OUT/gpu_device.txt" ;;
    tests)
        timeout 300 $PY -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 || status=1 ;;
    text)
        timeout 420 $PY benchmarks/text/bench_generate.py --device cuda --dtype bfloat16 --batch 1 8 32 64 --sweep 0 \
            --cuda-graphs --early-exit 0 --out "$OUT/text_generate_cuda" 2>&1 | tail -30 || status=1 ;;
    syncs)
        timeout 90 $PY benchmarks/gpu/host_syncs.py --device cuda --out "$OUT/gpu_host_syncs" 2>&1 | tail -12 || status=1 ;;
    speed)
        timeout 240 $PY benchmarks/gpu/bench_speed_model.py --device cuda --dtype bfloat16 --preset 1b 8b \
            --batch 1 8 32 --max-seconds 190 --out "$OUT/gpu_speed_model" 2>&1 | tail -40 || status=1 ;;
    rl)
        if $PY -c "import gymnasium" 2>/dev/null; then
            timeout 120 $PY benchmarks/rl/bench_rollouts.py --device cuda 2>&1 | tail -12 || status=1
        else
            echo "gymnasium is not installed: RL skipped"
        fi ;;
    physics)
        timeout 120 $PY benchmarks/physics/bench_lj.py --device cuda --repeats 2 2>&1 | tail -12 || status=1 ;;
    *)
        echo "unknown step $step (device tests text syncs speed rl physics)"; status=2 ;;
    esac
done
exit $status
