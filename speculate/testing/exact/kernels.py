"""The exact law of an actual verification kernel over its uniforms.

:func:`kernel_law` (one row), :func:`kernel_laws` (many rows, one batched call) and
:func:`kernel_round_law` (one round of a chain, every draft enumerated) call a kernel with the
signature of ``speculate.verify.verify_*`` on every piece of its uniforms' space, cut at the
rule's rational breakpoints, and require it to be constant on each piece, so a kernel with a wrong
threshold or index is caught; each piece weighs its exact length. The result is compared with the
rule's law from ``rules.py`` (:func:`~speculate.testing.exact.round_law`).

A multi-draft kernel (the token rule with several draft branches, as
``speculate.verify.verify_multi``) is recognised by the layout of ``p``: ``[m][K+1][V]`` instead of
``[K+1][V]``; its law's keys carry the surviving branch. Token-tree kernels
(``speculate.verify.verify_tree``) have their own: :func:`kernel_tree_laws`,
:func:`kernel_tree_round_law`.

>>> from speculate.verify import verify_multi
>>> p, q = [[[0.5, 0.5], [0.5, 0.5]]] * 2, [[[0.75, 0.25]]] * 2  # m = 2 branches, K = 1, V = 2
>>> kernel_law(verify_multi, p, q, [[0], [1]])  # {(n_accepted, next_outcome, branch): probability}
... # doctest: +NORMALIZE_WHITESPACE
{(1, 0, 0): Fraction(1, 3), (1, 0, 1): Fraction(1, 6), (1, 1, 0): Fraction(1, 3),
 (1, 1, 1): Fraction(1, 6)}
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ._checks import (
    ONE,
    ZERO,
    Cond,
    Conditional,
    Prefix,
    SeqLaw,
    check_branches,
    check_k,
    check_length,
    check_rule,
    check_V,
    to_fraction,
)
from .rules import block_quantities, continuations, residual

__all__ = ["kernel_law", "kernel_laws", "kernel_round_law", "kernel_tree_laws", "kernel_tree_round_law"]

_EPS = 1e-9  # how far inside a piece's ends the kernel is probed


def _pieces(breakpoints: set[Fraction]) -> list[tuple[Fraction, Fraction]]:
    pts = sorted({ZERO, ONE} | {b for b in breakpoints if 0 < b < 1})
    return [(a, b) for a, b in itertools.pairwise(pts)]


def _cdf_breaks(w: Sequence[Fraction]) -> set[Fraction]:
    total = sum(w, ZERO)
    if total == 0:
        return set()
    # a zero weight adds no breakpoint (the running sum does not move): skip it, not just its value
    return set(itertools.accumulate(x / total for x in w if x))


def _exact_rows(a: Any, name: str, dtype: Any = np.float64) -> list:
    """Nested sequences -> nested lists of Fractions equal to the values the kernel will see."""
    arr = np.asarray(a, dtype=object)
    ftype = np.dtype(dtype).type
    mant = np.finfo(dtype).nmant + 1
    flat = []
    for v in arr.reshape(-1):
        f = to_fraction(v, name)
        d = f.denominator
        if not (d & (d - 1) == 0 and abs(f.numerator) < 2**mant and d < 2**120):
            f = Fraction(float(ftype(float(f))))  # round as the kernel's array will
        flat.append(f)
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _case_coords(rule, multi, p, q, drafts, n) -> list[set[Fraction]]:
    """Breakpoints of every uniform the kernel may read, for one row (union over all paths)."""
    if rule == "greedy":
        return []
    if not multi:
        K = len(drafts)
        coords: list[set[Fraction]] = [set() for _ in range(K + 1)]
        for i in range(n):
            if q[i][drafts[i]] == 0:
                raise ValueError(f"drafts[{i}] = {drafts[i]} has q = 0")
        if rule == "token":
            for i in range(n):
                coords[i].add(min(ONE, p[i][drafts[i]] / q[i][drafts[i]]))
                coords[K] |= _cdf_breaks([max(a - b, ZERO) for a, b in zip(p[i], q[i], strict=True)])
        else:
            P, h = block_quantities(p, q, drafts[:n])
            for i in range(n):
                coords[i].add(h[i])
                coords[K] |= _cdf_breaks([max(P[i] * a - b, ZERO) for a, b in zip(p[i], q[i], strict=True)])
        coords[K] |= _cdf_breaks(p[n])
        return coords
    # branches: p [m][K+1][V], q [m][K][V], drafts [m][K]; u_accept [K][m] then u_next
    m, K = len(drafts), len(drafts[0])
    coords = [set() for _ in range(K * m + 1)]
    for j in range(m):
        for i in range(n + 1):
            cur = p[j][i]
            nxt = coords[K * m]
            nxt |= _cdf_breaks(cur)
            if i == n:
                continue
            qq = q[j][i]
            for _r in range(m):
                for jj in range(m):
                    if drafts[jj][:i] == drafts[j][:i]:
                        x = drafts[jj][i]
                        if qq[x] == 0:
                            raise ValueError(f"drafts[{jj}][{i}] = {x} has q = 0")
                        for c in range(m):
                            coords[i * m + c].add(min(ONE, cur[x] / qq[x]))
                w = [max(a - b, ZERO) for a, b in zip(cur, qq, strict=True)]
                if sum(w, ZERO) == 0:
                    break
                cur = residual(cur, qq)
                nxt |= _cdf_breaks(cur)
    return coords


def _kernel_case_laws(kernel, rule, multi, cases, dtype, chunk: int = 1 << 16) -> list[dict]:
    """Exact output laws of ``kernel`` for each case (p, q, drafts, n): one dict per case.

    ``multi``: the cases have the layout of several draft branches (p ``[m][K+1][V]``)."""
    # 1. enumerate cells and evaluation points
    rows_u: list[np.ndarray] = []  # per case: [cells * evals, n_coords]
    meta = []
    for ci, (p, q, drafts, n) in enumerate(cases):
        coords = _case_coords(rule, multi, p, q, drafts, n)
        pieces = [_pieces(c) for c in coords]
        if not coords:
            rows_u.append(np.zeros((1, 0)))
            meta.append((ci, [()], 1, [], 1))
            continue
        lo = [np.array([float(a) for a, _ in pc]) for pc in pieces]
        hi = [np.array([float(b) for _, b in pc]) for pc in pieces]
        eps = [np.minimum(_EPS, (h - l_) / 4) for l_, h in zip(lo, hi, strict=True)]
        mid = [np.array([float((a + b) / 2) for a, b in pc]) for pc in pieces]
        idx = np.array(list(itertools.product(*[range(len(pc)) for pc in pieces])))  # [C, n_c]
        nc = len(coords)
        centre = np.stack([mid[c][idx[:, c]] for c in range(nc)], axis=1)  # [C, n_c]
        evals = [centre]
        for c in range(nc):
            for end in (lo[c][idx[:, c]] + eps[c][idx[:, c]], hi[c][idx[:, c]] - eps[c][idx[:, c]]):
                u = centre.copy()
                u[:, c] = end
                evals.append(u)
        E = len(evals)
        rows_u.append(np.stack(evals, axis=1).reshape(-1, nc))  # [C * E, n_c]
        lengths = [[b - a for a, b in pc] for pc in pieces]
        meta.append((ci, idx.tolist(), E, lengths, len(idx)))
    # 2. call the kernel on all rows (chunked)
    outs = []
    case_of_row = np.concatenate([np.full(len(r), i) for i, r in enumerate(rows_u)])
    U = np.concatenate(rows_u, axis=0) if rows_u else np.zeros((0, 0))
    arrays = _case_arrays(rule, multi, cases, dtype)
    for start in range(0, len(case_of_row), chunk):
        sel = case_of_row[start : start + chunk]
        u = U[start : start + chunk]
        outs.append(_call_kernel(kernel, rule, multi, arrays, sel, u))
    out = np.concatenate(outs, axis=0)  # [rows, n_out]
    # 3. check constancy per cell, accumulate exact weights
    laws = []
    pos = 0
    for ci, idx, E, lengths, C in meta:
        p, q, drafts, n = cases[ci]
        block = out[pos : pos + C * E].reshape(C, E, -1)
        pos += C * E
        bad = np.nonzero((block != block[:, :1, :]).any(axis=(1, 2)))[0]
        if len(bad):
            c = int(bad[0])
            e = int(np.nonzero((block[c] != block[c, :1]).any(axis=1))[0][0])
            raise AssertionError(
                f"kernel output is not constant on a piece of the uniforms' space (case {ci}, "
                f"drafts {drafts}, length {n}): output {block[c, 0].tolist()} at the piece's "
                f"centre but {block[c, e].tolist()} near the end of uniform coordinate "
                f"{(e - 1) // 2}: a threshold differs from the rule's"
            )
        law: dict = defaultdict(Fraction)
        V = len(p[0][0]) if multi else len(p[0])
        for cell, res in zip(idx, block[:, 0, :].tolist(), strict=True):
            w = ONE
            for c, j in enumerate(cell):
                w *= lengths[c][j]
            key = tuple(int(v) for v in res)
            _check_output(key, multi, n, V, len(drafts), ci)
            law[key] += w
        laws.append(dict(sorted(law.items())))
    return laws


def _check_output(key, multi, n, V, m, ci) -> None:
    if not 0 <= key[0] <= n:
        raise AssertionError(f"case {ci}: kernel returned n_accepted = {key[0]} outside [0, {n}]")
    if not 0 <= key[1] < V:
        raise AssertionError(f"case {ci}: kernel returned next outcome {key[1]} outside [0, {V})")
    if multi and not 0 <= key[2] < m:
        raise AssertionError(f"case {ci}: kernel returned branch {key[2]} outside [0, {m})")


def _case_arrays(rule, multi, cases, dtype):
    N = len(cases)
    d0 = cases[0][2]
    m, K = (len(d0), len(d0[0])) if multi else (1, len(d0))
    V = len(cases[0][0][0][0]) if multi else len(cases[0][0][0])
    lead = (N, m) if multi else (N,)

    def stack(which: int, rows: int) -> np.ndarray:
        flat = [float(x) for c in cases for row in _rows(c[which], multi) for x in row]
        return np.array(flat, dtype=dtype).reshape(*lead, rows, V)

    p = stack(0, K + 1)  # [N, K+1, V] or [N, m, K+1, V]
    drafts = np.array([c[2] for c in cases], dtype=np.int64).reshape(*lead, K)  # [N(, m), K]
    lengths = np.array([[c[3]] * m for c in cases], dtype=np.int64).reshape(lead)  # [N(, m)]
    q = None if rule == "greedy" else stack(1, K)  # [N(, m), K, V]
    return p, q, drafts, lengths


def _rows(a, multi):
    return [row for br in a for row in br] if multi else a


def _call_kernel(kernel, rule, multi, arrays, sel, u):
    p, q, drafts, lengths = arrays
    p, drafts, lengths = p[sel], drafts[sel], lengths[sel]
    if rule == "greedy":
        n_acc, nxt = kernel(p, drafts, lengths)
        return np.stack([np.asarray(n_acc), np.asarray(nxt)], axis=1)
    q = q[sel]
    if multi:
        m, K = drafts.shape[1], drafts.shape[2]
        u_acc = np.ascontiguousarray(u[:, : K * m].reshape(len(u), K, m))  # [R, K, m]
        n_acc, nxt, branch = kernel(p, q, drafts, lengths, u_acc, np.ascontiguousarray(u[:, -1]))
        return np.stack([np.asarray(n_acc), np.asarray(nxt), np.asarray(branch)], axis=1)
    u_acc = np.ascontiguousarray(u[:, :-1])  # [R, K]
    n_acc, nxt = kernel(p, q, drafts, lengths, u_acc, np.ascontiguousarray(u[:, -1]))
    return np.stack([np.asarray(n_acc), np.asarray(nxt)], axis=1)


def kernel_laws(
    kernel: Callable[..., Any],
    cases: Sequence[Sequence[Any]],
    rule: str = "token",
    dtype: Any = np.float64,
) -> list[dict[tuple[int, ...], Fraction]]:
    """:func:`kernel_law` for many rows at once (one batched kernel call): faster.

    ``cases`` is a sequence of ``(p, q, drafts)`` or ``(p, q, drafts, length)``; all cases must
    have the same K, V (and number of branches m). Returns one law per case, in order.

    >>> from speculate.verify import verify_token
    >>> case = ([[0.5, 0.5], [0.5, 0.5]], [[0.75, 0.25]], [0])
    >>> kernel_laws(verify_token, [case, case])[1] == kernel_law(verify_token, *case)
    True
    """
    check_rule(rule)
    prepared = []
    shapes = set()
    multi = False
    for ci, case in enumerate(cases):
        if len(case) not in (3, 4):
            raise ValueError(f"case {ci} must be (p, q, drafts) or (p, q, drafts, length)")
        p, q, drafts = case[:3]
        length = case[3] if len(case) == 4 else None
        p = _exact_rows(p, f"case {ci}: p", dtype)
        d = np.asarray(drafts, dtype=np.int64)
        p_shape = np.asarray(p, dtype=object).shape
        shape = (p_shape, d.shape)
        shapes.add(shape)
        if len(shapes) > 1:
            raise ValueError(f"case {ci} has shapes {shape}, unlike the first case's")
        multi = _branched(p_shape, rule, ci)
        V = p_shape[-1]
        K = d.shape[-1]
        if multi and p_shape[:2] != (d.shape[0], K + 1):
            raise ValueError(f"case {ci}: p must be [m][K+1][V] for drafts [m][K] = {d.shape}")
        if not multi and len(p) != K + 1:
            raise ValueError(f"case {ci}: p must have K + 1 = {K + 1} rows, got {len(p)}")
        if rule == "greedy":
            q = [[ZERO] * V for _ in range(K)]
        else:
            q = _exact_rows(q, f"case {ci}: q", dtype)
        n = check_length(length, K, f"case {ci}: ")
        if ((d < 0) | (d >= V)).any():
            raise ValueError(f"case {ci}: drafts {d.tolist()} outside range(V = {V})")
        prepared.append((p, q, d.tolist(), n))
    if not prepared:
        return []
    return _dedup_laws(kernel, rule, multi, prepared, dtype)


def _branched(p_shape: tuple[int, ...], rule: str, ci: int) -> bool:
    """Whether ``p`` has the layout of several draft branches, ``[m][K+1][V]`` (else ``[K+1][V]``)."""
    if len(p_shape) == 2:
        return False
    if len(p_shape) != 3:
        raise ValueError(
            f"case {ci}: p must be [K+1][V], or [m][K+1][V] for m draft branches; got shape {p_shape}"
        )
    if rule != "token":
        raise ValueError(
            f"case {ci}: p [m][K+1][V] has draft branches (multi-draft), which need rule='token', "
            f"got rule={rule!r}"
        )
    return True


def _dedup_laws(kernel, rule, multi, cases, dtype) -> list[dict]:
    """_kernel_case_laws on the distinct cases only."""
    index: dict = {}
    keys = []
    for p, q, d, n in cases:
        key = (repr(p), repr(q), repr(d), n)
        keys.append(index.setdefault(key, len(index)))
    distinct = [None] * len(index)
    for case, i in zip(cases, keys, strict=True):
        distinct[i] = case
    laws = _kernel_case_laws(kernel, rule, multi, distinct, dtype)
    return [laws[i] for i in keys]


def kernel_law(
    kernel: Callable[..., Any],
    p: Any,
    q: Any,
    drafts: Any,
    rule: str = "token",
    length: int | None = None,
    dtype: Any = np.float64,
) -> dict[tuple[int, ...], Fraction]:
    """Exact law of a verification kernel's output for ONE row, over its uniforms.

    ``p`` is ``[K+1][V]``, or ``[m][K+1][V]`` for m draft branches (multi-draft: the token rule,
    a kernel with the signature of ``speculate.verify.verify_multi``); ``q`` is ``[K][V]``
    (``[m][K][V]``; ignored for ``"greedy"``), ``drafts`` ``[K]`` (``[m][K]``), ``length`` the
    number of valid drafts (default K). The kernel (signature of ``speculate.verify.verify_*``)
    is evaluated at the centre of every piece of the uniforms' space cut at the rule's rational
    breakpoints and just inside (1e-9) both ends of each uniform's piece; it must be constant on
    each piece. Returns ``{(n_accepted, next_outcome[, branch]): probability}``, exact for the
    float64 (``dtype``) values the kernel sees.

    >>> from speculate.verify import verify_token
    >>> kernel_law(verify_token, [[0.5, 0.5], [0.5, 0.5]], [[0.75, 0.25]], [0])
    {(0, 1): Fraction(1, 3), (1, 0): Fraction(1, 3), (1, 1): Fraction(1, 3)}
    """
    return kernel_laws(kernel, [(p, q, drafts, length)], rule, dtype)[0]


def _stopped(cond, k, prefix, stop) -> list[tuple[Prefix, Fraction]]:
    """Continuations drawn from ``cond`` until ``stop(prefix + drafts)`` or k drafts."""
    out, live = [], [((), ONE)]
    for _ in range(k):
        new = []
        for seq, w in live:
            for x, px in enumerate(cond(prefix + seq)):
                if px:
                    s = (*seq, x)
                    (out if stop(prefix + s) else new).append((s, w * px))
        live = new
    return out + live


def kernel_round_law(
    kernel: Callable[..., Any],
    target: Conditional,
    draft: Conditional,
    V: int,
    k: int,
    rule: str = "token",
    branches: int = 1,
    prefix: Prefix = (),
    length: int | None = None,
    proposal: Conditional | None = None,
    dtype: Any = np.float64,
    stop: Callable[[Prefix], bool] | None = None,
) -> SeqLaw:
    """Exact law of the block one round emits when ``kernel`` does the verification.

    Enumerates every draft (``branches`` i.i.d. branches; ``branches > 1`` needs
    ``rule="token"`` and a kernel with the signature of ``speculate.verify.verify_multi``) of
    ``length`` outcomes (default ``k``; positions past it are filled with a decoy the kernel must
    ignore), builds the kernel's ``p``/``q`` arrays from the chains, and weighs :func:`kernel_law`
    by the drafts' probabilities. ``proposal``: the law the drafts are really drawn from (default
    ``draft``). ``stop(prefix + drafts so far)``: the draft stops early when it returns True (a
    stopping time, as a confidence-based draft length; not with ``branches > 1``).
    Compare with :func:`~speculate.testing.exact.round_law`, or chain it:
    ``chain_joint_law(..., rule=lambda s: kernel_round_law(kernel, T, D, V, k, prefix=s))``.

    >>> from speculate.testing.exact import round_law
    >>> from speculate.verify import verify_block
    >>> T = lambda s: [Fraction(1, 2), Fraction(1, 2)]
    >>> D = lambda s: [Fraction(3, 4), Fraction(1, 4)]
    >>> law = kernel_round_law(verify_block, T, D, V=2, k=2, rule="block")
    >>> law == round_law(T, D, V=2, k=2, rule="block")
    True
    """
    check_V(V)
    check_rule(rule)
    check_k(k)
    check_branches(branches, rule)
    n = check_length(length, k)
    multi = branches > 1
    if stop is not None and multi:
        raise ValueError("stop= (ragged branch lengths) is not supported with branches > 1")
    T, D = Cond(target, V, "target"), Cond(draft, V, "draft")
    Q = D if proposal is None else Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    decoy_p = [ZERO] * (V - 1) + [ONE]  # a kernel reading past `length` accepts the decoy
    decoy_q = [Fraction(1, V)] * V
    seqs = continuations(Q, n, prefix) if stop is None else _stopped(Q, n, prefix, stop)
    configs = list(itertools.product(seqs, repeat=branches))
    cases, weights, drafted = [], [], []
    for config in configs:
        w = ONE
        ps, qs, ds = [], [], []
        for xs, wx in config:
            n = len(xs)
            w *= wx
            ps.append([T(prefix + xs[:i]) for i in range(n + 1)] + [decoy_p] * (k - n))
            qs.append([D(prefix + xs[:i]) for i in range(n)] + [decoy_q] * (k - n))
            ds.append(list(xs) + [V - 1] * (k - n))
        if multi:
            cases.append((_exact_rows(ps, "p", dtype), _exact_rows(qs, "q", dtype), ds, n))
        else:
            cases.append((_exact_rows(ps[0], "p", dtype), _exact_rows(qs[0], "q", dtype), ds[0], n))
        weights.append(w)
        drafted.append([c[0] for c in config])
    laws = _dedup_laws(kernel, rule, multi, cases, dtype)
    out: SeqLaw = defaultdict(Fraction)
    for w, branch_drafts, law in zip(weights, drafted, laws, strict=True):
        for key, pw in law.items():
            br = branch_drafts[key[2]] if multi else branch_drafts[0]
            out[(*br[: key[0]], key[1])] += w * pw
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- token trees


def _tree_coords(p, q, par, tok, ok, replacement, greedy) -> list[set[Fraction]]:
    """Breakpoints of every uniform the tree kernel may read (u_accept per node, then u_next),
    found by walking every accept/reject path of the rule exactly."""
    N1 = len(par)
    coords: list[set[Fraction]] = [set() for _ in range(N1 + 1)]
    if greedy:
        return []

    def walk(live: list[int]) -> None:
        j0 = live[0]
        cands = [c for c in range(1, N1) if ok[c] and par[c] in live]
        cur = p[j0]
        removed: set[int] = set()
        for c in cands:
            x, qrow = tok[c], q[par[c]]
            if replacement:
                qc = qrow
            else:
                left = ONE - sum((qrow[y] for y in removed), ZERO)
                qc = [ZERO if y in removed else v / left for y, v in enumerate(qrow)]
            if qc[x] == 0:
                raise ValueError(f"node {c}: drafted outcome {x} has q = 0")
            a = min(ONE, cur[x] / qc[x])
            coords[c].add(a)
            if a:
                walk([d for d in cands if tok[d] == x])
            if a == 1:
                return
            cur = residual(cur, qc)
            removed.add(x)
        coords[N1] |= _cdf_breaks(cur)

    walk([0])
    coords[0] = set()  # column 0 of u_accept is never read
    return coords


def kernel_tree_laws(
    kernel: Callable[..., Any],
    parent: Sequence[int],
    cases: Sequence[Sequence[Any]],
    replacement: bool = True,
    dtype: Any = np.float64,
) -> list[dict[tuple[int, ...], Fraction]]:
    """Exact law of a token-tree kernel (signature of ``speculate.verify.verify_tree``, or of
    ``verify_tree_greedy`` when ``replacement`` is ``"greedy"``) for several rows of one tree shape.

    ``cases``: ``(p [N+1][V], q [N+1][V], tokens [N+1])`` or ``(p, q, tokens, valid [N+1])``.
    The kernel is called on every piece of its uniforms' space (``u_accept [N+1]`` and ``u_next``,
    cut at the rule's rational breakpoints) and must be constant on each piece. Returns, per case,
    ``{(n_accepted, next_outcome, last accepted node or 0): probability}``, to compare with
    :func:`~speculate.testing.exact.tree_walk`.

    >>> from speculate.verify import verify_tree
    >>> case = ([[0.5, 0.5]] * 3, [[0.75, 0.25]] * 3, [0, 0, 1])
    >>> kernel_tree_laws(verify_tree, [-1, 0, 0], [case])[0] == {
    ...     (1, 0, 1): Fraction(1, 3), (1, 1, 1): Fraction(1, 3),
    ...     (1, 0, 2): Fraction(1, 6), (1, 1, 2): Fraction(1, 6)}
    True
    """
    from .rules import check_parent

    par = check_parent(parent)
    N1 = len(par)
    greedy = replacement == "greedy"
    prepared = []
    for ci, case in enumerate(cases):
        if len(case) not in (3, 4):
            raise ValueError(f"case {ci} must be (p, q, tokens) or (p, q, tokens, valid)")
        p = _exact_rows(case[0], f"case {ci}: p", dtype)
        q = p if greedy else _exact_rows(case[1], f"case {ci}: q", dtype)
        tok = [int(t) for t in case[2]]
        ok = [True] * N1 if len(case) == 3 or case[3] is None else [bool(v) for v in case[3]]
        if len(p) != N1 or len(q) != N1 or len(tok) != N1 or len(ok) != N1:
            raise ValueError(f"case {ci}: p, q, tokens and valid need N+1 = {N1} rows like parent")
        prepared.append((p, q, tok, ok))
    if not prepared:
        return []
    V = len(prepared[0][0][0])
    laws = []
    for ci, (p, q, tok, ok) in enumerate(prepared):
        coords = _tree_coords(p, q, par, tok, ok, replacement is True, greedy)
        laws.append(_tree_case_law(kernel, par, p, q, tok, ok, coords, greedy, replacement is True, dtype, V, ci))
    return laws


def _tree_case_law(kernel, par, p, q, tok, ok, coords, greedy, replacement, dtype, V, ci) -> dict:
    N1 = len(par)
    P = np.array([[float(x) for x in row] for row in p], dtype)[None]
    Q = np.array([[float(x) for x in row] for row in q], dtype)[None]
    T = np.array([tok], np.int64)
    OKA = np.array([ok], bool)
    parent = np.array(par, np.int64)
    if greedy:
        n, y, path = kernel(P, T, parent, OKA)
        key = (int(n[0]), int(y[0]), int(path[0, n[0] - 1]) if n[0] else 0)
        return {key: ONE}
    pieces = [_pieces(c) for c in coords]
    lo = [np.array([float(a) for a, _ in pc]) for pc in pieces]
    hi = [np.array([float(b) for _, b in pc]) for pc in pieces]
    eps = [np.minimum(_EPS, (h - l_) / 4) for l_, h in zip(lo, hi, strict=True)]
    mid = [np.array([float((a + b) / 2) for a, b in pc]) for pc in pieces]
    idx = np.array(list(itertools.product(*[range(len(pc)) for pc in pieces])))  # [C, N+2]
    nc = len(coords)
    centre = np.stack([mid[c][idx[:, c]] for c in range(nc)], axis=1)
    evals = [centre]
    for c in range(nc):
        if len(pieces[c]) == 1 and c < N1:
            continue  # a uniform no path reads: probed at the centre only
        for end in (lo[c][idx[:, c]] + eps[c][idx[:, c]], hi[c][idx[:, c]] - eps[c][idx[:, c]]):
            u = centre.copy()
            u[:, c] = end
            evals.append(u)
    E = len(evals)
    U = np.stack(evals, axis=1).reshape(-1, nc)
    R = len(U)
    n, y, path = kernel(np.broadcast_to(P, (R, *P.shape[1:])), np.broadcast_to(Q, (R, *Q.shape[1:])),
                        np.broadcast_to(T, (R, N1)), parent, np.broadcast_to(OKA, (R, N1)),
                        np.ascontiguousarray(U[:, :N1]), np.ascontiguousarray(U[:, N1]), replacement=replacement)
    n, y = np.asarray(n), np.asarray(y)
    last = np.where(n > 0, np.asarray(path)[np.arange(R), np.maximum(n - 1, 0)], 0)
    out = np.stack([n, y, last], axis=1).reshape(len(idx), E, 3)
    bad = np.nonzero((out != out[:, :1, :]).any(axis=(1, 2)))[0]
    if len(bad):
        c = int(bad[0])
        e = int(np.nonzero((out[c] != out[c, :1]).any(axis=1))[0][0])
        raise AssertionError(
            f"tree kernel output is not constant on a piece of the uniforms' space (case {ci}, tokens "
            f"{tok}): {out[c, 0].tolist()} at the piece's centre but {out[c, e].tolist()} near an end of "
            "one uniform: a threshold differs from the rule's"
        )
    widths = [[b - a for a, b in pc] for pc in pieces]
    law: dict = defaultdict(Fraction)
    for cell, res in zip(idx.tolist(), out[:, 0, :].tolist(), strict=True):
        w = ONE
        for c, j in enumerate(cell):
            w *= widths[c][j]
        if not (0 <= res[1] < V):
            raise AssertionError(f"case {ci}: kernel returned next outcome {res[1]} outside [0, {V})")
        law[tuple(res)] += w
    return dict(sorted(law.items()))


def kernel_tree_round_law(
    kernel: Callable[..., Any],
    target: Conditional,
    draft: Conditional,
    V: int,
    parent: Sequence[int],
    prefix: Prefix = (),
    replacement: bool | str = True,
    dtype: Any = np.float64,
) -> SeqLaw:
    """Exact law of the block one round of token-tree verification emits when ``kernel`` verifies:
    every drafted tree (:func:`~speculate.testing.exact.tree_drafts`; i.i.d. children, or without
    replacement when ``replacement=False``; ``"greedy"`` for a ``verify_tree_greedy``-like kernel
    on i.i.d. drafts), the kernel's ``p``/``q`` arrays built from the chains at every node's
    context, and :func:`kernel_tree_laws` weighed by the trees' probabilities. Compare with
    :func:`~speculate.testing.exact.tree_round_law`.

    >>> from speculate.testing.exact import tree_round_law
    >>> from speculate.verify import verify_tree
    >>> T = lambda s: [Fraction(1, 2), Fraction(1, 2)]
    >>> D = lambda s: [Fraction(3, 4), Fraction(1, 4)]
    >>> kernel_tree_round_law(verify_tree, T, D, 2, [-1, 0, 0, 1]) == tree_round_law(T, D, 2, [-1, 0, 0, 1])
    True
    """
    from .rules import _context, check_parent, tree_drafts

    check_V(V)
    par = check_parent(parent)
    Tc, Dc = Cond(target, V, "target"), Cond(draft, V, "draft")
    greedy = replacement == "greedy"
    trees = tree_drafts(Dc, V, par, prefix, True if greedy else bool(replacement))
    cases, weights = [], []
    uniform = [Fraction(1, V)] * V
    for tokens, valid, w in trees:
        ctxs = [_context(par, tokens, i, prefix) if valid[i] else None for i in range(len(par))]
        p = [Tc(c) if c is not None else uniform for c in ctxs]
        q = [Dc(c) if c is not None else uniform for c in ctxs]
        cases.append((p, q, list(tokens), list(valid)))
        weights.append(w)
    laws = kernel_tree_laws(kernel, par, cases, replacement, dtype)
    out: SeqLaw = defaultdict(Fraction)
    for (_, _, tokens, _), w, law in zip(cases, weights, laws, strict=True):
        for (n, y, last), pw in law.items():
            out[(*_context(par, tokens, last, ())[:n], y)] += w * pw
    return dict(sorted(out.items()))
