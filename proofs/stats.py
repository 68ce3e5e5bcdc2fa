"""Calibrated and powered statistical tests for the code paths that draw their own randomness.

Thin layer over :mod:`speculate.testing.gof` (the library's goodness-of-fit toolkit) that works on
counts and refuses to run an under-powered test. Every test here runs at level ``ALPHA = 1e-6``
(false alarm probability per test): ``speculate.testing.DEFAULT_ALPHA``, the one significance
level of the whole test suite. The checks are seeded, so each run is deterministic; with the
about 20 statistical tests of proofs/, the family-wise false alarm probability for a fresh seed is
below 2e-5 (Bonferroni). Each test states the deviation it is powered for: Pearson's chi-square
test against the exact law rejects, with probability at least ``POWER = 0.99``, every law at total
variation >= eps from the null when given ``min_samples(eps, cells)`` samples (noncentral
chi-square approximation, noncentrality >= 4 n eps^2 by Cauchy-Schwarz; see
``speculate.testing.chi2_sample_size``). Binomial tests use the normal approximation for power
and the exact binomial p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, chi2_sample_size

POWER = 0.99


def min_samples(eps: float, cells: int, alpha: float = ALPHA, power: float = POWER) -> int:
    """Samples Pearson's test needs to catch any deviation of total variation >= eps.

    >>> min_samples(0.05, 8)
    6854
    """
    return chi2_sample_size(eps, cells, alpha=alpha, power=power)


def chi2_gof(
    counts: Sequence[int], probs: Sequence[float], eps: float, name: str, alpha: float = ALPHA
) -> float:
    """Chi-square goodness of fit of ``counts`` to ``probs`` at level ``alpha``; the p-value.

    Fails (AssertionError) if an outcome of probability 0 occurs, if fewer samples than
    ``min_samples(eps, cells)`` were given (the test would not have the stated power), or if the
    p-value is below ``alpha``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape or counts.ndim != 1:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} must be equal 1-D shapes")
    n, cells = int(counts.sum()), int((probs > 0).sum())
    need = min_samples(eps, cells, alpha)
    if n < need:
        raise AssertionError(f"{name}: {n} samples < {need} needed for power at TV {eps}")
    samples = np.repeat(np.arange(len(counts)), counts)
    return assert_categorical_matches(samples, probs / probs.sum(), alpha=alpha, label=name)


def binomial_n(delta: float, p0: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Trials a two-sided binomial test needs to catch |p - p0| >= delta (normal approximation)."""
    za, zb = stats.norm.isf(alpha / 2), stats.norm.isf(1 - power)
    s0 = math.sqrt(p0 * (1 - p0))
    worst = 0
    for p in (p0 - delta, p0 + delta):
        p = min(max(p, 1e-12), 1 - 1e-12)
        worst = max(worst, math.ceil(((za * s0 + zb * math.sqrt(p * (1 - p))) / delta) ** 2))
    return worst


def binomial_test(
    k: int, n: int, p0: float, delta: float, name: str, alpha: float = ALPHA
) -> float:
    """Exact two-sided binomial test of k successes in n trials against p0; returns the p-value."""
    need = binomial_n(delta, p0, alpha)
    if n < need:
        raise AssertionError(f"{name}: {n} trials < {need} needed for power at |dp| {delta}")
    pval = float(stats.binomtest(int(k), int(n), float(p0)).pvalue)
    if pval < alpha:
        raise AssertionError(
            f"{name}: {k}/{n} = {k / n:.5f} vs p0 = {p0:.5f}, p-value {pval:.3g} < {alpha}"
        )
    return pval
