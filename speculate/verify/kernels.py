"""The checked entry points of the kernels: validate the arrays, run the Numba kernel (or its NumPy
twin, ``*_reference``, same signature), and raise ``ValueError`` naming the row and position of a
bad input (a drafted outcome with q = 0, an index outside 0..V-1, NaN/inf probabilities, lengths
outside 0..K). Every function is pure: the uniforms are inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inverse_cdf import OK, tiny_for
from . import block, gaussian, greedy, multi, token
from ._shared import MESSAGES

__all__ = [
    "verify_block",
    "verify_block_reference",
    "verify_gaussian",
    "verify_gaussian_reference",
    "verify_greedy",
    "verify_greedy_reference",
    "verify_multi",
    "verify_multi_reference",
    "verify_token",
    "verify_token_reference",
]

_PARALLEL_MIN_WORK = 1 << 17  # rows x positions x V above which the kernels run threaded


def _probs(x: Any, name: str, ndim: int) -> np.ndarray:
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind != "f" or a.dtype.itemsize not in (4, 8):
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
        a = a.astype(np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {a.shape}")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _ints(x: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if a.dtype != np.int64 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.int64)
    return a


def _uniforms(x: Any, name: str, shape: tuple[int, ...], check: bool = True) -> np.ndarray:
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype != np.float64 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.float64)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if check and a.size and not (a.min() >= 0.0 and a.max() < 1.0):
        raise ValueError(f"{name} must lie in [0, 1)")
    return a


def _lengths(lengths: Any, shape: tuple[int, ...], K: int, check: bool = True) -> np.ndarray:
    """Per-row draft counts; the Numba kernels check 0 <= lengths <= K themselves (check=False)."""
    if lengths is None:
        return np.full(shape, K, np.int64)
    a = _ints(lengths, "lengths", shape)
    if check and a.size and (a.min() < 0 or a.max() > K):
        raise ValueError(f"lengths must lie in 0..{K} (the number of drafts per row), got {a}")
    return a


def _raise_on(status: np.ndarray, where: np.ndarray) -> None:
    if not np.count_nonzero(status):  # cheaper than status.any() on the few rows of a round
        return
    b = int(np.flatnonzero(status != OK)[0])
    raise ValueError(f"row {b}, position {int(where[b])}: {MESSAGES[int(status[b])]}")


def _parallel(parallel: bool | None, work: int) -> bool:
    return work >= _PARALLEL_MIN_WORK if parallel is None else bool(parallel)


def _check_categorical(p, q, drafts, lengths, u_accept, u_next, check_uniforms=True, check_lengths=True):
    p = _probs(p, "p (target probabilities [B, K+1, V])", 3)
    q = _probs(q, "q (draft probabilities [B, K, V])", 3)
    B, K1, V = p.shape
    if q.shape != (B, K1 - 1, V):
        raise ValueError(
            f"q must have shape (B, K, V) = {(B, K1 - 1, V)} to match p {p.shape} "
            "(same rows, one position fewer, same vocabulary)"
        )
    K = K1 - 1
    drafts = _ints(drafts, "drafts", (B, K))
    lengths = _lengths(lengths, (B,), K, check_lengths)
    u_accept = _uniforms(u_accept, "u_accept", (B, K), check_uniforms)
    u_next = _uniforms(u_next, "u_next", (B,), check_uniforms)
    return p, q, drafts, lengths, u_accept, u_next


def run_kernel(module, p, q, drafts, lengths, u_accept, u_next, parallel=None):
    """Run ``module``'s (token or block) kernel on inputs already in kernel form and raise on a bad row.

    The one place that calls these kernels: the public wrappers after their checks, and the round
    loop (verify/one_round.py) directly when its arrays are already in kernel form.
    """
    n, nxt, status, where = module.kernel(
        p, q, drafts, lengths, u_accept, u_next, tiny_for(p.dtype), _parallel(parallel, p.size)
    )
    _raise_on(status, where)
    return n, nxt


def _categorical_rule(module, reference: bool):
    def run(p, q, drafts, lengths, u_accept, u_next, *, parallel=None, check_uniforms=True):
        p, q, drafts, lengths, u_accept, u_next = _check_categorical(
            p, q, drafts, lengths, u_accept, u_next, check_uniforms, check_lengths=reference
        )
        if not reference:
            return run_kernel(module, p, q, drafts, lengths, u_accept, u_next, parallel)
        n, nxt, status, where = module.reference(p, q, drafts, lengths, u_accept, u_next, tiny_for(p.dtype))
        _raise_on(status, where)
        return n, nxt

    return run


verify_token = _categorical_rule(token, reference=False)
verify_token.__doc__ = token.__doc__
verify_token.__name__ = "verify_token"
verify_token_reference = _categorical_rule(token, reference=True)
verify_token_reference.__name__ = "verify_token_reference"
verify_block = _categorical_rule(block, reference=False)
verify_block.__doc__ = block.__doc__
verify_block.__name__ = "verify_block"
verify_block_reference = _categorical_rule(block, reference=True)
verify_block_reference.__name__ = "verify_block_reference"


def _check_greedy(p, drafts, lengths):
    p = _probs(p, "p (target probabilities [B, K+1, V])", 3)
    B, K1, _ = p.shape
    return p, _ints(drafts, "drafts", (B, K1 - 1)), _lengths(lengths, (B,), K1 - 1)


def verify_greedy(p: Any, drafts: Any, lengths: Any = None, *, parallel: bool | None = None):
    p, drafts, lengths = _check_greedy(p, drafts, lengths)
    n, nxt, status, where = greedy.kernel(p, drafts, lengths, _parallel(parallel, p.size))
    _raise_on(status, where)
    return n, nxt


def verify_greedy_reference(p: Any, drafts: Any, lengths: Any = None, *, parallel: bool | None = None):
    p, drafts, lengths = _check_greedy(p, drafts, lengths)
    n, nxt, status, where = greedy.reference(p, drafts, lengths)
    _raise_on(status, where)
    return n, nxt


verify_greedy.__doc__ = greedy.__doc__


def _check_multi(p, q, drafts, lengths, u_accept, u_next, check_uniforms=True):
    p = _probs(p, "p (target probabilities [B, m, K+1, V])", 4)
    q = _probs(q, "q (draft probabilities [B, m, K, V])", 4)
    B, m, K1, V = p.shape
    K = K1 - 1
    if q.shape != (B, m, K, V):
        raise ValueError(f"q must have shape (B, m, K, V) = {(B, m, K, V)} to match p {p.shape}")
    if m < 1:
        raise ValueError("multi-draft verification needs at least one branch")
    drafts = _ints(drafts, "drafts", (B, m, K))
    lengths = _lengths(lengths, (B, m), K)
    u_accept = _uniforms(u_accept, "u_accept", (B, K, m), check_uniforms)
    u_next = _uniforms(u_next, "u_next", (B,), check_uniforms)
    return p, q, drafts, lengths, u_accept, u_next


def verify_multi(p, q, drafts, lengths, u_accept, u_next, *, parallel: bool | None = None, check_uniforms=True):
    p, q, drafts, lengths, u_accept, u_next = _check_multi(p, q, drafts, lengths, u_accept, u_next, check_uniforms)
    tiny = tiny_for(p.dtype)
    par = _parallel(parallel, p.size)
    n, nxt, branch, status, where = multi.kernel(p, q, drafts, lengths, u_accept, u_next, tiny, par)
    _raise_on(status, where)
    return n, nxt, branch


def verify_multi_reference(p, q, drafts, lengths, u_accept, u_next, *, parallel=None):
    p, q, drafts, lengths, u_accept, u_next = _check_multi(p, q, drafts, lengths, u_accept, u_next)
    n, nxt, branch, status, where = multi.reference(p, q, drafts, lengths, u_accept, u_next, tiny_for(p.dtype))
    _raise_on(status, where)
    return n, nxt, branch


verify_multi.__doc__ = multi.__doc__


def _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next):
    loc_p = _probs(loc_p, "loc_p [B, K+1, D]", 3).astype(np.float64, copy=False)
    B, K1, D = loc_p.shape
    K = K1 - 1
    loc_q = _probs(loc_q, "loc_q [B, K, D]", 3).astype(np.float64, copy=False)
    if loc_q.shape != (B, K, D):
        raise ValueError(f"loc_q must have shape {(B, K, D)} to match loc_p {loc_p.shape}")
    scale = np.asarray(scale, np.float64)
    if not np.all(np.isfinite(scale) & (scale > 0)):  # checked before broadcasting: O(its own size)
        raise ValueError("scale must be finite and > 0")
    try:
        scale = np.broadcast_to(scale, (B, K1, D))  # a view: a scalar scale costs nothing per element
    except ValueError:
        raise ValueError(f"scale of shape {scale.shape} does not broadcast to {(B, K1, D)}") from None
    drafts = _probs(drafts, "drafts [B, K, D]", 3).astype(np.float64, copy=False)
    if drafts.shape != (B, K, D):
        raise ValueError(f"drafts must have shape {(B, K, D)}, got {drafts.shape}")
    lengths = _lengths(lengths, (B,), K)
    u_accept = _uniforms(u_accept, "u_accept", (B, K))
    z_next = np.ascontiguousarray(np.asarray(z_next, np.float64))
    if z_next.shape != (B, D):
        raise ValueError(f"z_next must have shape {(B, D)}, got {z_next.shape}")
    return loc_p, loc_q, scale, drafts, lengths, u_accept, z_next


def verify_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, *, parallel=None):
    args = _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next)
    n, nxt, status, where = gaussian.kernel(*args, _parallel(parallel, args[0].size * 8))
    _raise_on(status, where)
    return n, nxt


def verify_gaussian_reference(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, *, parallel=None):
    args = _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next)
    n, nxt, status, where = gaussian.reference(*args)
    _raise_on(status, where)
    return n, nxt


verify_gaussian.__doc__ = gaussian.__doc__
