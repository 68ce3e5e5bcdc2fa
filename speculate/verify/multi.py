"""Multi-draft verification: m draft branches per row, recursive rejection sampling per depth.

At depth d the live branches (those that agree with the kept prefix) offer their d-th outcomes in
branch order; candidate j is kept with probability min(1, r(x_j) / q_j(x_j)) against the current
residual r (r = p_d at first); on rejection r <- norm(max(r - q_j, 0)). A kept outcome x extends
the prefix and the live branches become those whose d-th outcome is x; if every candidate is
rejected, the next outcome is drawn from the last residual; if some live branch ran out of drafts,
a bonus outcome is drawn from p at its end (SpecInfer, Miao et al. 2024; exact, acceptance per
depth 1 - prod(1 - alpha_i): proofs/08). With m = 1 this is token-wise verification, bit for bit.

Shapes: p [B, m, K+1, V], q [B, m, K, V], drafts int64 [B, m, K], lengths int64 [B, m],
u_accept float64 [B, K, m], u_next [B]. Returns n_accepted [B], next_outcome [B], branch [B]
(the index of a surviving branch: its first n_accepted drafts are the kept prefix).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .._inverse_cdf import (
    NEGATIVE,
    NOT_FINITE,
    OK,
    draw_row,
    draw_row_np,
    n_blocks,
    sums_np,
    weight,
    weight_sums,
    weights_np,
)
from ._shared import BAD_INDEX, BAD_LENGTH, Q_ZERO


@nb.njit(nogil=True, cache=True)
def _row(p, q, drafts, lengths, u_accept, u_next, tiny, b, n_out, next_out, branch_out, status, where):
    m, V = p.shape[1], p.shape[3]
    for j in range(m):
        if lengths[b, j] < 0 or lengths[b, j] > drafts.shape[2]:
            status[b], where[b] = BAD_LENGTH, 0
            return
    alive = np.ones(m, np.bool_)
    w = np.empty(V, np.float64)
    bs = np.empty(n_blocks(V), np.float64)
    n = 0
    while True:
        j0 = 0
        while not alive[j0]:
            j0 += 1
        for v in range(V):
            w[v] = np.float64(p[b, j0, n, v])
        Z = 1.0
        kept = -1
        any_candidate = False
        for j in range(m):
            if not alive[j] or lengths[b, j] <= n:
                continue
            any_candidate = True
            x = drafts[b, j, n]
            if x < 0 or x >= V:
                status[b], where[b] = BAD_INDEX, n
                return
            qx = np.float64(q[b, j, n, x])
            if not (np.isfinite(qx) and np.isfinite(w[x])):
                status[b], where[b] = NOT_FINITE, n
                return
            if qx < 0.0 or w[x] < 0.0:
                status[b], where[b] = NEGATIVE, n
                return
            if qx == 0.0:
                status[b], where[b] = Q_ZERO, n
                return
            if u_accept[b, n, j] * qx * Z < w[x]:
                kept = j
                break
            qrow = q[b, j, n]
            total = weight_sums(w, qrow, 1.0, Z, 1, bs)
            if not np.isfinite(total):
                status[b], where[b] = NOT_FINITE, n
                return
            if total > tiny:
                for v in range(V):
                    w[v] = weight(w, qrow, 1.0, Z, 1, v)
                Z = total
        if kept >= 0:
            x = drafts[b, kept, n]
            for j in range(m):
                alive[j] = alive[j] and lengths[b, j] > n and drafts[b, j, n] == x
            n += 1
            continue
        if any_candidate:
            idx, st = draw_row(w, u_next[b], bs)
        else:
            idx, st = draw_row(p[b, j0, n], u_next[b], bs)
        if st == OK and not p[b, j0, n, idx] > 0.0:  # residual mass from a negative q, not from p
            idx, st = -1, NEGATIVE
        n_out[b], next_out[b], branch_out[b], status[b], where[b] = n, idx, j0, st, n
        return


@nb.njit(nogil=True, cache=True, parallel=True)
def _batch_parallel(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, branch_out, status, where):
    for b in nb.prange(p.shape[0]):
        _row(
            p,
            q,
            drafts,
            lengths,
            u_accept,
            u_next,
            tiny,
            b,
            n_out,
            next_out,
            branch_out,
            status,
            where,
        )


@nb.njit(nogil=True, cache=True)
def _batch_serial(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, branch_out, status, where):
    for b in range(p.shape[0]):
        _row(
            p,
            q,
            drafts,
            lengths,
            u_accept,
            u_next,
            tiny,
            b,
            n_out,
            next_out,
            branch_out,
            status,
            where,
        )


def reference(p, q, drafts, lengths, u_accept, u_next, tiny):
    """Plain NumPy twin: returns (n_accepted, next_outcome, branch, status, where)."""
    B, m, V = p.shape[0], p.shape[1], p.shape[3]
    out = [np.zeros(B, np.int64), np.full(B, -1, np.int64), np.zeros(B, np.int64)]
    status, where = np.zeros(B, np.int64), np.zeros(B, np.int64)
    for b in range(B):
        alive = np.ones(m, bool)
        n, bad = 0, OK
        while bad == OK:
            j0 = int(np.flatnonzero(alive)[0])
            w = np.asarray(p[b, j0, n], dtype=np.float64).copy()
            Z, kept, any_candidate = 1.0, -1, False
            for j in range(m):
                if not alive[j] or lengths[b, j] <= n:
                    continue
                any_candidate = True
                x = int(drafts[b, j, n])
                if not 0 <= x < V:
                    bad = BAD_INDEX
                    break
                qx = float(q[b, j, n, x])
                if not (np.isfinite(qx) and np.isfinite(w[x])):
                    bad = NOT_FINITE
                    break
                if qx < 0.0 or w[x] < 0.0:
                    bad = NEGATIVE
                    break
                if qx == 0.0:
                    bad = Q_ZERO
                    break
                if u_accept[b, n, j] * qx * Z < w[x]:
                    kept = j
                    break
                w2 = weights_np(w, q[b, j, n], 1.0, Z, 1)
                _, total = sums_np(w2)
                if not np.isfinite(total):
                    bad = NOT_FINITE
                    break
                if total > tiny:
                    w, Z = w2, total
            if bad != OK:
                break
            if kept >= 0:
                x = drafts[b, kept, n]
                alive &= (lengths[b] > n) & (drafts[b, :, n] == x)
                n += 1
                continue
            idx, st = draw_row_np(w if any_candidate else p[b, j0, n], u_next[b])
            if st == OK and not p[b, j0, n, idx] > 0.0:
                idx, st = -1, NEGATIVE
            out[0][b], out[1][b], out[2][b], status[b] = n, idx, j0, st
            break
        where[b] = n
        if bad != OK:
            status[b] = bad
    return out[0], out[1], out[2], status, where


def kernel(p, q, drafts, lengths, u_accept, u_next, tiny, parallel):
    B = p.shape[0]
    n_out = np.zeros(B, np.int64)
    next_out = np.full(B, -1, np.int64)
    branch = np.zeros(B, np.int64)
    status = np.zeros(B, np.int64)
    where = np.zeros(B, np.int64)
    fn = _batch_parallel if parallel else _batch_serial
    fn(p, q, drafts, lengths, u_accept, u_next, tiny, n_out, next_out, branch, status, where)
    return n_out, next_out, branch, status, where
