"""The exact laws of the verification rules: the mathematics, on :class:`fractions.Fraction`.

One step: :func:`acceptance`, :func:`total_variation`, :func:`residual`, :func:`speculative_law`.
One round after a prefix: :func:`round_law` for every rule of ``speculate.verify.RULES`` (token,
block, greedy; the token rule with ``branches > 1`` is multi-draft recursive rejection), with
:func:`block_quantities` for the block rule and :func:`expected_outcomes`. Chains of rounds:
:func:`chain_joint_law`, compared with :func:`target_joint_law`, directly or through
:func:`extend_with_target` (Theorem 5's criterion). :func:`assert_exact_law` compares two laws
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
