"""The exact laws of the verification rules: the mathematics, on :class:`fractions.Fraction`.

One step: :func:`acceptance`, :func:`total_variation`, :func:`residual`, :func:`speculative_law`.
One round after a prefix: :func:`round_law` for every rule of ``speculate.verify.RULES`` (token,
block, greedy; the token rule with ``branches > 1`` is multi-draft recursive rejection), with
:func:`block_quantities` for the block rule and :func:`expected_outcomes`. Chains of rounds:
:func:`chain_joint_law`, compared with :func:`target_joint_law`, directly or through
:func:`extend_with_target` (Theorem 5's criterion). Token trees (``speculate.verify.verify_tree``): :func:`tree_drafts`,
:func:`tree_walk`, :func:`tree_round_law`. :func:`assert_exact_law` compares two laws
exactly. Nothing here calls a kernel; the law of an actual kernel is in ``kernels.py``.

Chains are given as functions ``prefix -> probabilities`` over ``V`` outcomes, where the prefix
is the tuple of outcomes emitted so far; they may depend on the whole prefix and contain zeros.

>>> F = Fraction
>>> T = lambda s: [F(1, 2), F(1, 2)]
>>> D = lambda s: [F(3, 4), F(1, 4)]
>>> round_law(T, D, V=2, k=1, branches=2) == round_law(T, D, V=2, k=1, branches=1)
False
>>> chain_joint_law(T, D, V=2, L=3, k=1, branches=2) == target_joint_law(T, V=2, L=3)
True
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from ._checks import (
    ONE,
    ZERO,
    Cond,
    Conditional,
    Prefix,
    SeqLaw,
    as_law,
    check_branches,
    check_count,
    check_k,
    check_rule,
    check_V,
    to_fraction,
    to_fractions,
)

__all__ = [
    "acceptance",
    "assert_exact_law",
    "block_quantities",
    "chain_joint_law",
    "expected_outcomes",
    "extend_with_target",
    "greedy",
    "residual",
    "round_law",
    "speculative_law",
    "target_joint_law",
    "total_variation",
    "tree_drafts",
    "tree_round_law",
    "tree_walk",
]


# --------------------------------------------------------------------------- one step


def acceptance(p: Sequence[Any], q: Sequence[Any]) -> Fraction:
    """Probability that one-step speculative sampling keeps the draft: sum_x min(p(x), q(x)).

    >>> acceptance([Fraction(1, 2), Fraction(1, 2)], [1, 0])
    Fraction(1, 2)
    """
    p, q = _pair(p, q)
    return sum((min(a, b) for a, b in zip(p, q, strict=True)), ZERO)


def total_variation(p: Sequence[Any], q: Sequence[Any]) -> Fraction:
    """Total variation distance sum_x (p(x) - q(x))_+ (equal to 1 - acceptance for laws).

    Works for laws and for unnormalised non-negative weights of equal total (e.g. sequence laws
    given as lists).

    >>> total_variation([Fraction(1, 2), Fraction(1, 2)], [1, 0])
    Fraction(1, 2)
    """
    p, q = to_fractions(p), to_fractions(q)
    if len(p) != len(q):
        raise ValueError(f"p has {len(p)} outcomes but q has {len(q)}")
    return sum((max(a - b, ZERO) for a, b in zip(p, q, strict=True)), ZERO)


def residual(p: Sequence[Any], q: Sequence[Any], scale: Any = 1) -> list[Fraction]:
    """The residual law norm((scale * p - q)_+) sampled after a rejection.

    ``scale`` is 1 for token-wise verification and P_tau for block verification. Raises
    ``ValueError`` when the residual has no mass (then no rejection can happen).

    >>> residual([Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 4), Fraction(3, 4)])
    [Fraction(1, 1), Fraction(0, 1)]
    """
    p, q = to_fractions(p), to_fractions(q)
    s = to_fraction(scale, "scale")
    w = [max(s * a - b, ZERO) for a, b in zip(p, q, strict=True)]
    total = sum(w, ZERO)
    if total == 0:
        raise ValueError("the residual (scale * p - q)_+ has no mass: no rejection is possible")
    return [x / total for x in w]


def speculative_law(p: Sequence[Any], q: Sequence[Any]) -> list[Fraction]:
    """Law of one-step speculative sampling: draw x ~ q, keep it w.p. min(1, p(x)/q(x)),
    else draw from the residual norm((p - q)_+). Theorem 1 says this is exactly p.

    >>> speculative_law([Fraction(1, 3), Fraction(2, 3), 0], [Fraction(1, 2), 0, Fraction(1, 2)])
    [Fraction(1, 3), Fraction(2, 3), Fraction(0, 1)]
    """
    p, q = _pair(p, q)
    a = acceptance(p, q)
    law = [min(pi, qi) for pi, qi in zip(p, q, strict=True)]
    if a < 1:
        law = [x + (1 - a) * r for x, r in zip(law, residual(p, q), strict=True)]
    return law


def assert_exact_law(
    law: Sequence[Any] | Mapping[Any, Any],
    expected: Sequence[Any] | Mapping[Any, Any],
    name: str = "law",
) -> None:
    """Assert two laws are equal exactly; the error names the first differing outcome.

    Laws are lists (outcome = index) or mappings (outcome = key, missing keys have mass 0).

    >>> assert_exact_law([Fraction(1, 2), Fraction(1, 2)], [Fraction(1, 2), Fraction(1, 2)])
    >>> assert_exact_law({(0,): Fraction(3, 4), (1,): Fraction(1, 4)}, {(0,): 0.6, (1,): 0.4})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: law differs at outcome (0,): got 3/4 (0.75), expected 0.6 exactly (0.6); ...
    """
    a, b = _as_mapping(law, "law"), _as_mapping(expected, "expected")
    keys = sorted(set(a) | set(b), key=_sort_key)
    tv = ZERO
    first = None
    for key in keys:
        x, y = a.get(key, ZERO), b.get(key, ZERO)
        if x != y:
            tv += abs(x - y)
            if first is None:
                first = (key, x, y)
    if first is not None:
        key, x, y = first
        ys = f"{float(y):.6g} exactly" if y.denominator > 10**6 or _is_float_like(y) else str(y)
        raise AssertionError(
            f"{name} differs at outcome {key!r}: got {x} ({float(x):.6g}), expected {ys} "
            f"({float(y):.6g}); total variation {float(tv / 2):.6g}"
        )


def _is_float_like(f: Fraction) -> bool:
    return f.denominator & (f.denominator - 1) == 0 and f.denominator > 2**20


def _sort_key(key: Any) -> tuple[int, Any]:
    if isinstance(key, tuple):
        return (len(key), key)
    return (0, (key,))


def _as_mapping(law: Any, name: str) -> dict[Any, Fraction]:
    if isinstance(law, Mapping):
        return {k: to_fraction(v, f"{name}[{k!r}]") for k, v in law.items()}
    return {i: to_fraction(v, f"{name}[{i}]") for i, v in enumerate(law)}


def _pair(p: Sequence[Any], q: Sequence[Any]) -> tuple[list[Fraction], list[Fraction]]:
    p, q = as_law(p, name="p"), as_law(q, name="q")
    if len(p) != len(q):
        raise ValueError(f"p has {len(p)} outcomes but q has {len(q)}")
    return p, q

# --------------------------------------------------------------------------- chains and rounds


def greedy(cond: Conditional) -> Conditional:
    """The greedy version of a conditional law: a point mass at its argmax (lowest index wins).

    >>> g = greedy(lambda prefix: [Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)])
    >>> g(())
    [Fraction(0, 1), Fraction(1, 1), Fraction(0, 1)]
    """

    def g(prefix: Prefix) -> list[Fraction]:
        law = to_fractions(cond(prefix))
        best = max(range(len(law)), key=lambda i: (law[i], -i))
        return [ONE if i == best else ZERO for i in range(len(law))]

    return g


def target_joint_law(target: Conditional, V: int, L: int, prefix: Prefix = ()) -> SeqLaw:
    """Law of the first ``L`` outcomes when sampling the target step by step after ``prefix``.

    >>> law = target_joint_law(lambda s: [Fraction(1, 2), Fraction(1, 2)], V=2, L=2)
    >>> law[(0, 1)]
    Fraction(1, 4)
    """
    check_V(V)
    T = Cond(target, V, "target")
    laws: SeqLaw = {(): ONE}
    for _ in range(L):
        new: SeqLaw = defaultdict(Fraction)
        for seq, w in laws.items():
            for x, px in enumerate(T(tuple(prefix) + seq)):
                if px:
                    new[(*seq, x)] += w * px
        laws = dict(new)
    return dict(sorted(laws.items()))


def block_quantities(
    p_rows: Sequence[Sequence[Fraction]],
    q_rows: Sequence[Sequence[Fraction]],
    drafts: Sequence[int],
) -> tuple[list[Fraction], list[Fraction]]:
    """Block verification's (Sun et al. 2024) quantities for one drafted block of length g.

    ``p_rows[i]`` (i = 0..g) is the target and ``q_rows[i]`` (i < g) the draft at the state after
    ``drafts[:i]``. Returns ``(P, h)``: ``P[i]`` for i = 0..g with P_0 = 1 and
    P_i = min(P_{i-1} p_i(X_i) / q_i(X_i), 1); ``h[i-1]`` = h_i for i = 1..g with
    h_i = R_i / (R_i + 1 - P_i) (1 when P_i = 1), R_i = sum_x (P_i p_{i+1}(x) - q_{i+1}(x))_+,
    and h_g = P_g. The block keeps the LAST i with U_i < h_i (0 if none).

    >>> F = Fraction
    >>> block_quantities([[F(1, 2), F(1, 2)]] * 2, [[F(3, 4), F(1, 4)]], [0])
    ([Fraction(1, 1), Fraction(2, 3)], [Fraction(2, 3)])
    """
    g = len(drafts)
    if len(p_rows) < g + 1 or len(q_rows) < g:
        raise ValueError(f"need {g + 1} target rows and {g} draft rows for {g} drafts")
    P = [ONE]
    for i, x in enumerate(drafts):
        qx = q_rows[i][x]
        if qx == 0:
            raise ValueError(f"draft outcome {x} at position {i} has q = 0")
        P.append(min(P[-1] * p_rows[i][x] / qx, ONE))
    h = []
    for i in range(1, g + 1):
        if i == g:
            h.append(P[g])
        elif P[i] == 1:
            h.append(ONE)
        else:
            R = sum((max(P[i] * a - b, ZERO) for a, b in zip(p_rows[i], q_rows[i], strict=True)), ZERO)
            h.append(R / (R + 1 - P[i]))
    return P, h


def continuations(cond: Cond, k: int, prefix: Prefix) -> list[tuple[Prefix, Fraction]]:
    """All length-k continuations of ``prefix`` sampled from ``cond``, with their probabilities."""
    out: list[tuple[Prefix, Fraction]] = [((), ONE)]
    for _ in range(k):
        new = []
        for seq, w in out:
            for x, px in enumerate(cond(prefix + seq)):
                if px:
                    new.append(((*seq, x), w * px))
        out = new
    return out


def _argmax(law: Sequence[Fraction]) -> int:
    return max(range(len(law)), key=lambda i: (law[i], -i))


def round_law(
    target: Conditional,
    draft: Conditional,
    V: int,
    k: int,
    rule: str = "token",
    branches: int = 1,
    prefix: Prefix = (),
    proposal: Conditional | None = None,
) -> SeqLaw:
    """Law of the block one speculative round emits after ``prefix`` (the mathematics).

    The draft proposes ``k`` outcomes on each of ``branches`` i.i.d. draft branches, the rule
    keeps a prefix of them and draws one more outcome (residual or bonus). Rules
    (``speculate.verify.RULES``): ``"token"`` (Leviathan/Chen; with ``branches > 1``, SpecInfer's
    multi-draft recursive rejection: at each depth the branches whose drafts match the kept prefix
    are tried in index order, the target replaced by norm((p - q)_+) after each rejection),
    ``"block"`` (Sun et al.), ``"greedy"`` (keep while the draft equals the target's argmax; the
    next outcome is the argmax). ``branches > 1`` needs ``rule="token"``. ``proposal`` is the law
    the drafts are really sampled from (default: ``draft``); setting it differently models bugs
    where the verifier is told the wrong q.

    >>> F = Fraction
    >>> T = lambda s: [F(1, 2), F(1, 2)]
    >>> D = lambda s: [F(3, 4), F(1, 4)]
    >>> law = round_law(T, D, V=2, k=1)
    >>> law[(0, 0)], law[(1,)]
    (Fraction(1, 4), Fraction(1, 4))
    """
    check_V(V)
    check_rule(rule)
    check_k(k)
    check_branches(branches, rule)
    T, D = Cond(target, V, "target"), Cond(draft, V, "draft")
    Q = D if proposal is None else Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    out: SeqLaw = defaultdict(Fraction)
    if branches > 1:
        _multi_round(T, D, Q, k, branches, prefix, out)
    elif rule == "token":
        _token_round(T, D, Q, k, prefix, (), ONE, out)
    elif rule == "greedy":
        _greedy_round(T, Q, k, prefix, (), ONE, out)
    else:
        _block_round(T, D, Q, k, prefix, out)
    return dict(sorted(out.items()))


def _token_round(T, D, Q, k, prefix, acc, w, out) -> None:
    s = prefix + acc
    p = T(s)
    if len(acc) == k:
        for y, py in enumerate(p):
            if py:
                out[(*acc, y)] += w * py
        return
    q, prop = D(s), Q(s)
    reject = ZERO
    for x, px in enumerate(prop):
        if px == 0:
            continue
        if q[x] == 0:
            raise ValueError(f"outcome {x} is proposed after {s} but the draft gives it q = 0")
        a = min(ONE, p[x] / q[x])
        if a:
            _token_round(T, D, Q, k, prefix, (*acc, x), w * px * a, out)
        reject += px * (1 - a)
    if reject:
        for y, r in enumerate(residual(p, q)):
            if r:
                out[(*acc, y)] += w * reject * r


def _greedy_round(T, Q, k, prefix, acc, w, out) -> None:
    s = prefix + acc
    best = _argmax(T(s))
    if len(acc) == k:
        out[(*acc, best)] += w
        return
    for x, px in enumerate(Q(s)):
        if px == 0:
            continue
        if x == best:
            _greedy_round(T, Q, k, prefix, (*acc, x), w * px, out)
        else:
            out[(*acc, best)] += w * px


def _block_round(T, D, Q, k, prefix, out) -> None:
    for xs, w in continuations(Q, k, prefix):
        p_rows = [T(prefix + xs[:i]) for i in range(k + 1)]
        q_rows = [D(prefix + xs[:i]) for i in range(k)]
        P, h = block_quantities(p_rows, q_rows, xs)
        for tau in range(k + 1):
            pt = ONE if tau == 0 else h[tau - 1]
            for j in range(tau + 1, k + 1):
                pt *= 1 - h[j - 1]
            if pt == 0:
                continue
            if tau == k:
                law = p_rows[k]
            else:
                try:
                    law = residual(p_rows[tau], q_rows[tau], scale=P[tau])
                except ValueError:
                    raise ValueError(
                        f"block rule stops at tau = {tau} after {prefix + xs[:tau]} with "
                        "probability > 0 but its residual is empty (drafts not sampled from q?)"
                    ) from None
            for y, py in enumerate(law):
                if py:
                    out[(*xs[:tau], y)] += w * pt * py


def _multi_round(T, D, Q, k, branches, prefix, out) -> None:
    seqs = continuations(Q, k, prefix)
    for config in itertools.product(seqs, repeat=branches):
        drafts = [c[0] for c in config]
        w = ONE
        for c in config:
            w *= c[1]
        _multi_depth(T, D, k, prefix, drafts, (), w, out)


def _multi_depth(T, D, k, prefix, drafts, acc, w, out) -> None:
    s = prefix + acc
    cur = T(s)
    depth = len(acc)
    if depth < k:
        q = D(s)
        for br in drafts:
            if br[:depth] != acc:
                continue
            x = br[depth]
            a = min(ONE, cur[x] / q[x])
            if a:
                _multi_depth(T, D, k, prefix, drafts, (*acc, x), w * a, out)
            w *= 1 - a
            if w == 0:
                return
            cur = residual(cur, q)
    for y, py in enumerate(cur):
        if py:
            out[(*acc, y)] += w * py


def extend_with_target(
    law: Mapping[tuple[int, ...], Any],
    target: Conditional,
    V: int,
    L: int,
    prefix: Prefix = (),
) -> SeqLaw:
    """Law of the first ``L`` outcomes of: a block drawn from ``law``, then target sampling.

    A round is exact iff ``extend_with_target(round law, target, V, k + 1)`` equals
    ``target_joint_law(target, V, k + 1)`` (Theorem 5's criterion).

    >>> F = Fraction
    >>> T = lambda s: [F(1, 2), F(1, 2)]
    >>> extend_with_target({(1,): 1}, T, V=2, L=2) == {(1, 0): F(1, 2), (1, 1): F(1, 2)}
    True
    """
    T = Cond(target, V, "target")
    out: SeqLaw = defaultdict(Fraction)
    for block, w in law.items():
        w = to_fraction(w, f"law[{block!r}]")
        if not w:
            continue
        block = tuple(block)
        if len(block) >= L:
            out[block[:L]] += w
            continue
        for tail, pt in target_joint_law(T, V, L - len(block), tuple(prefix) + block).items():
            out[block + tail] += w * pt
    return dict(sorted(out.items()))


def chain_joint_law(
    target: Conditional,
    draft: Conditional,
    V: int,
    L: int,
    k: int,
    rule: str | Callable[[Prefix], Mapping[tuple[int, ...], Any]] = "token",
    branches: int = 1,
    prefix: Prefix = (),
    proposal: Conditional | None = None,
) -> SeqLaw:
    """Law of the first ``L`` outcomes emitted by successive speculative rounds of lookahead k.

    ``rule`` is a rule name (see :func:`round_law`; ``branches`` draft branches per round) or a
    function ``prefix -> law of the block one round emits`` (e.g. one built on
    :func:`~speculate.testing.exact.kernel_round_law`, to chain a real kernel; ``branches`` is
    then ignored).

    >>> F = Fraction
    >>> T = lambda s: [F(1, 3), F(2, 3)] if s[-1:] == (0,) else [F(1, 2), F(1, 2)]
    >>> D = lambda s: [F(1, 2), F(1, 2)]
    >>> for rule in ("token", "block"):
    ...     assert chain_joint_law(T, D, V=2, L=3, k=2, rule=rule) == target_joint_law(T, V=2, L=3)
    """
    check_V(V)
    check_count(L, "L")
    T, D = Cond(target, V, "target"), Cond(draft, V, "draft")
    Q = None if proposal is None else Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    if callable(rule):
        round_fn = rule
    else:

        def round_fn(s: Prefix) -> SeqLaw:
            return round_law(T, D, V, k, rule, branches, s, Q)

    cache: dict[Prefix, dict[tuple[int, ...], Fraction]] = {}
    laws: SeqLaw = {(): ONE}
    done: SeqLaw = defaultdict(Fraction)
    while laws:
        new: SeqLaw = defaultdict(Fraction)
        for seq, w in laws.items():
            if len(seq) >= L:
                done[seq[:L]] += w
                continue
            blocks = cache.get(seq)
            if blocks is None:
                blocks = _check_block_law(round_fn(prefix + seq), V, prefix + seq)
                cache[seq] = blocks
            for b, pb in blocks.items():
                new[seq + b] += w * pb
        laws = new
    return dict(sorted(done.items()))


def _check_block_law(law: Mapping[Any, Any], V: int, where: Prefix) -> dict:
    out = {}
    for b, w in law.items():
        b = tuple(int(x) for x in b)
        if not b:
            raise ValueError(f"a round after {where} emitted an empty block (no progress)")
        if any(not 0 <= x < V for x in b):
            raise ValueError(f"a round after {where} emitted {b}, outside range(V = {V})")
        out[b] = to_fraction(w, f"round law[{b}]")
    total = sum(out.values(), ZERO)
    if total != 1:
        raise ValueError(f"the round law after {where} sums to {total}, not 1")
    return out


def expected_outcomes(
    target: Conditional,
    draft: Conditional,
    V: int,
    k: int,
    rule: str = "token",
    branches: int = 1,
    prefix: Prefix = (),
) -> Fraction:
    """Expected number of outcomes one round emits after ``prefix`` (accepted + 1).

    >>> F = Fraction
    >>> T, D = (lambda s: [F(1, 2), F(1, 2)]), (lambda s: [F(3, 4), F(1, 4)])
    >>> expected_outcomes(T, D, V=2, k=2)  # alpha = 3/4: 1 + a + a^2
    Fraction(37, 16)
    """
    law = round_law(target, draft, V, k, rule, branches, prefix)
    return sum((len(b) * w for b, w in law.items()), ZERO)


# --------------------------------------------------------------------------- token trees


def check_parent(parent: Sequence[int]) -> list[int]:
    """A tree shape as a list: ``parent[0] = -1`` (the root) and ``0 <= parent[i] < i``.

    >>> check_parent([-1, 0, 0, 1])
    [-1, 0, 0, 1]
    >>> check_parent([-1, 2, 0])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: malformed tree: parent[1] = 2, but every node i >= 1 needs 0 <= parent[i] < i ...
    """
    out = [int(a) for a in parent]
    if not out or out[0] != -1:
        raise ValueError(f"parent[0] must be -1 (node 0 is the root), got {parent!r}")
    for i, a in enumerate(out[1:], start=1):
        if not 0 <= a < i:
            raise ValueError(
                f"malformed tree: parent[{i}] = {a}, but every node i >= 1 needs 0 <= parent[i] < i "
                "(a parent comes before its children: no cycles)"
            )
    return out


def tree_drafts(
    draft: Conditional,
    V: int,
    parent: Sequence[int],
    prefix: Prefix = (),
    replacement: bool = True,
) -> list[tuple[tuple[int, ...], tuple[bool, ...], Fraction]]:
    """Every way the draft can fill a tree, with its probability: ``(tokens, valid, probability)``.

    Node i's outcome is drawn from ``draft`` at its parent's context (``prefix`` + the outcomes on
    the path root -> parent): i.i.d. across siblings (``replacement=True``), or without replacement
    (each child from the draft with its earlier siblings' outcomes removed, renormalised; a child
    for which no mass is left is not drafted, nor its subtree: ``valid`` False). ``tokens[0]`` is 0.

    >>> F = Fraction
    >>> D = lambda s: [F(1, 2), F(1, 2)]
    >>> [(t, w) for t, _, w in tree_drafts(D, 2, [-1, 0, 0], replacement=False)]
    [((0, 0, 1), Fraction(1, 2)), ((0, 1, 0), Fraction(1, 2))]
    """
    check_V(V)
    par = check_parent(parent)
    Q = Cond(draft, V, "draft")
    N1 = len(par)
    out = []

    def fill(i: int, tokens: list[int], valid: list[bool], w: Fraction) -> None:
        if i == N1:
            out.append((tuple(tokens), tuple(valid), w))
            return
        a = par[i]
        if not valid[a]:
            fill(i + 1, [*tokens, 0], [*valid, False], w)
            return
        q = Q(_context(par, tokens, a, prefix))
        if replacement:
            for x, qx in enumerate(q):
                if qx:
                    fill(i + 1, [*tokens, x], [*valid, True], w * qx)
            return
        used = {tokens[c] for c in range(1, i) if par[c] == a and valid[c]}
        left = ONE - sum((q[x] for x in used), ZERO)
        if left == 0:
            fill(i + 1, [*tokens, 0], [*valid, False], w)
            return
        for x, qx in enumerate(q):
            if qx and x not in used:
                fill(i + 1, [*tokens, x], [*valid, True], w * qx / left)

    fill(1, [0], [True], ONE)
    return out


def _context(par: list[int], tokens: Sequence[int], node: int, prefix: Prefix) -> Prefix:
    """``prefix`` followed by the outcomes on the path root -> node."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = par[node]
    return tuple(prefix) + tuple(reversed(path))


def tree_walk(
    target: Conditional,
    draft: Conditional,
    V: int,
    parent: Sequence[int],
    tokens: Sequence[int],
    valid: Sequence[bool] | None = None,
    prefix: Prefix = (),
    replacement: bool = True,
    rule: str = "token",
) -> dict[tuple[int, ...], Fraction]:
    """Law of what the tree rule emits for ONE drafted tree, over the verifier's randomness:
    ``{(n_accepted, next_outcome, last accepted node or 0): probability}`` (the mathematics of
    ``speculate.verify.verify_tree``; ``rule="greedy"``: of ``verify_tree_greedy``).

    The live nodes start as {root}; their valid children in increasing index are the candidates,
    tried against the current residual r (r = target at the live context): candidate c with
    outcome x is kept with probability min(1, r(x) / q_c(x)), q_c the draft at the live context
    (with the siblings rejected so far removed and renormalised when ``replacement=False``); on
    rejection r <- norm((r - q_c)_+). A kept candidate's outcome extends the path and the live
    nodes become the candidates carrying it; when all are rejected the next outcome is drawn from
    r, and when the live nodes have no children, from the target (the bonus).

    >>> F = Fraction
    >>> T, D = (lambda s: [F(1, 2), F(1, 2)]), (lambda s: [F(3, 4), F(1, 4)])
    >>> tree_walk(T, D, 2, [-1, 0, 0], [0, 0, 1]) == {
    ...     (1, 0, 1): F(1, 3), (1, 1, 1): F(1, 3), (1, 0, 2): F(1, 6), (1, 1, 2): F(1, 6)}
    True
    """
    check_V(V)
    par = check_parent(parent)
    T, D = Cond(target, V, "target"), Cond(draft, V, "draft")
    N1 = len(par)
    ok = [True] * N1 if valid is None else [bool(v) for v in valid]
    tok = [int(t) for t in tokens]
    if len(tok) != N1 or len(ok) != N1:
        raise ValueError(f"tokens and valid must have N+1 = {N1} entries like parent")
    out: dict[tuple[int, ...], Fraction] = defaultdict(Fraction)

    def walk(live: list[int], acc: Prefix, w: Fraction) -> None:
        ctx = tuple(prefix) + acc
        p = T(ctx)
        cands = [c for c in range(1, N1) if ok[c] and par[c] in live]
        last = live[0]
        if rule == "greedy":
            best = _argmax(p)
            for c in cands:
                if tok[c] == best:
                    walk([d for d in cands if tok[d] == best], (*acc, best), w)
                    return
            out[(len(acc), best, _last(acc, last))] += w
            return
        cur = p
        if cands:
            q = D(ctx)
            removed: set[int] = set()
            for c in cands:
                x = tok[c]
                qc = q
                if not replacement:
                    if x in removed:
                        raise ValueError(f"node {c} repeats outcome {x} of an earlier sibling (without replacement)")
                    left = ONE - sum((q[y] for y in removed), ZERO)
                    qc = [ZERO if y in removed else q[y] / left for y in range(V)]
                if qc[x] == 0:
                    raise ValueError(f"node {c}: outcome {x} has draft probability 0 after {ctx}")
                a = min(ONE, cur[x] / qc[x])
                if a:
                    walk([d for d in cands if tok[d] == x], (*acc, x), w * a)
                w *= 1 - a
                if w == 0:
                    return
                cur = residual(cur, qc)
                removed.add(x)
        for y, py in enumerate(cur):
            if py:
                out[(len(acc), y, _last(acc, last))] += w * py

    walk([0], (), ONE)
    return dict(sorted(out.items()))


def _last(acc: Prefix, node: int) -> int:
    return node if acc else 0


def tree_round_law(
    target: Conditional,
    draft: Conditional,
    V: int,
    parent: Sequence[int],
    prefix: Prefix = (),
    replacement: bool = True,
    rule: str = "token",
    verify_replacement: bool | None = None,
) -> SeqLaw:
    """Law of the block one round of token-tree verification emits after ``prefix``: every
    drafted tree (:func:`tree_drafts`) weighed by the law of the walk (:func:`tree_walk`); the
    block is the accepted path's outcomes followed by the next outcome.

    ``parent`` is the tree shape (``parent[0] = -1``, ``0 <= parent[i] < i``); ``replacement``:
    children drafted i.i.d. (SpecInfer) or without replacement; ``rule``: ``"token"`` (recursive
    rejection) or ``"greedy"``. ``verify_replacement`` (default ``replacement``) is what the
    verifier assumes; setting it differently models the bug of verifying distinct siblings as if
    they were i.i.d. Chain it with ``chain_joint_law(..., rule=lambda s: tree_round_law(..., prefix=s))``.

    >>> F = Fraction
    >>> T = lambda s: [F(1, 3), F(2, 3)] if s[-1:] == (0,) else [F(1, 2), F(1, 2)]
    >>> D = lambda s: [F(3, 4), F(1, 4)]
    >>> for shape in ([-1, 0, 0], [-1, 0, 0, 1, 2], [-1, 0, 1]):
    ...     for repl in (True, False):
    ...         law = chain_joint_law(T, D, V=2, L=3, k=0,
    ...                               rule=lambda s: tree_round_law(T, D, 2, shape, s, repl))
    ...         assert law == target_joint_law(T, V=2, L=3)
    """
    check_V(V)
    if rule not in ("token", "greedy"):
        raise ValueError(f"tree verification takes rule='token' (recursive rejection) or 'greedy', got {rule!r}")
    par = check_parent(parent)
    vr = replacement if verify_replacement is None else verify_replacement
    T, D = Cond(target, V, "target"), Cond(draft, V, "draft")
    out: SeqLaw = defaultdict(Fraction)
    for tokens, valid, w in tree_drafts(D, V, par, prefix, replacement):
        for (n, y, last), pw in tree_walk(T, D, V, par, tokens, valid, prefix, vr, rule).items():
            out[(*_context(par, tokens, last, ())[:n], y)] += w * pw
    return dict(sorted(out.items()))
