"""Inverse-CDF draws shared by every kernel, in Numba and in NumPy, bit for bit the same.

Rule: given non-negative weights w (computed in float64) and a uniform u in [0, 1), return the
smallest j with cumsum(w)[j] > u * sum(w), sums taken left to right; if rounding leaves no such j,
the last j with w[j] > 0. A zero-weight index is never returned. Residual weights that sum to no
more than ``tiny`` (rounding noise when p == q) fall back to the target row itself.
"""

from __future__ import annotations

import numba as nb
import numpy as np

# status codes returned by the kernels (0 = ok)
OK, BAD_INDEX, Q_ZERO, NOT_FINITE, EMPTY = 0, 1, 2, 3, 4
MESSAGES = {
    BAD_INDEX: "drafted outcome is outside 0..V-1",
    Q_ZERO: "drafted outcome has draft probability q = 0 (it cannot have been drawn from q)",
    NOT_FINITE: "probabilities contain NaN or inf",
    EMPTY: "a probability row has no positive mass",
}

_JIT = {"nogil": True, "cache": True}


@nb.njit(**_JIT)
def draw_row(row, u):  # row: [V] target probabilities; returns (index, status)
    total = 0.0
    for j in range(row.shape[0]):
        total += np.float64(row[j])
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= 0.0:
        return -1, EMPTY
    t = u * total
    c = 0.0
    last = -1
    for j in range(row.shape[0]):
        w = np.float64(row[j])
        if w > 0.0:
            c += w
            last = j
            if c > t:
                return j, OK
    return last, OK


@nb.njit(**_JIT)
def residual_total(p_row, q_row, scale):  # sum_x max(scale * p[x] - q[x], 0), in float64
    total = 0.0
    sp = 0.0
    for j in range(p_row.shape[0]):
        pj = np.float64(p_row[j])
        qj = np.float64(q_row[j])
        sp += pj + qj
        d = scale * pj - qj
        if d > 0.0:
            total += d
    if not np.isfinite(sp):
        return -1.0
    return total


@nb.njit(**_JIT)
def draw_residual(p_row, q_row, scale, total, u, tiny):
    """Index from max(scale * p - q, 0) whose sum is ``total``; falls back to p if total <= tiny."""
    if total <= tiny:
        return draw_row(p_row, u)
    t = u * total
    c = 0.0
    last = -1
    for j in range(p_row.shape[0]):
        d = scale * np.float64(p_row[j]) - np.float64(q_row[j])
        if d > 0.0:
            c += d
            last = j
            if c > t:
                return j, OK
    return last, OK


# ----------------------------------------------------------------------------- NumPy twins
def draw_row_np(row: np.ndarray, u: float) -> tuple[int, int]:
    w = np.asarray(row, dtype=np.float64)
    cums = np.cumsum(w)
    total = cums[-1]
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= 0.0:
        return -1, EMPTY
    return _search(w, cums, u * total), OK


def residual_weights_np(p_row: np.ndarray, q_row: np.ndarray, scale: float) -> np.ndarray | None:
    p64 = np.asarray(p_row, dtype=np.float64)
    q64 = np.asarray(q_row, dtype=np.float64)
    if not np.isfinite(np.cumsum(p64 + q64)[-1]):
        return None
    return np.maximum(scale * p64 - q64, 0.0)


def draw_residual_np(p_row, q_row, scale: float, u: float, tiny: float) -> tuple[int, int]:
    w = residual_weights_np(p_row, q_row, scale)
    if w is None:
        return -1, NOT_FINITE
    cums = np.cumsum(w)
    total = cums[-1]
    if total <= tiny:
        return draw_row_np(p_row, u)
    return _search(w, cums, u * total), OK


def _search(w: np.ndarray, cums: np.ndarray, t: float) -> int:
    j = int(np.searchsorted(cums, t, side="right"))
    if j >= len(cums):
        j = int(np.flatnonzero(w > 0)[-1])
    return j


def tiny_for(dtype: np.dtype) -> float:
    """Residual mass below which p and q are equal up to rounding (then draw from p)."""
    return 4.0 * float(np.finfo(dtype).eps)


@nb.njit(**_JIT)
def draw_rows(probs, u):  # probs [N, V], u [N] -> (index [N], status)
    out = np.empty(probs.shape[0], np.int64)
    for i in range(probs.shape[0]):
        j, st = draw_row(probs[i], u[i])
        if st != OK:
            return out, st
        out[i] = j
    return out, OK


@nb.njit(**_JIT)
def check_probs(probs, tol):  # probs [N, V] -> (status, row, col, sums [N]); status 0 ok, 1 NaN/inf, 2 negative, 3 sum
    sums = np.empty(probs.shape[0], np.float64)
    for i in range(probs.shape[0]):
        s = 0.0
        for j in range(probs.shape[1]):
            v = np.float64(probs[i, j])
            if not np.isfinite(v):
                return 1, i, j, sums
            if v < 0.0:
                return 2, i, j, sums
            s += v
        sums[i] = s
        if abs(s - 1.0) > tol:
            return 3, i, -1, sums
    return 0, -1, -1, sums
