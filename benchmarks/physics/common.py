"""Shared helpers of the physics benchmarks: environment record, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results"


def environment(device: str) -> dict:
    """What the numbers were measured on (the machine is shared: load average included)."""
    import numba
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": commit,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "numba_threads": numba.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": device,
        "gpu": gpu,
    }


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def batch_cost(force, X: np.ndarray, sizes: tuple[int, ...], repeats: int = 5) -> dict:
    """Best (minimum) seconds of one force call on b configurations, for b in sizes.

    Interleaved over sizes; the minimum, not the median, because the machine is shared and
    interference only ever adds time.
    """
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for b in sizes:
        force(np.repeat(X[None], b, axis=0))                      # warm up
    for _ in range(repeats):
        for b in sizes:
            Xb = np.repeat(X[None], b, axis=0)
            t = time.perf_counter()
            force(Xb)
            times[b].append(time.perf_counter() - t)
    return {b: float(np.min(v)) for b, v in times.items()}


def write(name: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    js, md = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    js.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    md.write_text(markdown)
    return js, md
