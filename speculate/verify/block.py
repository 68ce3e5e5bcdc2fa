"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025).

For row b with L drafts X_1..X_L and uniforms U_1..U_L:
    P_0 = 1,  P_i = min(P_{i-1} p_i(X_i) / q_i(X_i), 1)
    h_i = R_i / (R_i + 1 - P_i) for i < L (h_i = 1 when P_i = 1),  R_i = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0)
    h_L = P_L
    tau = the last i with U_i < h_i (0 if none)
emit X_1..X_tau, then Y ~ p_{L+1} if tau = L, else Y ~ norm(max(P_tau p_{tau+1} - q_{tau+1}, 0)).
Exact (proofs/07) and never fewer expected outcomes than token-wise verification.

The scan runs from i = L down and stops at the first success, so a fully accepted block costs no
O(V) work at all; R_i is computed only where it is needed. Same shapes and returns as ``token``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .._inverse_cdf import (
    NOT_FINITE,
    OK,
    draw_residual,
    draw_residual_np,
    draw_row,
    draw_row_np,
    n_blocks,
    residual_total,
    residual_total_np,
)
from ._shared import BAD_LENGTH, draft_probs, outputs


@nb.njit(nogil=True, cache=True)
def _row(p, q, drafts, lengths, u_accept, u_next, tiny, b, n_out, next_out, status, where):
    V = p.shape[2]
    L = lengths[b]
    if L < 0 or L > drafts.shape[1]:
        status[b], where[b] = BAD_LENGTH, 0
        return
    P = np.empty(L + 1, np.float64)
    P[0] = 1.0
    last_pos = 0  # the last i with P_i > 0 (P is non-increasing to 0 once it hits 0)
    for i in range(1, L + 1):
        px, qx, st = draft_probs(p, q, drafts, b, i - 1)
        if st != OK:
            status[b], where[b] = st, i - 1
            return
        P[i] = min(P[i - 1] * px / qx, 1.0)
        if P[i] > 0.0:
            last_pos = i
    tau = 0
    bs = np.empty(n_blocks(V), np.float64)
    for i in range(last_pos, 0, -1):
        if i == L:
            h = P[i]
        elif P[i] >= 1.0:
            h = 1.0
        else:
            R = residual_total(p[b, i], q[b, i], P[i], bs)
            if R < 0.0:
                status[b], where[b] = NOT_FINITE, i
                return
            h = R / (R + 1.0 - P[i])
        if u_accept[b, i - 1] < h:
            tau = i
            break
    if tau == L:
        j, st = draw_row(p[b, L], u_next[b], bs)
    else:
        j, st = draw_residual(p[b, tau], q[b, tau], P[tau], u_next[b], tiny, bs)
    n_out[b], next_out[b], status[b], where[b] = tau, j, st, tau


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
        L = int(lengths[b])
        P = [1.0]
        bad, at = OK, 0
        for i in range(1, L + 1):
            px, qx, bad = draft_probs.py_func(p, q, drafts, b, i - 1)
            if bad != OK:
                at = i - 1
                break
            P.append(min(P[i - 1] * px / qx, 1.0))
        if bad == OK:
            tau = 0
            for i in range(L, 0, -1):
                if P[i] <= 0.0:
                    continue
                if i == L:
                    h = P[i]
                elif P[i] >= 1.0:
                    h = 1.0
                else:
                    R = residual_total_np(p[b, i], q[b, i], P[i])
                    if R < 0.0:
                        bad, at = NOT_FINITE, i
                        break
                    h = R / (R + 1.0 - P[i])
                if u_accept[b, i - 1] < h:
                    tau = i
                    break
        if bad != OK:
            status[b], where[b] = bad, at
            continue
        if tau == L:
            j, st = draw_row_np(p[b, L], u_next[b])
        else:
            j, st = draw_residual_np(p[b, tau], q[b, tau], P[tau], u_next[b], tiny)
        n_out[b], next_out[b], status[b], where[b] = tau, j, st, tau
    return n_out, next_out, status, where


def kernel(p, q, drafts, lengths, u_accept, u_next, tiny, parallel):
    B = p.shape[0]
    n_out, next_out, status, where = outputs(B)
    fn = _batch_parallel if parallel else _batch_serial
    fn(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, status, where)
    return n_out, next_out, status, where
