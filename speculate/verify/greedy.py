"""Greedy verification: for argmax (temperature 0) or point-mass targets, keep drafts while equal.

Row b keeps x_i while x_i == argmax p_i (first index on ties, as numpy.argmax); the next outcome is
argmax p_{n+1} at the first mismatch, or the bonus argmax p_{L+1}. The output equals greedy decoding
of the target token for token (proofs/04). Shapes: p [B, K+1, V], drafts int64 [B, K], lengths [B].
A row read that holds NaN, inf or a negative value, or no positive mass, is an error: the argmax
of such a row is not an outcome of a distribution.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .._inverse_cdf import EMPTY, NEGATIVE, NOT_FINITE, OK
from ._shared import BAD_INDEX, BAD_LENGTH, outputs


@nb.njit(nogil=True, cache=True)
def _argmax(row):
    best, arg = 0.0, -1
    for j in range(row.shape[0]):
        v = np.float64(row[j])
        if not (v >= 0.0 and v < np.inf):  # one test for NaN, inf and negative values
            return -1, (NEGATIVE if np.isfinite(v) else NOT_FINITE)
        if v > best:  # the first index of the largest positive value
            best, arg = v, j
    if arg < 0:
        return -1, EMPTY
    return arg, OK


def _argmax_np(row) -> tuple[int, int]:
    """NumPy twin of _argmax."""
    row = np.asarray(row, dtype=np.float64)
    if not np.all(np.isfinite(row)):
        return -1, NOT_FINITE
    if np.any(row < 0.0):
        return -1, NEGATIVE
    a = int(np.argmax(row)) if row.size else -1
    if a < 0 or not row[a] > 0.0:
        return -1, EMPTY
    return a, OK


@nb.njit(nogil=True, cache=True)
def _row(p, drafts, lengths, b, n_out, next_out, status, where):
    V = p.shape[2]
    L = lengths[b]
    if L < 0 or L > drafts.shape[1]:
        status[b], where[b] = BAD_LENGTH, 0
        return
    n = 0
    while n < L:
        x = drafts[b, n]
        if x < 0 or x >= V:
            status[b], where[b] = BAD_INDEX, n
            return
        a, st = _argmax(p[b, n])
        if st != OK:
            status[b], where[b] = st, n
            return
        if x != a:
            n_out[b], next_out[b], where[b] = n, a, n
            return
        n += 1
    a, st = _argmax(p[b, L])
    n_out[b], next_out[b], status[b], where[b] = L, a, st, L


@nb.njit(nogil=True, cache=True, parallel=True)
def _batch_parallel(p, drafts, lengths, n_out, next_out, status, where):
    for b in nb.prange(p.shape[0]):
        _row(p, drafts, lengths, b, n_out, next_out, status, where)


@nb.njit(nogil=True, cache=True)
def _batch_serial(p, drafts, lengths, n_out, next_out, status, where):
    for b in range(p.shape[0]):
        _row(p, drafts, lengths, b, n_out, next_out, status, where)


def reference(p, drafts, lengths):
    """Plain NumPy twin of the kernel: returns (n_accepted, next_outcome, status, where)."""
    B, V = p.shape[0], p.shape[2]
    n_out, next_out, status, where = outputs(B)
    for b in range(B):
        L, n = int(lengths[b]), 0
        if not 0 <= L <= drafts.shape[1]:
            status[b] = BAD_LENGTH
            continue
        while True:
            if n < L and not 0 <= int(drafts[b, n]) < V:
                status[b], where[b] = BAD_INDEX, n
                break
            a, st = _argmax_np(p[b, n])
            if st != OK:
                status[b], where[b] = st, n
                break
            if n == L or int(drafts[b, n]) != a:
                n_out[b], next_out[b], where[b] = n, a, n
                break
            n += 1
    return n_out, next_out, status, where


def kernel(p, drafts, lengths, parallel):
    B = p.shape[0]
    n_out, next_out, status, where = outputs(B)
    fn = _batch_parallel if parallel else _batch_serial
    fn(p, drafts, lengths, n_out, next_out, status, where)
    return n_out, next_out, status, where
