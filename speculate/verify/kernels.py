"""The checked entry points of the kernels: validate the arrays, run the Numba kernel (or its NumPy
twin, ``*_reference``, same signature), and raise ``ValueError`` naming the row and position of a
bad input (a drafted outcome with q = 0, an index outside 0..V-1, NaN/inf or negative values in
what the kernel reads, lengths outside 0..K) and, where it can be found, the offending entry; a
``TypeError`` for arrays of the wrong kind (complex, strings, objects, non-integer drafts).
float16 and integer probabilities are converted to float64, and p and q of different float types
are both converted to float64 (same values, one compiled kernel). Every function is pure: the
uniforms are inputs.
"""

from __future__ import annotations

import sys
from typing import Any

import numba as nb
import numpy as np

from .._inverse_cdf import EMPTY, NEGATIVE, NOT_FINITE, OK, tiny_for
from . import block, gaussian, greedy, multi, token, tree
from ._shared import MESSAGES, Q_ZERO

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
    "verify_tree",
    "verify_tree_greedy",
    "verify_tree_greedy_reference",
    "verify_tree_reference",
]

_PARALLEL_MIN_WORK = 1 << 17  # rows x positions x V above which the kernels run threaded


def _probs(x: Any, name: str, ndim: int) -> np.ndarray:
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind != "f" or a.dtype.itemsize not in (4, 8) or not a.dtype.isnative:
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
        a = a.astype(a.dtype.newbyteorder("=") if a.dtype.kind == "f" and a.dtype.itemsize in (4, 8) else np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {a.shape}")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _positions(p: np.ndarray, name: str) -> None:
    if p.shape[-2] < 1:
        raise ValueError(f"{name} needs at least one position (K + 1 >= 1), got shape {p.shape}")


def _same_float(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """p and q of one float type (float64 if they differ: the same values, one compiled kernel) and
    the rounding threshold of p's own type (residual mass below it means p == q up to rounding)."""
    tiny = tiny_for(p.dtype)
    if p.dtype != q.dtype:
        p, q = p.astype(np.float64), q.astype(np.float64)
    return p, q, tiny


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
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be real numbers, got dtype {a.dtype}")
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


def _raise_on(
    status: np.ndarray, where: np.ndarray, rows: Any = None, messages: dict = MESSAGES, label: str = "position"
) -> None:
    """Raise ValueError for the first row with a bad status. ``rows(b, i)``: the named arrays that
    row b read at position i, searched for the entry to name (NaN, inf, negative). ``label`` names
    what ``where`` indexes (a position, or a tree's node)."""
    if not np.count_nonzero(status):  # cheaper than status.any() on the few rows of a round
        return
    b = int(np.flatnonzero(status != OK)[0])
    code, i = int(status[b]), int(where[b])
    msg = f"row {b}, {label} {i}: {messages[code]}"
    if rows is not None and code in (NOT_FINITE, NEGATIVE, EMPTY):
        detail = _first_bad(rows(b, i), code)
        if detail:
            msg += f" ({detail})"
    raise ValueError(msg)


def _first_bad(named: list[tuple[str, np.ndarray]], code: int) -> str | None:
    """The entry to name in an error: 'p[b, i, j] = value' for the first NaN, inf or negative entry
    of the named 1-D rows (NOT_FINITE, NEGATIVE), or the row without positive mass (EMPTY).
    ``named``: (index prefix such as "p[b, i", row)."""
    for prefix, a in named:
        a = np.asarray(a, dtype=np.float64)
        if code == EMPTY:
            if not np.any(a > 0):
                return f"{prefix}, :] has no positive entry"
            continue
        bad = np.flatnonzero(~np.isfinite(a) | (a < 0))
        if bad.size:
            return f"{prefix}, {int(bad[0])}] = {float(a[bad[0]])!r}"
    return None


def _categorical_rows(p: np.ndarray, q: np.ndarray | None):
    """What row b of a token/block/greedy kernel read at position i (for error messages)."""
    K = p.shape[1] - 1

    def rows(b: int, i: int) -> list:
        out = [(f"p[{b}, {i}", p[b, i])] if 0 <= i <= K else []
        if q is not None and 0 <= i < K:
            out.append((f"q[{b}, {i}", q[b, i]))
        return out

    return rows


def _parallel(parallel: bool | None, work: int) -> bool:
    on = work >= _PARALLEL_MIN_WORK if parallel is None else bool(parallel)
    if on and not _THREADS["started"]:
        _start_threads()
    return on


_THREADS = {"started": False}


def _start_threads() -> None:
    """Start Numba's threading layer before the first threaded kernel, and give torch (when the
    caller uses it) back its thread count: starting an OpenMP layer sets the process's OpenMP thread
    count, which torch reads as its own (a caller's ``torch.set_num_threads(1)`` became 2)."""
    torch = sys.modules.get("torch")
    n = torch.get_num_threads() if torch is not None else None
    nb.get_num_threads()  # launches the layer
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _THREADS["started"] = True


def _check_categorical(p, q, drafts, lengths, u_accept, u_next, check_uniforms=True, check_lengths=True):
    p = _probs(p, "p (target probabilities [B, K+1, V])", 3)
    q = _probs(q, "q (draft probabilities [B, K, V])", 3)
    _positions(p, "p (target probabilities [B, K+1, V])")
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
    p, q, tiny = _same_float(p, q)
    return p, q, drafts, lengths, u_accept, u_next, tiny


def run_kernel(module, p, q, drafts, lengths, u_accept, u_next, parallel=None, tiny=None):
    """Run ``module``'s (token or block) kernel on inputs already in kernel form and raise on a bad row.

    The one place that calls these kernels: the public wrappers after their checks, and the round
    loop (verify/one_round.py) directly when its arrays are already in kernel form.
    """
    tiny = tiny_for(p.dtype) if tiny is None else tiny
    n, nxt, status, where = module.kernel(p, q, drafts, lengths, u_accept, u_next, tiny, _parallel(parallel, p.size))
    if np.count_nonzero(status):  # the round loop's hot path: build the error's context only on error
        _raise_on(status, where, _categorical_rows(p, q))
    return n, nxt


def _categorical_rule(module, reference: bool):
    def run(p, q, drafts, lengths, u_accept, u_next, *, parallel=None, check_uniforms=True):
        p, q, drafts, lengths, u_accept, u_next, tiny = _check_categorical(
            p, q, drafts, lengths, u_accept, u_next, check_uniforms, check_lengths=reference
        )
        if not reference:
            return run_kernel(module, p, q, drafts, lengths, u_accept, u_next, parallel, tiny)
        n, nxt, status, where = module.reference(p, q, drafts, lengths, u_accept, u_next, tiny)
        _raise_on(status, where, _categorical_rows(p, q))
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
    _positions(p, "p (target probabilities [B, K+1, V])")
    B, K1, _ = p.shape
    return p, _ints(drafts, "drafts", (B, K1 - 1)), _lengths(lengths, (B,), K1 - 1)


def verify_greedy(p: Any, drafts: Any, lengths: Any = None, *, parallel: bool | None = None):
    p, drafts, lengths = _check_greedy(p, drafts, lengths)
    n, nxt, status, where = greedy.kernel(p, drafts, lengths, _parallel(parallel, p.size))
    _raise_on(status, where, _categorical_rows(p, None))
    return n, nxt


def verify_greedy_reference(p: Any, drafts: Any, lengths: Any = None, *, parallel: bool | None = None):
    p, drafts, lengths = _check_greedy(p, drafts, lengths)
    n, nxt, status, where = greedy.reference(p, drafts, lengths)
    _raise_on(status, where, _categorical_rows(p, None))
    return n, nxt


verify_greedy.__doc__ = greedy.__doc__


def _check_multi(p, q, drafts, lengths, u_accept, u_next, check_uniforms=True):
    p = _probs(p, "p (target probabilities [B, m, K+1, V])", 4)
    q = _probs(q, "q (draft probabilities [B, m, K, V])", 4)
    _positions(p, "p (target probabilities [B, m, K+1, V])")
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
    p, q, tiny = _same_float(p, q)
    return p, q, drafts, lengths, u_accept, u_next, tiny


def _multi_rows(p: np.ndarray, q: np.ndarray):
    """What row b of the multi-draft kernel read at depth i: every branch's rows there."""
    K = p.shape[2] - 1

    def rows(b: int, i: int) -> list:
        out = [(f"p[{b}, {j}, {i}", p[b, j, i]) for j in range(p.shape[1])] if 0 <= i <= K else []
        if 0 <= i < K:
            out += [(f"q[{b}, {j}, {i}", q[b, j, i]) for j in range(q.shape[1])]
        return out

    return rows


def verify_multi(p, q, drafts, lengths, u_accept, u_next, *, parallel: bool | None = None, check_uniforms=True):
    p, q, drafts, lengths, u_accept, u_next, tiny = _check_multi(
        p, q, drafts, lengths, u_accept, u_next, check_uniforms
    )
    par = _parallel(parallel, p.size)
    n, nxt, branch, status, where = multi.kernel(p, q, drafts, lengths, u_accept, u_next, tiny, par)
    _raise_on(status, where, _multi_rows(p, q))
    return n, nxt, branch


def verify_multi_reference(p, q, drafts, lengths, u_accept, u_next, *, parallel=None):
    p, q, drafts, lengths, u_accept, u_next, tiny = _check_multi(p, q, drafts, lengths, u_accept, u_next)
    n, nxt, branch, status, where = multi.reference(p, q, drafts, lengths, u_accept, u_next, tiny)
    _raise_on(status, where, _multi_rows(p, q))
    return n, nxt, branch


verify_multi.__doc__ = multi.__doc__


_GAUSSIAN_MESSAGES = {
    **MESSAGES,
    NOT_FINITE: "a location, scale or drafted outcome is NaN or inf, or the outcome overflows",
}


def _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next):
    loc_p = _probs(loc_p, "loc_p [B, K+1, D]", 3).astype(np.float64, copy=False)
    _positions(loc_p, "loc_p [B, K+1, D]")
    B, K1, D = loc_p.shape
    K = K1 - 1
    loc_q = _probs(loc_q, "loc_q [B, K, D]", 3).astype(np.float64, copy=False)
    if loc_q.shape != (B, K, D):
        raise ValueError(f"loc_q must have shape {(B, K, D)} to match loc_p {loc_p.shape}")
    scale = np.asarray(scale)
    if scale.dtype.kind not in "biuf":
        raise TypeError(f"scale must be real numbers, got dtype {scale.dtype}")
    scale = scale.astype(np.float64, copy=False)
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
    z_next = np.asarray(z_next)
    if z_next.dtype.kind not in "biuf":
        raise TypeError(f"z_next must be real numbers, got dtype {z_next.dtype}")
    z_next = np.ascontiguousarray(z_next, dtype=np.float64)
    if z_next.shape != (B, D):
        raise ValueError(f"z_next must have shape {(B, D)}, got {z_next.shape}")
    if not np.all(np.isfinite(z_next)):
        raise ValueError("z_next (standard normal draws for the bonus) must be finite")
    return loc_p, loc_q, scale, drafts, lengths, u_accept, z_next


def _gaussian_rows(loc_p, loc_q, drafts):
    """What row b of the Gaussian kernel read at position i; only its non-finite entries are bad."""
    K = loc_p.shape[1] - 1

    def rows(b: int, i: int) -> list:
        out = [(f"loc_p[{b}, {i}", loc_p[b, i])]
        if i < K:
            out += [(f"loc_q[{b}, {i}", loc_q[b, i]), (f"drafts[{b}, {i}", drafts[b, i])]
        return [(name, np.where(np.isfinite(a), 0.0, a)) for name, a in out]

    return rows


def verify_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, *, parallel=None):
    args = _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next)
    n, nxt, status, where = gaussian.kernel(*args, _parallel(parallel, args[0].size * 8))
    _raise_on(status, where, _gaussian_rows(args[0], args[1], args[3]), _GAUSSIAN_MESSAGES)
    return n, nxt


def verify_gaussian_reference(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next, *, parallel=None):
    args = _check_gaussian(loc_p, loc_q, scale, drafts, lengths, u_accept, z_next)
    n, nxt, status, where = gaussian.reference(*args)
    _raise_on(status, where, _gaussian_rows(args[0], args[1], args[3]), _GAUSSIAN_MESSAGES)
    return n, nxt


verify_gaussian.__doc__ = gaussian.__doc__


# ----------------------------------------------------------------------------- token trees

_TREE_MESSAGES = {
    **MESSAGES,
    tree.DUPLICATE: "a child repeats the outcome of an earlier sibling, which sampling without replacement "
    "cannot draw (children drafted i.i.d.? pass replacement=True)",
}


def _tree_shape(parent: Any, valid: Any, R: int, N1: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Checked ``parent`` and ``valid`` as ``[R, N+1]`` arrays, and the tree's depth D.

    ``parent[0] = -1`` and ``0 <= parent[i] < i`` for every node of the tree (a parent comes before
    its child, which also rules out cycles); the root is valid and a valid node's parent is valid.
    """
    a = parent if isinstance(parent, np.ndarray) else np.asarray(parent)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"parent must be integers (each node's parent index), got dtype {a.dtype}")
    if a.shape not in ((N1,), (R, N1)):
        raise ValueError(f"parent must have shape (N+1,) = {(N1,)} or (R, N+1) = {(R, N1)}, got {a.shape}")
    a = np.ascontiguousarray(np.broadcast_to(a.astype(np.int64, copy=False), (R, N1)))
    if valid is None:
        ok = np.ones((R, N1), np.bool_)
    else:
        ok = valid if isinstance(valid, np.ndarray) else np.asarray(valid)
        if ok.shape != (R, N1):
            raise ValueError(f"valid must have shape (R, N+1) = {(R, N1)}, got {ok.shape}")
        if ok.dtype != np.bool_:
            if ok.size and (ok.dtype.kind not in "biu" or not np.isin(ok, (0, 1)).all()):
                raise TypeError(f"valid must be booleans (which nodes are in each row's tree), got {ok.dtype}")
            ok = ok.astype(np.bool_)
        ok = np.ascontiguousarray(ok)
    if R and not ok[:, 0].all():
        r = int(np.flatnonzero(~ok[:, 0])[0])
        raise ValueError(f"valid[{r}, 0] is False: the root (node 0) is always in the tree")
    if R and (a[:, 0] != -1).any():
        r = int(np.flatnonzero(a[:, 0] != -1)[0])
        raise ValueError(f"parent[0] must be -1 (node 0 is the root), got {int(a[r, 0])}")
    idx = np.arange(N1)
    bad = ok & ((a < 0) | (a >= idx)) & (idx > 0)
    if bad.any():
        r, i = (int(v) for v in np.argwhere(bad)[0])
        where = f"parent[{i}]" if parent is not None and np.ndim(parent) == 1 else f"parent[{r}, {i}]"
        raise ValueError(
            f"malformed tree: {where} = {int(a[r, i])}, but every node i >= 1 needs 0 <= parent[i] < i "
            "(a parent comes before its children: no self-loops, no cycles)"
        )
    a = np.where(ok | (idx == 0), a, 0)  # padding nodes: their parent is never read; make it harmless
    orphan = ok & ~np.take_along_axis(ok, np.maximum(a, 0), axis=1) & (idx > 0)
    if orphan.any():
        r, i = (int(v) for v in np.argwhere(orphan)[0])
        raise ValueError(
            f"row {r}, node {i} is valid but its parent {int(a[r, i])} is not (valid[{r}, {int(a[r, i])}] is False)"
        )
    depth = tree.tree_depths(a)
    return a, ok, int(depth[ok].max()) if ok.size else 0


def _check_tree(p, q, tokens, parent, valid, u_accept, u_next, check_uniforms=True, validate=False, greedy_=False):
    p = _probs(p, "p (target probabilities [R, N+1, V])", 3)
    _positions(p, "p (target probabilities [R, N+1, V])")
    R, N1, V = p.shape
    if greedy_:
        q = p
    else:
        q = _probs(q, "q (draft probabilities [R, N+1, V])", 3)
        if q.shape != p.shape:
            raise ValueError(
                f"q must have shape (R, N+1, V) = {p.shape} like p: the draft distribution each node's "
                f"children were drafted from, got {q.shape}"
            )
    parent, valid, depth = _tree_shape(parent, valid, R, N1)
    tokens = _ints(tokens, "tokens", (R, N1))
    drafted = valid.copy()
    drafted[:, 0] = False  # the root carries no token
    if drafted.any():
        x = np.where(drafted, tokens, 0)
        bad = drafted & ((x < 0) | (x >= V))
        if bad.any():
            r, i = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(
                f"row {r}, node {i}: drafted outcome tokens[{r}, {i}] = {int(tokens[r, i])} is outside 0..{V - 1}"
            )
        if not greedy_:
            rows = np.arange(R)[:, None]
            qx = q[rows, np.maximum(parent, 0), x]
            zero = drafted & (qx == 0)
            if zero.any():
                r, i = (int(v) for v in np.argwhere(zero)[0])
                raise ValueError(
                    f"row {r}, node {i}: {MESSAGES[Q_ZERO]} (q[{r}, {int(parent[r, i])}, {int(x[r, i])}] = 0 at "
                    f"its parent {int(parent[r, i])})"
                )
    if validate:
        _validate_tree_rows(p, q, parent, valid, drafted, greedy_)
    if greedy_:
        u_accept, u_next = np.zeros((R, N1)), np.zeros(R)
    else:
        u_accept = _uniforms(u_accept, "u_accept", (R, N1), check_uniforms)
        u_next = _uniforms(u_next, "u_next", (R,), check_uniforms)
    p, q, tiny = _same_float(p, q)
    return p, q, tokens, parent, valid, u_accept, u_next, tiny, depth


def _validate_tree_rows(p, q, parent, valid, drafted, greedy_) -> None:
    """The rows the kernel may read are distributions (Categorical(validate=True)'s checks)."""
    from .._inverse_cdf import check_probs
    from ..distributions import _sum_tolerance

    internal = np.zeros_like(valid)
    r, i = np.nonzero(drafted)
    internal[r, parent[r, i]] = True  # nodes with at least one valid child: q there is read
    checks = [("p", p, valid)] + ([] if greedy_ else [("q", q, internal)])
    for name, a, mask in checks:
        rows = np.argwhere(mask)
        if not len(rows):
            continue
        status, j, col, sums = check_probs(np.ascontiguousarray(a[mask]), _sum_tolerance(a.dtype))
        if status:
            rr, ii = (int(v) for v in rows[j])
            what = {1: "is NaN or inf", 2: "is negative"}
            if status in what:
                raise ValueError(
                    f"row {rr}, node {ii}: {name}[{rr}, {ii}, {col}] = {a[rr, ii, col]!r} {what[status]}"
                )
            raise ValueError(
                f"row {rr}, node {ii}: {name}[{rr}, {ii}, :] sums to {float(sums[j])!r}, not 1 within "
                f"{_sum_tolerance(a.dtype)} (normalise it, or pass validate=False)"
            )


def _tree_rows(p: np.ndarray, q: np.ndarray, parent: np.ndarray):
    """What row b of the tree kernel read at node i: p there, and q at its parent."""

    def rows(b: int, i: int) -> list:
        out = [(f"p[{b}, {i}", p[b, i])]
        if i > 0:
            a = int(parent[b, i])
            out += [(f"p[{b}, {a}", p[b, a]), (f"q[{b}, {a}", q[b, a])]
        return out

    return rows


def _tree_rule(reference: bool):
    def run(
        p: Any, q: Any, tokens: Any, parent: Any, valid: Any, u_accept: Any, u_next: Any, *,
        replacement: bool = True, validate: bool = True, parallel: bool | None = None, check_uniforms: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p, q, tokens, parent, valid, u_accept, u_next, tiny, depth = _check_tree(
            p, q, tokens, parent, valid, u_accept, u_next, check_uniforms, validate
        )
        mode = tree.IID if replacement else tree.WITHOUT
        if reference:
            out = tree.reference(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, depth)
        else:
            par = _parallel(parallel, p.size)
            out = tree.kernel(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, depth, par)
        n, nxt, path, status, where = out
        if np.count_nonzero(status):
            _raise_on(status, where, _tree_rows(p, q, parent), _TREE_MESSAGES, label="node")
        return n, nxt, path

    return run


verify_tree = _tree_rule(reference=False)
verify_tree.__name__ = verify_tree.__qualname__ = "verify_tree"
verify_tree.__doc__ = tree.__doc__
verify_tree_reference = _tree_rule(reference=True)
verify_tree_reference.__name__ = verify_tree_reference.__qualname__ = "verify_tree_reference"
verify_tree_reference.__doc__ = "NumPy twin of :func:`verify_tree` (same arguments, same bits)."


def _tree_greedy_rule(reference: bool):
    def run(
        p: Any, tokens: Any, parent: Any, valid: Any = None, *, validate: bool = True, parallel: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p, q, tokens, parent, valid, u_accept, u_next, tiny, depth = _check_tree(
            p, None, tokens, parent, valid, None, None, validate=validate, greedy_=True
        )
        if reference:
            out = tree.reference(p, q, tokens, parent, valid, u_accept, u_next, tiny, tree.GREEDY, depth)
        else:
            out = tree.kernel(p, q, tokens, parent, valid, u_accept, u_next, tiny, tree.GREEDY, depth,
                              _parallel(parallel, p.size))
        n, nxt, path, status, where = out
        _raise_on(status, where, _tree_rows(p, q, parent), _TREE_MESSAGES, label="node")
        return n, nxt, path

    return run


verify_tree_greedy = _tree_greedy_rule(reference=False)
verify_tree_greedy.__name__ = verify_tree_greedy.__qualname__ = "verify_tree_greedy"
verify_tree_greedy.__doc__ = """Greedy (argmax) token-tree verification: ``(n_accepted, next_outcome, path)``.

Layout as :func:`verify_tree` without ``q`` and uniforms: from the root, keep the first candidate
(children of the live nodes, in increasing index) whose outcome is the argmax of p at the live node
(first index on ties); the next outcome is the argmax where no candidate matches. The output equals
the target's greedy decoding token for token (proofs/04, proofs/11).
"""
verify_tree_greedy_reference = _tree_greedy_rule(reference=True)
verify_tree_greedy_reference.__name__ = verify_tree_greedy_reference.__qualname__ = "verify_tree_greedy_reference"
