"""The GPU check in one budgeted command: the headline numbers first, each result written as soon as it
exists, stopping cleanly before its own time budget runs out.

    python benchmarks/gpu/check.py                          # on the lent GPU machine: at most 470 s
    python benchmarks/gpu/check.py --extended               # the second, optional command (8B, batch 64)
    python benchmarks/gpu/check.py --device cpu --dry-run   # the CPU rehearsal (tiny shapes; the tests run it)
    python benchmarks/gpu/check.py --unpack gpu_check.json  # each step's files into benchmarks/results/

Steps, by value (``STEPS``): ``device`` (the GPU, its memory, the versions), ``text`` (the embedded
pair in bf16 at batch 1, 8, 32: plain, assisted generation at batch 1, ours token / block / auto,
eager and with CUDA graphs), ``speed`` (the real-size speed model, 1B target / 136M draft: c, r(k),
per-round overhead, predicted speedups), ``syncs`` (host syncs per round phase), ``tests``
(``pytest -m gpu``), ``rl`` and ``physics`` (``--device cuda``) if time remains. Each step runs as a
subprocess with a timeout of its own share of what is left (never past the budget, minus a reserve
for writing); a step that fails or times out is recorded (its status, return code and the tail of its
output) and the next one runs, so one CUDA bug costs one row, not the run.

Everything comes back in three files under ``--out`` (default ``$OUT``, else benchmarks/results),
within the device tool's limit of 8 files: ``gpu_check.json`` (every step: status, seconds, command,
output tail, and the JSON / Markdown files it wrote, embedded), ``gpu_check.md`` (the summary) and
``gpu_check.log``. ``--unpack`` writes the embedded files next to the other results, with their own
names (``text_generate_cuda.json``, ``gpu_speed_model.md``, ...). DEVICE.md beside this file says
what to call, in which order, and what to commit.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PY = sys.executable
RESERVE = 10.0  # seconds kept back for writing the results after the last step
#: files under a step's folder that are embedded in gpu_check.json (what --unpack writes back)
KEEP = (".json", ".md", ".txt")
GPU_TESTS = ["tests/text/test_text_gpu.py", "tests/text/test_text_cuda_graphs.py",
             "tests/core/test_core_device_verify.py", "tests/physics/test_physics_systems.py"]


def _device_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    code = (
        "import json, platform, torch, transformers, numba, numpy\n"
        "info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
        "        'transformers': transformers.__version__, 'numba': numba.__version__, 'numpy': numpy.__version__,\n"
        f"        'device': {a.device!r}}}\n"
        "if torch.cuda.is_available():\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), capability=f'{p.major}.{p.minor}',\n"
        "                multiprocessors=p.multi_processor_count, count=torch.cuda.device_count())\n"
        f"open({str(d / 'gpu_device.json')!r}, 'w').write(json.dumps(info, indent=2) + '\\n')\n"
        "print(json.dumps(info))\n"
    )
    return [PY, "-c", code]


def _text_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    out = str(d / ("text_generate_cuda" if a.device == "cuda" else "text_generate_dry"))
    if a.dry_run:
        return [PY, "benchmarks/text/bench_generate.py", "--device", a.device, "--batch", "1", "--prompts", "1",
                "--new-tokens", "8", "--repeats", "1", "--sweep", "0", "--early-exit", "0", "--out", out]
    batches = ["1", "8", "32", "64"] if a.extended else ["1", "8", "32"]
    return [PY, "benchmarks/text/bench_generate.py", "--device", a.device, "--dtype", "bfloat16", "--batch", *batches,
            "--sweep", "8" if a.extended else "0", "--cuda-graphs", "--early-exit", "0", "--out", out]


def _speed_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    out = str(d / ("gpu_speed_model" if not a.extended else "gpu_speed_model_8b"))
    if a.dry_run:
        return [PY, "benchmarks/gpu/bench_speed_model.py", "--preset", "tiny", "--device", a.device, "--batch", "1",
                "--repeats", "1", "--iters", "2", "--warmup", "1", "--overhead-k", "1", "4", "--out", out]
    presets = ["8b"] if a.extended else ["1b"]
    batches = ["1", "8", "32", "64"] if a.extended else ["1", "8", "32"]
    return [PY, "benchmarks/gpu/bench_speed_model.py", "--device", a.device, "--dtype", "bfloat16", "--preset",
            *presets, "--batch", *batches, "--max-seconds", "150", "--out", out]


def _syncs_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    out = str(d / "gpu_host_syncs")
    if a.dry_run:
        return [PY, "benchmarks/gpu/host_syncs.py", "--device", a.device, "--batch", "1", "--new-tokens", "8",
                "--variants", "eager", "--profile-rounds", "2", "--out", out]
    return [PY, "benchmarks/gpu/host_syncs.py", "--device", a.device, "--out", out]


def _tests_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    import importlib.util

    per_test = ["--timeout", "90"] if importlib.util.find_spec("pytest_timeout") else []  # the GPU image has it
    return [PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *per_test,
            "--junitxml", str(d / "gpu_tests.xml"), *GPU_TESTS]


def _rl_cmd(a: argparse.Namespace, d: Path) -> list[str] | str:
    if not (ROOT / "benchmarks" / "rl" / "cache").is_dir():
        return ("no trained CartPole policies in benchmarks/rl/cache (training them takes about 10 minutes): "
                "train here with benchmarks/rl/train_cartpole.py and carry the folder")
    name = "rl_rollouts_dry" if a.dry_run else f"rl_rollouts_{a.device}"  # never the committed CPU results
    return [PY, "benchmarks/rl/bench_rollouts.py", "--device", a.device, "--quick", "--envs", "1", "8",
            "--out", str(d / name)]


def _physics_cmd(a: argparse.Namespace, d: Path) -> list[str]:
    if a.dry_run:
        return [PY, "benchmarks/physics/bench_lj.py", "--device", a.device, "--sizes", "108", "--dts", "1e-4",
                "--drafts", "cells:2.5", "--steps", "10", "--race-steps", "10", "--repeats", "1", "--no-plot",
                "--out", str(d / "physics_lj_dry")]  # a path: report.write joins it to results/ as given
    return [PY, "benchmarks/physics/bench_lj.py", "--device", a.device, "--repeats", "2", "--no-plot",
            "--out", str(d / "physics_lj_cuda")]


#: (name, command builder, the share of the time left it may take; the last step may take all of it)
STEPS: list[tuple[str, Callable, float]] = [
    ("device", _device_cmd, 0.05),
    ("text", _text_cmd, 0.40),
    ("speed", _speed_cmd, 0.45),
    ("syncs", _syncs_cmd, 0.40),
    ("tests", _tests_cmd, 0.60),
    ("rl", _rl_cmd, 0.50),
    ("physics", _physics_cmd, 1.00),
]


def _files(folder: Path, before: set[Path]) -> dict[str, str]:
    """The result files a step wrote: in its folder, and (benchmarks that always write to
    benchmarks/results) files that appeared there during the step."""
    out = {}
    for p in sorted(folder.glob("*")):
        if p.suffix in KEEP or p.suffix == ".xml":
            out[p.name] = p.read_text(errors="replace")
    new = sorted(set(RESULTS.glob("*")) - before)
    for p in new:
        if p.suffix in KEEP:
            out[p.name] = p.read_text(errors="replace")
    for p in new:  # moved into gpu_check.json (a figure is dropped): the run leaves the tree as it found it
        p.unlink()
    return out


def _markdown(rec: dict) -> str:
    lines = [f"# GPU check ({'dry run, ' if rec['dry_run'] else ''}{rec['device']})", "",
             f"`{rec['command']}`", "",
             f"budget {rec['budget']:.0f} s, used {rec['seconds']:.1f} s; device: {rec.get('device_info', {})}", "",
             "| step | status | seconds | files |", "|---|---|---|---|"]
    for s in rec["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {', '.join(s['files']) or '-'} |")
    for s in rec["steps"]:
        if s["status"] not in ("ok", "skipped"):
            lines += ["", f"## {s['name']}: {s['status']}", "", "```", s["tail"][-3000:], "```"]
    return "\n".join(lines) + "\n"


def _write(rec: dict, out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(rec, indent=2) + "\n")
    (out / "gpu_check.md").write_text(_markdown(rec))


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out or os.environ.get("OUT") or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + args.budget
    rec: dict = {"command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if args.command is None
                 else args.command, "device": args.device, "dry_run": args.dry_run, "extended": args.extended,
                 "budget": args.budget, "steps": [], "seconds": 0.0}
    log = open(out / "gpu_check.log", "w")  # kept open for the whole run
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    wanted = args.steps or [name for name, _, _ in STEPS]
    try:
        importlib.metadata.distribution("speculate")
    except importlib.metadata.PackageNotFoundError:
        # a bare machine: the checkout as a package, with the image's own torch, transformers, numba
        p = subprocess.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."],
                           cwd=ROOT, capture_output=True, text=True, timeout=max(5.0, deadline - time.monotonic()))
        rec["install"] = (p.stdout + p.stderr)[-3000:] or "installed"
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    try:
        for name, build, share in STEPS:
            if name not in wanted:
                continue
            left = deadline - time.monotonic() - RESERVE
            step = {"name": name, "status": "", "seconds": 0.0, "command": "", "files": {}, "tail": ""}
            rec["steps"].append(step)
            folder = scratch / name
            folder.mkdir()
            cmd = build(args, folder)
            if isinstance(cmd, str):
                step["status"], step["tail"] = "skipped", cmd
            elif left < 5:
                step["status"], step["tail"] = "skipped", f"the budget ran out ({left:.0f} s left)"
            else:
                limit = max(5.0, left * share if name != wanted[-1] else left)
                step["command"] = shlex.join(cmd)
                print(f"== {name} (at most {limit:.0f} s): {step['command']}", file=log, flush=True)
                before = set(RESULTS.glob("*"))
                t = time.monotonic()
                try:
                    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
                    step["returncode"] = p.returncode
                    step["status"] = "ok" if p.returncode == 0 else f"failed (exit {p.returncode})"
                    text = p.stdout + p.stderr
                except subprocess.TimeoutExpired as e:
                    step["status"] = f"timed out after {limit:.0f} s"
                    text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
                step["seconds"] = time.monotonic() - t
                step["tail"] = text[-6000:]
                log.write(text[-20000:] + "\n")
                log.flush()
                step["files"] = _files(folder, before)
                if name == "device" and "gpu_device.json" in step["files"]:
                    rec["device_info"] = json.loads(step["files"]["gpu_device.json"])
            rec["seconds"] = time.monotonic() - t0
            _write(rec, out)  # each result as soon as it exists
            print(f"{name}: {step['status']} ({step['seconds']:.1f} s)", flush=True)
    finally:
        log.close()
        rec["seconds"] = time.monotonic() - t0
        _write(rec, out)
    return rec


def unpack(path: Path, folder: Path = RESULTS) -> list[Path]:
    """Write the files a check embedded (gpu_check.json) into ``folder`` under their own names."""
    rec = json.loads(path.read_text())
    written = []
    for step in rec["steps"]:
        for name, text in step["files"].items():
            if name.endswith(".xml"):
                continue
            (folder / name).write_text(text)
            written.append(folder / name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=470.0, help="seconds for the whole check (default 470)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the rehearsal)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes: the CPU rehearsal of every step")
    ap.add_argument("--extended", action="store_true",
                    help="the second command: 8B speed model, batch 64, the k sweep (run when time remains)")
    ap.add_argument("--steps", nargs="+", choices=[name for name, _, _ in STEPS], default=None,
                    help="only these steps (in their fixed order)")
    ap.add_argument("--out", default=None, help="folder of gpu_check.{json,md,log} (default $OUT, else results)")
    ap.add_argument("--unpack", type=Path, default=None, metavar="GPU_CHECK_JSON",
                    help="write the files a check embedded into benchmarks/results, then stop")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.unpack is not None:
        for p in unpack(args.unpack):
            print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
        return 0
    if args.budget <= RESERVE + 5:
        ap.error(f"--budget must be more than {RESERVE + 5:.0f} s")
    if args.device == "cuda" and args.dry_run:
        ap.error("--dry-run is the CPU rehearsal: use --device cpu")
    rec = run(args)
    return 0 if all(s["status"] in ("ok", "skipped") for s in rec["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
