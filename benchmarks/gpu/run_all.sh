#!/usr/bin/env bash
# The whole GPU check in one command, for a lent GPU machine (it has no network: nothing is fetched).
#
#   bash benchmarks/gpu/run_all.sh            # from the repository root, on a machine with CUDA
#
# Steps, each bounded so that the whole run stays under 25 minutes:
#   1. the device's name and memory (nvidia-smi) -> $OUT/gpu_device.txt
#   2. pytest -m gpu (CUDA tests: half precision, drafts on other devices, device_map, the lean
#      encoder-decoder loop, verification on the device) -> $OUT/gpu_tests.log
#   3. the embedded text pair in bf16, batch 1 / 8 / 32 / 64: plain, assisted generation, ours
#      (chains verified on the device; and with cuda_graphs=True) -> $OUT/text_generate_cuda.{json,md}
#   4. physics (Lennard-Jones) and RL rollouts with --device cuda, when their packages are there.
# $OUT defaults to benchmarks/results (the device tool sets its own $OUT and brings it back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
# speculate.domains is the checkout's domains/ folder once the package is installed (no deps: the
# image's torch, transformers, numba and scipy are used as they are)
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/gpu_install.log" 2>&1 || echo "editable install failed: see gpu_install.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu_device.txt"
$PY -c "import torch, transformers, numba; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numba', numba.__version__)" | tee -a "$OUT/gpu_device.txt"
status=0
timeout 420 $PY -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 || status=1
timeout 480 $PY benchmarks/text/bench_generate.py --device cuda --dtype bfloat16 --batch 1 8 32 64 --sweep 0 \
    --cuda-graphs --early-exit 0 --out "$OUT/text_generate_cuda" 2>&1 | tail -30 || status=1
if $PY -c "import gymnasium" 2>/dev/null; then
    timeout 180 $PY benchmarks/rl/bench_rollouts.py --device cuda 2>&1 | tail -12 || status=1
fi
timeout 180 $PY benchmarks/physics/bench_lj.py --device cuda --repeats 2 2>&1 | tail -12 || status=1
exit $status
