"""Inverse-CDF draws, in Numba and in NumPy, bit for bit the same: the one sampling rule shared by
the verification kernels (speculate.verify) and Categorical.sample (speculate.distributions).

Rule: given non-negative weights w (computed in float64) and a uniform u in [0, 1), return the
smallest j whose running sum exceeds u * sum(w); if rounding leaves no such j, the last j with
w[j] > 0. A zero-weight index is never returned. Residual weights that sum to no more than ``tiny``
(rounding noise when p == q) fall back to the target row itself.

Bad input is reported, never drawn from: NaN or inf anywhere in a row that is summed, or a
negative entry in a row drawn from directly (mode 0), makes the sum NaN (status NOT_FINITE); a
residual draw whose outcome has a negative subtracted weight (q[j] < 0, which is what could put
residual mass where the target has none) returns NEGATIVE. Negative entries of q elsewhere in a
residual row are not looked for: that would cost a compare and a select per entry on the hot
path (+25% on the residual sums, measured); full validation is Categorical(validate=True)'s job.

Speed: sums are taken in blocks of BLOCK weights with LANES independent accumulators (so the adds
pipeline instead of forming one dependency chain), and the search first walks the block sums,
then scans a single block: one pass over a row plus one block, instead of two passes. The NumPy
twins add in exactly the same order, so kernels and references agree bit for bit.
"""

from __future__ import annotations

import numba as nb
import numpy as np

# status codes of the draws (0 = ok); speculate.verify adds its own (verify/_shared.py)
OK, NOT_FINITE, EMPTY, NEGATIVE = 0, 3, 4, 6

_JIT = {"nogil": True, "cache": True}
BLOCK = 256  # elements per block of partial sums (a multiple of LANES)
LANES = 8  # independent accumulators per block: breaks the floating-point add chain


@nb.njit(nogil=True, cache=True, inline="always")
def weight(a, b, sa, sb, mode, j):
    """Weight j: mode 0 -> a[j], NaN if it is negative or NaN; mode 1 -> sa * a[j] - sb * b[j]
    clipped at 0, except that NaN and -inf give NaN (so that a bad input makes the sum non-finite
    and the caller raises)."""
    if mode == 0:
        x = np.float64(a[j])
        return x if x >= 0.0 else np.nan  # a negative probability poisons the sum, at no extra cost
    x = sa * np.float64(a[j]) - sb * np.float64(b[j])
    return x if x > 0.0 else 0.0 * x  # 0 * -inf = NaN: branch-free, so the adds still vectorise


@nb.njit(**_JIT)
def n_blocks(V):
    return (V + BLOCK - 1) // BLOCK


@nb.njit(**_JIT)
def weight_sums(a, b, sa, sb, mode, bs):
    """Fill bs[k] with the sum of block k (LANES lanes, then lanes left to right); return the
    left-to-right sum of the block sums. NaN or inf anywhere propagates to the result."""
    V = a.shape[0]
    total = 0.0
    for k in range((V + BLOCK - 1) // BLOCK):
        start = k * BLOCK
        end = min(start + BLOCK, V)
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        j = start
        while j + LANES <= end:
            s0 += weight(a, b, sa, sb, mode, j)
            s1 += weight(a, b, sa, sb, mode, j + 1)
            s2 += weight(a, b, sa, sb, mode, j + 2)
            s3 += weight(a, b, sa, sb, mode, j + 3)
            s4 += weight(a, b, sa, sb, mode, j + 4)
            s5 += weight(a, b, sa, sb, mode, j + 5)
            s6 += weight(a, b, sa, sb, mode, j + 6)
            s7 += weight(a, b, sa, sb, mode, j + 7)
            j += LANES
        o = 0
        while j < end:  # the tail of the last block: offsets 0..6 go to lanes 0..6
            x = weight(a, b, sa, sb, mode, j)
            if o == 0:
                s0 += x
            elif o == 1:
                s1 += x
            elif o == 2:
                s2 += x
            elif o == 3:
                s3 += x
            elif o == 4:
                s4 += x
            elif o == 5:
                s5 += x
            else:
                s6 += x
            o += 1
            j += 1
        blk = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
        bs[k] = blk
        total += blk
    return total


@nb.njit(**_JIT)
def search(a, b, sa, sb, mode, bs, t):
    """The smallest j with (running sum up to j) > t: find the block from the block sums, then scan it."""
    V = a.shape[0]
    c = 0.0
    for k in range(bs.shape[0]):
        nc = c + bs[k]
        if nc > t:
            last = -1
            for j in range(k * BLOCK, min(k * BLOCK + BLOCK, V)):
                x = weight(a, b, sa, sb, mode, j)
                if x > 0.0:
                    c += x
                    last = j
                    if c > t:
                        return j
            return last
        c = nc
    for j in range(V - 1, -1, -1):  # rounding put t past the total: the last positive weight
        if weight(a, b, sa, sb, mode, j) > 0.0:
            return j
    return -1


@nb.njit(**_JIT)
def draw_row(row, u, bs):  # row: [V] target probabilities; returns (index, status)
    total = weight_sums(row, row, 1.0, 0.0, 0, bs)
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= 0.0:
        return -1, EMPTY
    return search(row, row, 1.0, 0.0, 0, bs, u * total), OK


@nb.njit(**_JIT)
def residual_total(p_row, q_row, scale, bs):  # sum_x max(scale * p[x] - q[x], 0); -1 if not finite
    total = weight_sums(p_row, q_row, scale, 1.0, 1, bs)
    return total if np.isfinite(total) else -1.0


@nb.njit(**_JIT)
def draw_residual(p_row, q_row, scale, u, tiny, bs):
    """Index from max(scale * p - q, 0); falls back to p if that has mass <= tiny (p == q up to rounding)."""
    total = weight_sums(p_row, q_row, scale, 1.0, 1, bs)
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= tiny:
        return draw_row(p_row, u, bs)
    j = search(p_row, q_row, scale, 1.0, 1, bs, u * total)
    if q_row[j] < 0.0:  # residual mass that comes from a negative q, not from p
        return -1, NEGATIVE
    return j, OK


@nb.njit(**_JIT)
def draw_rows(probs, u):  # probs [N, V], u [N] -> (index [N], status)
    out = np.empty(probs.shape[0], np.int64)
    bs = np.empty(n_blocks(probs.shape[1]), np.float64)
    for i in range(probs.shape[0]):
        j, st = draw_row(probs[i], u[i], bs)
        if st != OK:
            return out, st
        out[i] = j
    return out, OK


_WARM = False


def warm_up() -> None:
    """Compile (or load from Numba's cache) the draws a draft step makes, once per process, so that
    the first round's draft time is not compilation: ``lookahead="auto"`` estimates the draft's cost
    from it (the first call of a fresh process measured c = 0.15 instead of 0.002)."""
    global _WARM
    if _WARM:
        return
    for dt in (np.float32, np.float64):
        draw_rows(np.full((1, 2), 0.5, dt), np.full(1, 0.25))
        check_probs(np.full((1, 2), 0.5, dt), 1e-3)
    _WARM = True


@nb.njit(**_JIT)
def check_probs(probs, tol):  # probs [N, V] -> (status, row, col, sums [N]); 1 NaN/inf, 2 negative, 3 sum
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


# ----------------------------------------------------------------------------- NumPy twins
def weights_np(a, b, sa: float, sb: float, mode: int) -> np.ndarray:
    if mode == 0:
        x = np.asarray(a, np.float64)
        return np.where(x >= 0.0, x, np.nan)  # negative or NaN -> NaN, as in weight
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 0 * inf: NaN, reported by the caller
        x = sa * np.asarray(a, np.float64) - sb * np.asarray(b, np.float64)
        return np.where(x > 0.0, x, 0.0 * x)  # NaN stays NaN and -inf becomes NaN, as in weight


def sums_np(w: np.ndarray) -> tuple[np.ndarray, float]:
    """Block sums and total, added in exactly the order the Numba kernels add them."""
    nb_ = -(-len(w) // BLOCK)
    pad = np.zeros(nb_ * BLOCK)
    pad[: len(w)] = w
    with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf: NaN, reported by the caller
        lanes = np.cumsum(pad.reshape(nb_, BLOCK // LANES, LANES), axis=1)[:, -1, :]
        bs = np.cumsum(lanes, axis=1)[:, -1]
        return bs, float(np.cumsum(bs)[-1])


def search_np(w: np.ndarray, bs: np.ndarray, t: float) -> int:
    cb = np.cumsum(bs)
    k = int(np.searchsorted(cb, t, side="right"))
    if k < len(cb):
        c0 = cb[k - 1] if k > 0 else 0.0
        blk = w[k * BLOCK : (k + 1) * BLOCK]
        i = int(np.searchsorted(np.cumsum(np.concatenate(([c0], blk)))[1:], t, side="right"))
        return k * BLOCK + (i if i < len(blk) else int(np.flatnonzero(blk > 0)[-1]))
    return int(np.flatnonzero(w > 0)[-1])


def draw_row_np(row, u: float) -> tuple[int, int]:
    w = weights_np(row, row, 1.0, 0.0, 0)
    bs, total = sums_np(w)
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= 0.0:
        return -1, EMPTY
    return search_np(w, bs, u * total), OK


def residual_total_np(p_row, q_row, scale: float) -> float:
    _, total = sums_np(weights_np(p_row, q_row, scale, 1.0, 1))
    return total if np.isfinite(total) else -1.0


def draw_residual_np(p_row, q_row, scale: float, u: float, tiny: float) -> tuple[int, int]:
    w = weights_np(p_row, q_row, scale, 1.0, 1)
    bs, total = sums_np(w)
    if not np.isfinite(total):
        return -1, NOT_FINITE
    if total <= tiny:
        return draw_row_np(p_row, u)
    j = search_np(w, bs, u * total)
    if q_row[j] < 0.0:
        return -1, NEGATIVE
    return j, OK


_TINY = {
    np.dtype(np.float32): 4.0 * float(np.finfo(np.float32).eps),
    np.dtype(np.float64): 4.0 * float(np.finfo(np.float64).eps),
}


def tiny_for(dtype: np.dtype) -> float:
    """Residual mass below which p and q are equal up to rounding (then draw from p)."""
    return _TINY[np.dtype(dtype)]
