"""Exact test cases shared by the proofs' checks: rational simplex grids and random tables.

Tables are dyadic (denominators powers of 2) so that float64 kernels see exactly the same numbers
as the Fraction computations, and they contain zeros on purpose.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from fractions import Fraction

Law = list[Fraction]


def simplex_grid(V: int, n: int) -> list[Law]:
    """Every law on V outcomes whose probabilities are multiples of 1/n (zeros included).

    >>> len(simplex_grid(3, 4)), simplex_grid(2, 2)[1]
    (15, [Fraction(1, 2), Fraction(1, 2)])
    """
    out = []
    for cuts in itertools.combinations(range(n + V - 1), V - 1):
        parts, prev = [], -1
        for c in (*cuts, n + V - 1):
            parts.append(c - prev - 1)
            prev = c
        out.append([Fraction(x, n) for x in parts])
    return out


def random_law(rng: random.Random, V: int, den: int = 8, zeros: bool = True) -> Law:
    """A random law with probabilities in (1/den)Z; zeros allowed unless ``zeros=False``."""
    while True:
        cuts = sorted(rng.randint(0, den) for _ in range(V - 1))
        w = [b - a for a, b in zip([0, *cuts], [*cuts, den], strict=True)]
        if zeros or min(w) > 0:
            return [Fraction(x, den) for x in w]


def random_table(
    seed: int, V: int, den: int = 8, zeros: bool = True, order: int | None = None
) -> Callable[[tuple[int, ...]], Law]:
    """A random context-dependent law ``prefix -> law``, fixed per context (cached).

    The context is the whole prefix (``order=None``) or its last ``order`` outcomes.
    """
    rng = random.Random(seed)
    cache: dict[tuple[int, ...], Law] = {}

    def table(prefix: tuple[int, ...]) -> Law:
        ctx = tuple(prefix) if order is None else tuple(prefix)[max(0, len(prefix) - order):]
        if order is not None:
            ctx = (*(-1,) * (order - len(ctx)), *ctx)
        if ctx not in cache:
            cache[ctx] = random_law(rng, V, den, zeros)
        return cache[ctx]

    return table


def constant(law: Law) -> Callable[[tuple[int, ...]], Law]:
    """The context-free table ``prefix -> law``."""
    return lambda prefix: law


def marginal(law: dict[tuple[int, ...], Fraction], i: int, V: int) -> Law:
    """The law of the i-th outcome of a law over sequences."""
    out = [Fraction(0)] * V
    for seq, w in law.items():
        out[seq[i]] += w
    return out
