"""What the rules' laws (``rules.py``) and the kernels' laws (``kernels.py``) share: the exact
conversion of numbers to :class:`fractions.Fraction`, the validation of laws, the cached
conditional law, and one function per argument check (the alphabet size V, the lookahead k, the
rule name, the number of draft branches, the number of valid drafts), so no check is written twice.

>>> check_branches(2, "token")
>>> check_branches(2, "block")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: branches = 2: ... branches > 1 (multi-draft) needs rule='token', got rule='block'
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from ...verify import RULES

Prefix = tuple[int, ...]
Conditional = Callable[[Prefix], Sequence[Any]]  # prefix -> probabilities over V outcomes
SeqLaw = dict[tuple[int, ...], Fraction]  # law over finite sequences of outcomes

ONE = Fraction(1)
ZERO = Fraction(0)


# --------------------------------------------------------------------------- conversions


def to_fraction(v: Any, where: str) -> Fraction:
    """One real number as a Fraction, exactly (``where`` names it in errors).

    >>> to_fraction(0.5, "x"), to_fraction("1/3", "x")
    (Fraction(1, 2), Fraction(1, 3))
    """
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
        f = to_fraction(v, f"probs[{i}]")
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


class Cond:
    """A conditional law prefix -> validated list of Fractions, cached.

    >>> T = Cond(lambda prefix: [0.5, 0.5], V=2, name="target")
    >>> T((0, 1))
    [Fraction(1, 2), Fraction(1, 2)]
    """

    def __init__(self, fn: Conditional, V: int, name: str):
        if isinstance(fn, Cond):
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


# --------------------------------------------------------------------------- argument checks


def check_V(V: int) -> None:
    """The number of outcomes V: a positive integer."""
    if not isinstance(V, numbers.Integral) or V < 1:
        raise ValueError(f"V must be a positive integer, got {V!r}")


def check_count(value: int, name: str) -> None:
    """A non-negative integer (the lookahead k, a law's length L)."""
    if not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def check_k(k: int) -> None:
    """The lookahead k: the number of drafted outcomes per round, a non-negative integer."""
    check_count(k, "lookahead k")


def check_rule(rule: str) -> None:
    """A rule name of ``speculate.verify.RULES``.

    >>> check_rule("multi")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown rule 'multi'; expected one of ('token', 'block', 'greedy') (multi-draft is ...)
    """
    if rule not in RULES:
        raise ValueError(
            f"unknown rule {rule!r}; expected one of {RULES} (multi-draft is rule='token' with branches > 1)"
        )


def check_branches(branches: int, rule: str) -> None:
    """The number of draft branches: a positive integer, more than one only with the token rule."""
    if (
        isinstance(branches, bool)
        or not isinstance(branches, numbers.Integral)
        or branches < 1
        or (branches > 1 and rule != "token")
    ):
        raise ValueError(
            f"branches = {branches!r}: branches must be a positive integer, and branches > 1 "
            f"(multi-draft) needs rule='token', got rule={rule!r}"
        )


def check_length(length: int | None, k: int, where: str = "") -> int:
    """The number of valid drafts (default k), in 0..k; returned as an int.

    >>> check_length(None, 3), check_length(1, 3)
    (3, 1)
    """
    n = k if length is None else int(length)
    if not 0 <= n <= k:
        raise ValueError(f"{where}length {n} outside [0, k = {k}]")
    return n
