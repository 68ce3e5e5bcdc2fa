"""Shared checks of the diffusion tests: the law of recorded states against the exact chain law
(goodness of fit) and against plain sampling (two-sample), with the power of each.

``assert_chain_law(x, law, t, alpha)``: the standardised states z = (x_t - mean_t) / sd_t are i.i.d.
N(0, 1) under the exact law (every coordinate of an affine-Gaussian chain is an independent Gaussian
chain with the same variance), so KS of z on every coordinate, on ``PROJECTIONS`` random unit
directions (Cramer-Wold) and on all coordinates pooled, Bonferroni inside: ``1 + D + PROJECTIONS``
one-sample KS tests at ``alpha / (1 + D + PROJECTIONS)`` each. ``gof_power_distance(n, D, alpha)``:
the KS distance of a coordinate's, a projection's or the pooled CDF that this check catches with
probability >= 0.99 (DKW bound, speculate.testing.ks_power_bound).

``assert_same_law(a, b, alpha)``: speculate.testing.assert_same_continuous (two-sample KS on every
coordinate and 16 random projections, Bonferroni inside); with n samples each it catches a KS distance
d with probability >= ks_power_bound(n // 2, d, alpha / (D + 16)) (the one-sample bound at half the
size, speculate.testing.ks_sample_size's rule).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from speculate.testing import assert_same_continuous, ks_power_bound

PROJECTIONS = 16


def _directions(D: int, seed: int = 0) -> np.ndarray:
    r = np.random.default_rng(seed).standard_normal((PROJECTIONS, D))
    return np.vstack([np.eye(D), r / np.linalg.norm(r, axis=1, keepdims=True)])


def assert_chain_law(x: np.ndarray, law, t: int, alpha: float, label: str = "") -> None:
    mean, var = law.marginal(t)
    z = (x.reshape(x.shape[0], -1) - mean[None, :]) / np.sqrt(var)
    D = z.shape[1]
    tests = [("pooled coordinates", z.ravel())]
    proj = z @ _directions(D).T
    tests += [(f"coordinate {j}" if j < D else f"projection {j - D}", proj[:, j]) for j in range(proj.shape[1])]
    m = len(tests)
    for what, v in tests:
        r = stats.kstest(v, stats.norm.cdf)
        if not r.pvalue * m >= alpha:
            raise AssertionError(f"{label}: x_{t} does not follow the exact chain law along {what}: KS D = "
                                 f"{r.statistic:.4g}, p = {r.pvalue:.3g} (x{m} Bonferroni) < {alpha:g}; "
                                 f"mean {v.mean():.4f}, sd {v.std():.4f} (exact: 0, 1)")


def gof_power_distance(n: int, D: int, alpha: float) -> float:
    """The smallest KS distance (of one coordinate or projection, n samples) caught w.p. >= 0.99."""
    m = 1 + D + PROJECTIONS
    for d in np.arange(0.001, 0.5, 0.0001):
        if ks_power_bound(n, float(d), alpha=alpha / m) >= 0.99:
            return float(d)
    return 1.0


def same_law_power_distance(n: int, D: int, alpha: float) -> float:
    m = D + PROJECTIONS
    for d in np.arange(0.001, 0.5, 0.0001):
        if ks_power_bound(n // 2, float(d), alpha=alpha / m) >= 0.99:
            return float(d)
    return 1.0


def assert_same_law(a: np.ndarray, b: np.ndarray, alpha: float, label: str = "") -> None:
    assert_same_continuous(a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1), alpha=alpha,
                           n_projections=PROJECTIONS, label=label)
