"""Calibrated and powered statistical tests, for the code paths that draw their own randomness.

Every test here runs at level ``ALPHA = 1e-6`` (false alarm probability per test; the checks are
seeded, so each run is deterministic, and with about 20 such tests the family-wise false alarm
probability of a fresh seed is below 2e-5 by Bonferroni). Each test states the deviation it is
powered for: Pearson's chi-square test against the exact law rejects, with probability at least
``POWER = 0.99``, every law at total variation >= eps from the null, when given
``min_samples(eps, cells)`` samples. The power computation uses the standard noncentral chi-square
approximation of Pearson's statistic, with noncentrality n * sum((p' - p)^2 / p) >= 4 n eps^2
(Cauchy-Schwarz: (sum |p' - p|)^2 <= sum (p' - p)^2 / p).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

ALPHA = 1e-6
POWER = 0.99


def min_samples(eps: float, cells: int, alpha: float = ALPHA, power: float = POWER) -> int:
    """Samples Pearson's test needs to catch any deviation of total variation >= eps.

    >>> min_samples(0.05, 8)
    6854
    """
    if not 0 < eps <= 1 or cells < 2:
        raise ValueError(f"need 0 < eps <= 1 and cells >= 2, got eps={eps}, cells={cells}")
    df = cells - 1
    crit = stats.chi2.isf(alpha, df)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, df, x) - power, 1e-9, 1e6)
    return math.ceil(lam / (4 * eps * eps))


def chi2_gof(
    counts: Sequence[int], probs: Sequence[float], eps: float, name: str, alpha: float = ALPHA
) -> float:
    """Pearson goodness of fit of ``counts`` to ``probs`` at level ``alpha``; returns the p-value.

    Fails (AssertionError) if an outcome of probability 0 occurs, if fewer samples than
    ``min_samples(eps, cells)`` were given (the test would not have the stated power), or if the
    p-value is below ``alpha``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ in shape")
    impossible = (probs == 0) & (counts > 0)
    if impossible.any():
        i = int(np.flatnonzero(impossible)[0])
        raise AssertionError(f"{name}: outcome {i} has probability 0 but occurred {counts[i]}x")
    keep = probs > 0
    c, p = counts[keep], probs[keep] / probs[keep].sum()
    n = int(c.sum())
    need = min_samples(eps, len(c), alpha)
    if n < need:
        raise AssertionError(f"{name}: {n} samples < {need} needed for power at TV {eps}")
    if n * p.min() < 5:
        raise AssertionError(f"{name}: an expected count is below 5 (n p_min = {n * p.min():.2f})")
    chi2 = float(np.sum((c - n * p) ** 2 / (n * p)))
    pval = float(stats.chi2.sf(chi2, len(c) - 1))
    if pval < alpha:
        tv = 0.5 * float(np.abs(c / n - p).sum())
        raise AssertionError(
            f"{name}: chi-square {chi2:.1f} on {len(c) - 1} df, p-value {pval:.3g} < {alpha} "
            f"(empirical TV {tv:.4f})"
        )
    return pval


def binomial_n(delta: float, p0: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Trials a two-sided binomial test needs to catch |p - p0| >= delta (normal approximation)."""
    za, zb = stats.norm.isf(alpha / 2), stats.norm.isf(1 - power)
    p1 = min(max(p0 - delta, 1e-12), 1 - 1e-12)  # the worse side: larger variance near 1/2
    p2 = min(max(p0 + delta, 1e-12), 1 - 1e-12)
    s0 = math.sqrt(p0 * (1 - p0))
    return max(
        math.ceil(((za * s0 + zb * math.sqrt(p * (1 - p))) / delta) ** 2) for p in (p1, p2)
    )


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
