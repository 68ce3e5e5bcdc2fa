"""Shared timing helpers of the physics benchmarks (machine record and result files: ../report.py)."""

from __future__ import annotations

import time

import numpy as np


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

