"""Token-wise verification of equal-scale Gaussian transitions by reflection maximal coupling.

Draft x_i ~ N(m_q, diag(s^2)), target N(m_p, diag(s^2)) (the same s). With z = (x - m_q)/s and
e = (m_p - m_q)/s: keep x_i iff u_i < min(1, exp(z.e - |e|^2/2)) (that is p(x)/q(x)); at the
first rejection the next outcome is the reflection m_p + s (z - 2 (z.e/|e|^2) e), which maps the
rejected part of q onto the residual of p; after L kept drafts the bonus is m_p + s z_next.
Acceptance per step is 2 Phi(-|e|/2) (proofs/03). Constant time: no loop over tries.

Shapes (events flattened to D): loc_p [B, K+1, D], loc_q [B, K, D], scale [B, K+1, D] (any
broadcast view), drafts [B, K, D], lengths [B], u_accept [B, K], z_next [B, D].
Returns n_accepted [B] and next_outcome float64 [B, D]. A NaN or inf in what a row reads, or an
outcome that overflows, is reported (status NOT_FINITE), never returned.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .._inverse_cdf import NOT_FINITE, OK
from ._shared import BAD_LENGTH


@nb.njit(nogil=True, cache=True)
def _row(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, b, n_out, next_out, status, where):
    D = loc_p.shape[2]
    L = lengths[b]
    if L < 0 or L > drafts.shape[1]:
        status[b], where[b] = BAD_LENGTH, 0
        return
    for i in range(L):
        dot, d2 = 0.0, 0.0
        for j in range(D):
            s = scale[b, i, j]
            e = (loc_p[b, i, j] - loc_q[b, i, j]) / s
            z = (drafts[b, i, j] - loc_q[b, i, j]) / s
            dot += z * e
            d2 += e * e
        logr = dot - 0.5 * d2
        if not np.isfinite(logr):
            status[b], where[b] = NOT_FINITE, i
            return
        if u_accept[b, i] < math.exp(min(logr, 0.0)):
            continue
        c = 2.0 * dot / d2
        finite = True
        for j in range(D):
            s = scale[b, i, j]
            e = (loc_p[b, i, j] - loc_q[b, i, j]) / s
            z = (drafts[b, i, j] - loc_q[b, i, j]) / s
            y = loc_p[b, i, j] + s * (z - c * e)
            next_out[b, j] = y
            finite = finite and np.isfinite(y)
        if not finite:
            status[b], where[b] = NOT_FINITE, i
            return
        n_out[b], status[b], where[b] = i, OK, i
        return
    finite = True
    for j in range(D):  # every coordinate: a NaN may sit anywhere in the event
        y = loc_p[b, L, j] + scale[b, L, j] * z_next[b, j]
        next_out[b, j] = y
        finite = finite and np.isfinite(y)
    if not finite:
        status[b], where[b] = NOT_FINITE, L
        return
    n_out[b], status[b], where[b] = L, OK, L


@nb.njit(nogil=True, cache=True, parallel=True)
def _batch_parallel(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, n_out, next_out, status, where):
    for b in nb.prange(loc_p.shape[0]):
        _row(
            loc_p,
            loc_q,
            scale,
            drafts,
            lengths,
            u_accept,
            z_next,
            b,
            n_out,
            next_out,
            status,
            where,
        )


@nb.njit(nogil=True, cache=True)
def _batch_serial(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, n_out, next_out, status, where):
    for b in range(loc_p.shape[0]):
        _row(
            loc_p,
            loc_q,
            scale,
            drafts,
            lengths,
            u_accept,
            z_next,
            b,
            n_out,
            next_out,
            status,
            where,
        )


def reference(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next):
    """Plain NumPy twin: returns (n_accepted, next_outcome, status, where)."""
    B, D = loc_p.shape[0], loc_p.shape[2]
    n_out = np.zeros(B, np.int64)
    next_out = np.zeros((B, D), np.float64)
    status = np.zeros(B, np.int64)
    where = np.zeros(B, np.int64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # reported as NOT_FINITE
        for b in range(B):
            _reference_row(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, b, n_out, next_out, status, where)
    return n_out, next_out, status, where


def _reference_row(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, b, n_out, next_out, status, where):
    D = loc_p.shape[2]
    L = int(lengths[b])
    n = L
    for i in range(L):
        s = scale[b, i]
        e = (loc_p[b, i] - loc_q[b, i]) / s
        z = (drafts[b, i] - loc_q[b, i]) / s
        dot = float(np.cumsum(z * e)[-1]) if D else 0.0  # left to right, as the kernel adds
        d2 = float(np.cumsum(e * e)[-1]) if D else 0.0
        logr = dot - 0.5 * d2
        if not np.isfinite(logr):
            status[b], where[b] = NOT_FINITE, i
            return
        if u_accept[b, i] < math.exp(min(logr, 0.0)):
            continue
        next_out[b] = loc_p[b, i] + s * (z - 2.0 * dot / d2 * e)
        n = i
        break
    where[b] = n
    if n == L:
        next_out[b] = loc_p[b, L] + scale[b, L] * z_next[b]
    if not np.all(np.isfinite(next_out[b])):
        status[b] = NOT_FINITE
        return
    n_out[b] = n


def kernel(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, parallel):
    B, D = loc_p.shape[0], loc_p.shape[2]
    n_out = np.zeros(B, np.int64)
    next_out = np.zeros((B, D), np.float64)
    status = np.zeros(B, np.int64)
    where = np.zeros(B, np.int64)
    fn = _batch_parallel if parallel else _batch_serial
    fn(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, n_out, next_out, status, where)
    return n_out, next_out, status, where
