"""Token-wise verification (Leviathan et al. 2023; Chen et al. 2023), batched over rows.

For row b with L = lengths[b] drafts x_1..x_L: keep x_i while ``u_accept[b, i] * q_i(x_i) < p_i(x_i)``
(that is, with probability min(1, p/q)); at the first rejection draw the next outcome from
norm(max(p_i - q_i, 0)); if all L are kept, draw a bonus outcome from p_{L+1}. Uniforms are inputs,
so the kernel is a pure function: the Numba kernel and the NumPy reference agree bit for bit.

Shapes: p [B, K+1, V], q [B, K, V] (float32 or float64), drafts int64 [B, K], lengths int64 [B],
u_accept float64 [B, K], u_next float64 [B]. Returns n_accepted int64 [B], next_outcome int64 [B].
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .._inverse_cdf import OK, draw_residual, draw_residual_np, draw_row, draw_row_np, n_blocks
from ._shared import BAD_LENGTH, draft_probs, outputs


@nb.njit(nogil=True, cache=True)
def _row(p, q, drafts, lengths, u_accept, u_next, tiny, b, n_out, next_out, status, where):
    V = p.shape[2]
    L = lengths[b]
    if L < 0 or L > drafts.shape[1]:
        status[b], where[b] = BAD_LENGTH, 0
        return
    n = 0
    while n < L:
        px, qx, st = draft_probs(p, q, drafts, b, n)
        if st != OK:
            status[b], where[b] = st, n
            return
        if u_accept[b, n] * qx < px:
            n += 1
        else:
            break
    bs = np.empty(n_blocks(V), np.float64)
    if n == L:
        j, st = draw_row(p[b, n], u_next[b], bs)
    else:
        j, st = draw_residual(p[b, n], q[b, n], 1.0, u_next[b], tiny, bs)
    n_out[b], next_out[b], status[b], where[b] = n, j, st, n


@nb.njit(nogil=True, cache=True, parallel=True)
def _batch_parallel(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, status, where):
    for b in nb.prange(p.shape[0]):
        _row(p, q, drafts, lengths, u_accept, u_next, tiny, b, n_out, next_out, status, where)


@nb.njit(nogil=True, cache=True)
def _batch_serial(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, status, where):
    for b in range(p.shape[0]):
        _row(p, q, drafts, lengths, u_accept, u_next, tiny, b, n_out, next_out, status, where)


def reference(p, q, drafts, lengths, u_accept, u_next, tiny):
    """Plain NumPy twin of the kernel: returns (n_accepted, next_outcome, status, where)."""
    B = p.shape[0]
    n_out, next_out, status, where = outputs(B)
    for b in range(B):
        L, n, bad = int(lengths[b]), 0, OK
        while n < L:
            px, qx, bad = draft_probs.py_func(p, q, drafts, b, n)
            if bad != OK:
                break
            if u_accept[b, n] * qx < px:
                n += 1
            else:
                break
        if bad != OK:
            status[b], where[b] = bad, n
            continue
        if n == L:
            j, st = draw_row_np(p[b, n], u_next[b])
        else:
            j, st = draw_residual_np(p[b, n], q[b, n], 1.0, u_next[b], tiny)
        n_out[b], next_out[b], status[b], where[b] = n, j, st, n
    return n_out, next_out, status, where


def kernel(p, q, drafts, lengths, u_accept, u_next, tiny, parallel):
    B = p.shape[0]
    n_out, next_out, status, where = outputs(B)
    fn = _batch_parallel if parallel else _batch_serial
    fn(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, status, where)
    return n_out, next_out, status, where
