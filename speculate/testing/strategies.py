"""Hypothesis strategies for speculative-sampling tests (requires the ``hypothesis`` package).

The (p, q) pairs cover the cases other implementations got wrong: zeros in either, disjoint
supports, p == q, one-hot drafts, near-degenerate and long-tailed rows, large vocabularies.

>>> from hypothesis import given, settings
>>> from speculate.testing.strategies import categorical_pairs
>>> @settings(max_examples=5, derandomize=True)
... @given(categorical_pairs(max_outcomes=8))
... def test(pq):
...     p, q = pq
...     assert p.shape == q.shape and abs(p.sum() - 1) < 1e-9
>>> test()
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import strategies as hs

__all__ = [
    "PAIR_KINDS",
    "categorical_pairs",
    "categoricals",
    "normal_pairs",
    "rational_pairs",
    "scipy_distributions",
]

PAIR_KINDS = (
    "independent",
    "equal",
    "disjoint",
    "draft_one_hot",
    "target_one_hot",
    "perturbed",
    "zeros",
    "long_tailed",
    "near_degenerate",
)


def _normalise(w: np.ndarray, dtype) -> np.ndarray:
    w = np.asarray(w, np.float64)
    w = w / w.sum()
    return w.astype(dtype)


def _row(rng: np.random.Generator, V: int, kind: str) -> np.ndarray:
    if kind == "one_hot":
        w = np.zeros(V)
        w[rng.integers(V)] = 1.0
    elif kind == "long_tailed":
        w = 1.0 / (1.0 + rng.permutation(V)) ** 1.1
    elif kind == "near_degenerate":
        w = np.full(V, 1e-9)
        w[rng.integers(V)] = 1.0
    elif kind == "zeros":
        w = rng.dirichlet(np.full(V, 0.5))
        w[rng.random(V) < 0.5] = 0.0
        if w.sum() == 0:
            w[rng.integers(V)] = 1.0
    else:
        w = rng.dirichlet(np.full(V, rng.choice([0.1, 0.5, 1.0, 5.0])))
        if w.sum() == 0 or not np.all(np.isfinite(w)):
            w = np.ones(V)
    return w


@hs.composite
def categoricals(draw, min_outcomes: int = 1, max_outcomes: int = 1000, dtype=np.float64, kinds=None):
    """One probability vector (numpy, ``dtype``) of a random length and shape."""
    V = draw(hs.integers(min_outcomes, max_outcomes))
    kind = draw(hs.sampled_from(kinds or ("dirichlet", "one_hot", "long_tailed", "near_degenerate", "zeros")))
    seed = draw(hs.integers(0, 2**32 - 1))
    return _normalise(_row(np.random.default_rng(seed), V, kind), dtype)


@hs.composite
def categorical_pairs(draw, min_outcomes: int = 1, max_outcomes: int = 1000, dtype=np.float64, kinds=None):
    """(p, q): target and draft probability vectors over the same outcomes, of a named kind (PAIR_KINDS)."""
    V = draw(hs.integers(min_outcomes, max_outcomes))
    kind = draw(hs.sampled_from(kinds or PAIR_KINDS))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    base = "long_tailed" if kind == "long_tailed" else "near_degenerate" if kind == "near_degenerate" else "d"
    p = _row(rng, V, base)
    if kind == "equal":
        q = p.copy()
    elif kind == "disjoint" and V >= 2:
        cut = int(rng.integers(1, V))
        perm = rng.permutation(V)
        p, q = np.zeros(V), np.zeros(V)
        p[perm[:cut]] = rng.random(cut) + 0.01
        q[perm[cut:]] = rng.random(V - cut) + 0.01
    elif kind == "draft_one_hot":
        q = _row(rng, V, "one_hot")
    elif kind == "target_one_hot":
        p, q = _row(rng, V, "one_hot"), p
    elif kind == "perturbed":
        q = p * np.exp(0.3 * rng.standard_normal(V))
    elif kind == "zeros":
        p, q = _row(rng, V, "zeros"), _row(rng, V, "zeros")
    else:
        q = _row(rng, V, base)
    return _normalise(p, dtype), _normalise(q, dtype)


@hs.composite
def rational_pairs(draw, max_outcomes: int = 4, denominator: int = 12):
    """(p, q) as lists of Fractions with a common small denominator (zeros allowed), for exact mode."""
    V = draw(hs.integers(1, max_outcomes))

    def vec():
        cuts = sorted(draw(hs.lists(hs.integers(0, denominator), min_size=V - 1, max_size=V - 1)))
        edges = [0, *cuts, denominator]
        return [Fraction(edges[i + 1] - edges[i], denominator) for i in range(V)]

    return vec(), vec()


@hs.composite
def normal_pairs(draw, max_dim: int = 8, equal_scale: bool | None = True):
    """(loc_p, loc_q, scale_p, scale_q) numpy arrays for Normal pairs; equal scales unless told."""
    d = draw(hs.integers(1, max_dim))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    sp = np.exp(rng.uniform(-1.5, 1.0, d))
    delta = draw(hs.sampled_from([0.0, 0.05, 0.3, 1.0, 3.0]))
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    lp = rng.normal(0, 2, d)
    lq = lp + delta * sp * direction
    same = draw(hs.booleans()) if equal_scale is None else equal_scale
    sq = sp if same else sp * np.exp(rng.uniform(-0.3, 0.3, d))
    return lp, lq, sp, sq


_SCIPY = {
    "norm": lambda r: (r.normal(), np.exp(r.uniform(-1, 1))),
    "t": lambda r: (np.exp(r.uniform(0.5, 2.5)), r.normal(), np.exp(r.uniform(-1, 1))),
    "gamma": lambda r: (np.exp(r.uniform(-0.5, 1.5)), 0.0, np.exp(r.uniform(-1, 1))),
    "beta": lambda r: (np.exp(r.uniform(-0.5, 1)), np.exp(r.uniform(-0.5, 1))),
    "laplace": lambda r: (r.normal(), np.exp(r.uniform(-1, 1))),
    "poisson": lambda r: (np.exp(r.uniform(-1, 2.5)),),
    "binom": lambda r: (int(r.integers(1, 30)), r.uniform(0.05, 0.95)),
    "geom": lambda r: (r.uniform(0.1, 0.9),),
    "nbinom": lambda r: (int(r.integers(1, 10)), r.uniform(0.2, 0.9)),
}
_DISCRETE = {"poisson", "binom", "geom", "nbinom"}


@hs.composite
def scipy_distributions(draw, discrete: bool | None = None, family: str | None = None):
    """(name, frozen scipy.stats distribution) drawn from common continuous and discrete families.
    Pass ``family=`` to fix the family (a target and a draft from the same family)."""
    import scipy.stats as st

    names = [n for n in _SCIPY if discrete is None or (n in _DISCRETE) == discrete]
    name = family or draw(hs.sampled_from(names))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    return name, getattr(st, name)(*_SCIPY[name](rng))
