"""Randomness: every public function of speculate and its domains takes ``rng=``: an int seed, a
numpy Generator, or None (Scientific Python's SPEC 7). A domain turns it into a Generator with
:func:`as_rng`, and seeds another library's generator (torch) with :func:`child_seed`.

>>> from speculate.rng import as_rng
>>> int(as_rng(0).integers(10)) == int(as_rng(0).integers(10))
True
"""

from __future__ import annotations

import numpy as np


def as_rng(rng: int | np.random.Generator | np.random.SeedSequence | None) -> np.random.Generator:
    """Return a numpy Generator: the same object if one is given, a fresh seeded one otherwise.

    ``None`` gives an unpredictable generator (seeded from the OS); an int or a SeedSequence gives a
    reproducible one.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        if isinstance(rng, (int, np.integer)) and rng < 0:
            raise ValueError(f"rng seed must be a non-negative integer, got {rng}")
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be an int seed, a numpy Generator, a SeedSequence or None, got {type(rng).__name__}")


def child_seed(rng: np.random.Generator) -> int:
    """A fresh 63-bit seed drawn from ``rng`` (for seeding torch or another library's generator)."""
    return int(rng.integers(0, 2**63 - 1))
