"""Exact mode: the output law of every verification rule, in rational arithmetic.

Everything here is pure Python on :class:`fractions.Fraction`; nothing depends on the kernels.
Two kinds of functions live here:

* the MATHEMATICS of each rule (``speculative_law``, ``round_law``, ``chain_joint_law``, ...),
  computed exactly from distributions given as Fractions;
* the law of an ACTUAL kernel (``kernel_law``, ``kernel_round_law``): the kernel is called on
  every piece of its uniforms' space (enumerated between the rule's rational breakpoints) and
  must be constant on each piece, so a kernel with a wrong threshold or index is caught.

Chains are given as functions ``prefix -> probabilities`` over ``V`` outcomes, where the prefix
is the tuple of outcomes emitted so far; they may depend on the whole prefix and contain zeros.

>>> from fractions import Fraction as F
>>> p, q = [F(3, 4), F(1, 4)], [F(1, 4), F(3, 4)]
>>> speculative_law(p, q) == p
True
>>> acceptance(p, q)
Fraction(1, 2)
"""

from __future__ import annotations

import itertools
import numbers
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

Prefix = tuple[int, ...]
Conditional = Callable[[Prefix], Sequence[Any]]  # prefix -> probabilities over V outcomes
SeqLaw = dict[tuple[int, ...], Fraction]  # law over finite sequences of outcomes
RULES = ("token", "block", "greedy", "multi")

__all__ = [
    "RULES",
    "acceptance",
    "as_law",
    "assert_exact_law",
    "block_quantities",
    "chain_joint_law",
    "expected_outcomes",
    "extend_with_target",
    "greedy",
    "kernel_law",
    "kernel_laws",
    "kernel_round_law",
    "residual",
    "round_law",
    "speculative_law",
    "target_joint_law",
    "to_fractions",
    "total_variation",
]

ONE = Fraction(1)
ZERO = Fraction(0)


# --------------------------------------------------------------------------- conversions


def _to_fraction(v: Any, where: str) -> Fraction:
    if hasattr(v, "item") and not isinstance(v, (Fraction, numbers.Number)):
        v = v.item()  # torch / numpy 0-d
    if isinstance(v, bool):
        raise TypeError(f"{where} is a bool ({v}); expected a number")
    if isinstance(v, Fraction):
        return v
    if isinstance(v, numbers.Integral):
        return Fraction(int(v))
    if isinstance(v, numbers.Real):
        fv = float(v)
        if fv != fv or fv in (float("inf"), float("-inf")):
            raise ValueError(f"{where} = {fv} is not finite")
        return Fraction(fv)  # exact: every float is a dyadic rational
    if isinstance(v, str):
        return Fraction(v)
    raise TypeError(f"{where} has type {type(v).__name__}; expected a real number")


def to_fractions(probs: Sequence[Any], max_denominator: int | None = None, normalize: bool = False) -> list[Fraction]:
    """Convert a 1-D sequence of probabilities to Fractions, exactly.

    Floats are converted exactly (every float is a dyadic rational); ``max_denominator`` instead
    rounds each value to the nearest fraction with at most that denominator. ``normalize``
    divides by the exact sum. Negative, NaN or infinite values raise ``ValueError``.

    >>> to_fractions([0.25, 0.75])
    [Fraction(1, 4), Fraction(3, 4)]
    >>> to_fractions([0.1, 0.9], max_denominator=100)
    [Fraction(1, 10), Fraction(9, 10)]
    >>> to_fractions([1, 2, 1], normalize=True)
    [Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)]
    """
    if isinstance(probs, (str, bytes)) or not hasattr(probs, "__iter__"):
        raise TypeError(f"probs must be a 1-D sequence, got {type(probs).__name__}")
    out = []
    for i, v in enumerate(probs):
        if isinstance(v, (list, tuple)) or (hasattr(v, "ndim") and getattr(v, "ndim", 0) > 0):
            raise ValueError(f"probs must be 1-D; element {i} is itself a sequence")
        f = _to_fraction(v, f"probs[{i}]")
        if max_denominator is not None:
            f = f.limit_denominator(max_denominator)
        if f < 0:
            raise ValueError(f"probs[{i}] = {v} is negative")
        out.append(f)
    if normalize:
        total = sum(out, ZERO)
        if total == 0:
            raise ValueError("cannot normalize: all probabilities are zero")
        out = [f / total for f in out]
    return out


def as_law(probs: Sequence[Any], V: int | None = None, name: str = "law") -> list[Fraction]:
    """Validate a probability vector: exact Fractions, non-negative, summing exactly to 1.

    >>> as_law([Fraction(1, 3), Fraction(2, 3)])
    [Fraction(1, 3), Fraction(2, 3)]
    >>> as_law([0.1, 0.2, 0.7])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: law sums to 1 - 2.78e-17, not exactly 1; pass Fractions or use to_fractions(...)
    """
    try:
        law = to_fractions(probs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{name}: {e}") from None
    if V is not None and len(law) != V:
        raise ValueError(f"{name} has {len(law)} outcomes, expected V = {V}")
    if not law:
        raise ValueError(f"{name} is empty")
    total = sum(law, ZERO)
    if total != 1:
        diff = total - 1
        raise ValueError(
            f"{name} sums to 1 {'+' if diff > 0 else '-'} {float(abs(diff)):.3g}, not exactly 1; "
            "pass Fractions or use to_fractions(..., normalize=True)"
        )
    return law


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
    s = _to_fraction(scale, "scale")
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
        return {k: _to_fraction(v, f"{name}[{k!r}]") for k, v in law.items()}
    return {i: _to_fraction(v, f"{name}[{i}]") for i, v in enumerate(law)}


def _pair(p: Sequence[Any], q: Sequence[Any]) -> tuple[list[Fraction], list[Fraction]]:
    p, q = as_law(p, name="p"), as_law(q, name="q")
    if len(p) != len(q):
        raise ValueError(f"p has {len(p)} outcomes but q has {len(q)}")
    return p, q


# --------------------------------------------------------------------------- chains


class _Cond:
    """A conditional law prefix -> validated list of Fractions, cached."""

    def __init__(self, fn: Conditional, V: int, name: str):
        if isinstance(fn, _Cond):
            fn = fn.fn
        if not callable(fn):
            raise TypeError(f"{name} must be a function prefix -> probabilities")
        self.fn, self.V, self.name = fn, V, name
        self.cache: dict[Prefix, list[Fraction]] = {}

    def __call__(self, prefix: Prefix) -> list[Fraction]:
        law = self.cache.get(prefix)
        if law is None:
            law = as_law(self.fn(prefix), self.V, name=f"{self.name}({prefix})")
            self.cache[prefix] = law
        return law


def _check_V(V: int) -> None:
    if not isinstance(V, numbers.Integral) or V < 1:
        raise ValueError(f"V must be a positive integer, got {V!r}")


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
    _check_V(V)
    T = _Cond(target, V, "target")
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


def _sequences(cond: _Cond, V: int, k: int, prefix: Prefix) -> list[tuple[Prefix, Fraction]]:
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


def _stopped(cond, V, k, prefix, stop) -> list[tuple[Prefix, Fraction]]:
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


def _argmax(law: Sequence[Fraction]) -> int:
    return max(range(len(law)), key=lambda i: (law[i], -i))


def round_law(
    target: Conditional,
    draft: Conditional,
    V: int,
    k: int,
    rule: str = "token",
    m: int = 1,
    prefix: Prefix = (),
    proposal: Conditional | None = None,
) -> SeqLaw:
    """Law of the block one speculative round emits after ``prefix`` (the mathematics).

    The draft proposes ``k`` outcomes (``m`` i.i.d. branches for ``rule="multi"``), the rule
    keeps a prefix of them and draws one more outcome (residual or bonus). Rules: ``"token"``
    (Leviathan/Chen), ``"block"`` (Sun et al.), ``"greedy"`` (keep while the draft equals the
    target's argmax; the next outcome is the argmax), ``"multi"`` (SpecInfer recursive rejection:
    at each depth the branches whose drafts match the kept prefix are tried in index order, the
    target replaced by norm((p - q)_+) after each rejection). ``proposal`` is the law the drafts
    are really sampled from (default: ``draft``); setting it differently models bugs where the
    verifier is told the wrong q.

    >>> F = Fraction
    >>> T = lambda s: [F(1, 2), F(1, 2)]
    >>> D = lambda s: [F(3, 4), F(1, 4)]
    >>> law = round_law(T, D, V=2, k=1)
    >>> law[(0, 0)], law[(1,)]
    (Fraction(1, 4), Fraction(1, 4))
    """
    _check_V(V)
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    if not isinstance(k, numbers.Integral) or k < 0:
        raise ValueError(f"lookahead k must be a non-negative integer, got {k!r}")
    if not isinstance(m, numbers.Integral) or m < 1 or (m > 1 and rule != "multi"):
        raise ValueError(f"m = {m!r}: m must be a positive integer, and m > 1 needs rule='multi'")
    T, D = _Cond(target, V, "target"), _Cond(draft, V, "draft")
    Q = D if proposal is None else _Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    out: SeqLaw = defaultdict(Fraction)
    if rule == "token":
        _token_round(T, D, Q, k, prefix, (), ONE, out)
    elif rule == "greedy":
        _greedy_round(T, Q, k, prefix, (), ONE, out)
    elif rule == "block":
        _block_round(T, D, Q, V, k, prefix, out)
    else:
        _multi_round(T, D, Q, V, k, m, prefix, out)
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


def _block_round(T, D, Q, V, k, prefix, out) -> None:
    for xs, w in _sequences(Q, V, k, prefix):
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


def _multi_round(T, D, Q, V, k, m, prefix, out) -> None:
    seqs = _sequences(Q, V, k, prefix)
    for config in itertools.product(seqs, repeat=m):
        branches = [c[0] for c in config]
        w = ONE
        for c in config:
            w *= c[1]
        _multi_depth(T, D, k, prefix, branches, (), w, out)


def _multi_depth(T, D, k, prefix, branches, acc, w, out) -> None:
    s = prefix + acc
    cur = T(s)
    depth = len(acc)
    if depth < k:
        q = D(s)
        for br in branches:
            if br[:depth] != acc:
                continue
            x = br[depth]
            a = min(ONE, cur[x] / q[x])
            if a:
                _multi_depth(T, D, k, prefix, branches, (*acc, x), w * a, out)
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
    T = _Cond(target, V, "target")
    out: SeqLaw = defaultdict(Fraction)
    for block, w in law.items():
        w = _to_fraction(w, f"law[{block!r}]")
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
    m: int = 1,
    prefix: Prefix = (),
    proposal: Conditional | None = None,
) -> SeqLaw:
    """Law of the first ``L`` outcomes emitted by successive speculative rounds of lookahead k.

    ``rule`` is a rule name (see :func:`round_law`) or a function ``prefix -> law of the block
    one round emits`` (e.g. one built on :func:`kernel_round_law`, to chain a real kernel).

    >>> F = Fraction
    >>> T = lambda s: [F(1, 3), F(2, 3)] if s[-1:] == (0,) else [F(1, 2), F(1, 2)]
    >>> D = lambda s: [F(1, 2), F(1, 2)]
    >>> for rule in ("token", "block"):
    ...     assert chain_joint_law(T, D, V=2, L=3, k=2, rule=rule) == target_joint_law(T, V=2, L=3)
    """
    _check_V(V)
    if not isinstance(L, numbers.Integral) or L < 0:
        raise ValueError(f"L must be a non-negative integer, got {L!r}")
    T, D = _Cond(target, V, "target"), _Cond(draft, V, "draft")
    Q = None if proposal is None else _Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    if callable(rule):
        round_fn = rule
    else:

        def round_fn(s: Prefix) -> SeqLaw:
            return round_law(T, D, V, k, rule, m, s, Q)

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
        out[b] = _to_fraction(w, f"round law[{b}]")
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
    m: int = 1,
    prefix: Prefix = (),
) -> Fraction:
    """Expected number of outcomes one round emits after ``prefix`` (accepted + 1).

    >>> F = Fraction
    >>> T, D = (lambda s: [F(1, 2), F(1, 2)]), (lambda s: [F(3, 4), F(1, 4)])
    >>> expected_outcomes(T, D, V=2, k=2)  # alpha = 3/4: 1 + a + a^2
    Fraction(37, 16)
    """
    law = round_law(target, draft, V, k, rule, m, prefix)
    return sum((len(b) * w for b, w in law.items()), ZERO)


# --------------------------------------------------------------------------- kernels

_EPS = 1e-9  # how far inside a piece's ends the kernel is probed


def _pieces(breakpoints: set[Fraction]) -> list[tuple[Fraction, Fraction]]:
    pts = sorted({ZERO, ONE} | {b for b in breakpoints if 0 < b < 1})
    return [(a, b) for a, b in itertools.pairwise(pts)]


def _cdf_breaks(w: Sequence[Fraction]) -> set[Fraction]:
    total = sum(w, ZERO)
    if total == 0:
        return set()
    return set(itertools.accumulate(x / total for x in w))


def _exact_rows(a: Any, name: str, dtype: Any = np.float64) -> list:
    """Nested sequences -> nested lists of Fractions equal to the values the kernel will see."""
    arr = np.asarray(a, dtype=object)
    ftype = np.dtype(dtype).type
    mant = np.finfo(dtype).nmant + 1
    flat = []
    for v in arr.reshape(-1):
        f = _to_fraction(v, name)
        d = f.denominator
        if not (d & (d - 1) == 0 and abs(f.numerator) < 2**mant and d < 2**120):
            f = Fraction(float(ftype(float(f))))  # round as the kernel's array will
        flat.append(f)
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _case_coords(rule, p, q, drafts, n) -> list[set[Fraction]]:
    """Breakpoints of every uniform the kernel may read, for one row (union over all paths)."""
    if rule == "greedy":
        return []
    if rule in ("token", "block"):
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
    # multi: p [m][K+1][V], q [m][K][V], drafts [m][K]; u_accept [K][m] then u_next
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


def _kernel_case_laws(kernel, rule, cases, dtype, chunk: int = 1 << 16) -> list[dict]:
    """Exact output laws of ``kernel`` for each case (p, q, drafts, n): one dict per case."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    # 1. enumerate cells and evaluation points
    rows_u: list[np.ndarray] = []  # per case: [cells * evals, n_coords]
    meta = []
    for ci, (p, q, drafts, n) in enumerate(cases):
        coords = _case_coords(rule, p, q, drafts, n)
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
    arrays = _case_arrays(rule, cases, dtype)
    for start in range(0, len(case_of_row), chunk):
        sel = case_of_row[start : start + chunk]
        u = U[start : start + chunk]
        outs.append(_call_kernel(kernel, rule, arrays, sel, u))
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
        V = len(p[0]) if rule != "multi" else len(p[0][0])
        for cell, res in zip(idx, block[:, 0, :].tolist(), strict=True):
            w = ONE
            for c, j in enumerate(cell):
                w *= lengths[c][j]
            key = tuple(int(v) for v in res)
            _check_output(key, rule, n, V, len(drafts), ci)
            law[key] += w
        laws.append(dict(sorted(law.items())))
    return laws


def _check_output(key, rule, n, V, m, ci) -> None:
    if not 0 <= key[0] <= n:
        raise AssertionError(f"case {ci}: kernel returned n_accepted = {key[0]} outside [0, {n}]")
    if not 0 <= key[1] < V:
        raise AssertionError(f"case {ci}: kernel returned next outcome {key[1]} outside [0, {V})")
    if rule == "multi" and not 0 <= key[2] < m:
        raise AssertionError(f"case {ci}: kernel returned branch {key[2]} outside [0, {m})")


def _case_arrays(rule, cases, dtype):
    N = len(cases)
    d0 = cases[0][2]
    m, K = (len(d0), len(d0[0])) if rule == "multi" else (1, len(d0))
    V = len(cases[0][0][0][0]) if rule == "multi" else len(cases[0][0][0])
    lead = (N, m) if rule == "multi" else (N,)

    def stack(which: int, rows: int) -> np.ndarray:
        flat = [float(x) for c in cases for row in _rows(c[which], rule) for x in row]
        return np.array(flat, dtype=dtype).reshape(*lead, rows, V)

    p = stack(0, K + 1)  # [N, K+1, V] or [N, m, K+1, V]
    drafts = np.array([c[2] for c in cases], dtype=np.int64).reshape(*lead, K)  # [N(, m), K]
    lengths = np.array([[c[3]] * m for c in cases], dtype=np.int64).reshape(lead)  # [N(, m)]
    q = None if rule == "greedy" else stack(1, K)  # [N(, m), K, V]
    return p, q, drafts, lengths


def _rows(a, rule):
    return [row for br in a for row in br] if rule == "multi" else a


def _call_kernel(kernel, rule, arrays, sel, u):
    p, q, drafts, lengths = arrays
    p, drafts, lengths = p[sel], drafts[sel], lengths[sel]
    if rule == "greedy":
        n_acc, nxt = kernel(p, drafts, lengths)
        return np.stack([np.asarray(n_acc), np.asarray(nxt)], axis=1)
    q = q[sel]
    if rule == "multi":
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
    have the same K, V (and m). Returns one law per case, in order.

    >>> from speculate.verify import verify_token
    >>> case = ([[0.5, 0.5], [0.5, 0.5]], [[0.75, 0.25]], [0])
    >>> kernel_laws(verify_token, [case, case])[1] == kernel_law(verify_token, *case)
    True
    """
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    prepared = []
    shapes = set()
    for ci, case in enumerate(cases):
        if len(case) not in (3, 4):
            raise ValueError(f"case {ci} must be (p, q, drafts) or (p, q, drafts, length)")
        p, q, drafts = case[:3]
        length = case[3] if len(case) == 4 else None
        p = _exact_rows(p, f"case {ci}: p", dtype)
        d = np.asarray(drafts, dtype=np.int64)
        V = len(p[0][0]) if rule == "multi" else len(p[0])
        K = d.shape[-1]
        shape = (np.asarray(p, dtype=object).shape, d.shape)
        shapes.add(shape)
        if len(shapes) > 1:
            raise ValueError(f"case {ci} has shapes {shape}, unlike the first case's")
        if rule == "multi" and np.asarray(p, dtype=object).shape[:2] != (d.shape[0], K + 1):
            raise ValueError(f"case {ci}: p must be [m][K+1][V] for drafts [m][K] = {d.shape}")
        if rule != "multi" and len(p) != K + 1:
            raise ValueError(f"case {ci}: p must have K + 1 = {K + 1} rows, got {len(p)}")
        if rule == "greedy":
            q = [[ZERO] * V for _ in range(K)]
        else:
            q = _exact_rows(q, f"case {ci}: q", dtype)
        n = K if length is None else int(length)
        if not 0 <= n <= K:
            raise ValueError(f"case {ci}: length {n} outside [0, K = {K}]")
        if ((d < 0) | (d >= V)).any():
            raise ValueError(f"case {ci}: drafts {d.tolist()} outside range(V = {V})")
        prepared.append((p, q, d.tolist(), n))
    if not prepared:
        return []
    return _dedup_laws(kernel, rule, prepared, dtype)


def _dedup_laws(kernel, rule, cases, dtype) -> list[dict]:
    """_kernel_case_laws on the distinct cases only."""
    index: dict = {}
    keys = []
    for p, q, d, n in cases:
        key = (repr(p), repr(q), repr(d), n)
        keys.append(index.setdefault(key, len(index)))
    distinct = [None] * len(index)
    for case, i in zip(cases, keys, strict=True):
        distinct[i] = case
    laws = _kernel_case_laws(kernel, rule, distinct, dtype)
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

    ``p`` is ``[K+1][V]`` (``[m][K+1][V]`` for ``rule="multi"``), ``q`` is ``[K][V]``
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


def kernel_round_law(
    kernel: Callable[..., Any],
    target: Conditional,
    draft: Conditional,
    V: int,
    k: int,
    rule: str = "token",
    m: int = 1,
    prefix: Prefix = (),
    length: int | None = None,
    proposal: Conditional | None = None,
    dtype: Any = np.float64,
    stop: Callable[[Prefix], bool] | None = None,
) -> SeqLaw:
    """Exact law of the block one round emits when ``kernel`` does the verification.

    Enumerates every draft (``m`` i.i.d. branches for ``rule="multi"``) of ``length`` outcomes
    (default ``k``; positions past it are filled with a decoy the kernel must ignore), builds the
    kernel's ``p``/``q`` arrays from the chains, and weighs :func:`kernel_law` by the drafts'
    probabilities. ``proposal``: the law the drafts are really drawn from (default ``draft``).
    ``stop(prefix + drafts so far)``: the draft stops early when it returns True (a stopping time,
    as a confidence-based draft length; not for ``"multi"``).
    Compare with :func:`round_law`, or chain it: ``chain_joint_law(..., rule=lambda s:
    kernel_round_law(kernel, T, D, V, k, prefix=s))``.

    >>> from speculate.verify import verify_block
    >>> T = lambda s: [Fraction(1, 2), Fraction(1, 2)]
    >>> D = lambda s: [Fraction(3, 4), Fraction(1, 4)]
    >>> law = kernel_round_law(verify_block, T, D, V=2, k=2, rule="block")
    >>> law == round_law(T, D, V=2, k=2, rule="block")
    True
    """
    _check_V(V)
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    if not isinstance(m, numbers.Integral) or m < 1 or (m > 1 and rule != "multi"):
        raise ValueError(f"m = {m!r}: m must be a positive integer, and m > 1 needs rule='multi'")
    n = k if length is None else int(length)
    if not 0 <= n <= k:
        raise ValueError(f"length {n} outside [0, k = {k}]")
    T, D = _Cond(target, V, "target"), _Cond(draft, V, "draft")
    Q = D if proposal is None else _Cond(proposal, V, "proposal")
    prefix = tuple(prefix)
    decoy_p = [ZERO] * (V - 1) + [ONE]  # a kernel reading past `length` accepts the decoy
    decoy_q = [Fraction(1, V)] * V
    if stop is not None and rule == "multi":
        raise ValueError("stop= (ragged branch lengths) is not supported for rule='multi'")
    seqs = _sequences(Q, V, n, prefix) if stop is None else _stopped(Q, V, n, prefix, stop)
    configs = list(itertools.product(seqs, repeat=m)) if rule == "multi" else [(s,) for s in seqs]
    cases, weights, branches_of = [], [], []
    for config in configs:
        w = ONE
        ps, qs, ds = [], [], []
        for xs, wx in config:
            n = len(xs)
            w *= wx
            ps.append([T(prefix + xs[:i]) for i in range(n + 1)] + [decoy_p] * (k - n))
            qs.append([D(prefix + xs[:i]) for i in range(n)] + [decoy_q] * (k - n))
            ds.append(list(xs) + [V - 1] * (k - n))
        if rule == "multi":
            cases.append((_exact_rows(ps, "p", dtype), _exact_rows(qs, "q", dtype), ds, n))
        else:
            cases.append((_exact_rows(ps[0], "p", dtype), _exact_rows(qs[0], "q", dtype), ds[0], n))
        weights.append(w)
        branches_of.append([c[0] for c in config])
    laws = _dedup_laws(kernel, rule, cases, dtype)
    out: SeqLaw = defaultdict(Fraction)
    for w, branches, law in zip(weights, branches_of, laws, strict=True):
        for key, pw in law.items():
            br = branches[key[2]] if rule == "multi" else branches[0]
            out[(*br[: key[0]], key[1])] += w * pw
    return dict(sorted(out.items()))
