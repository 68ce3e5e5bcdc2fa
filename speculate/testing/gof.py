"""Distribution-equality checks that return a p-value and raise a readable AssertionError on failure.

Calibration: every check takes ``alpha`` (default 1e-6: a correct sampler fails at most once in a
million runs). Divide it by the number of checks in a test suite (Bonferroni) to bound the suite's
false-alarm rate. Power: :func:`chi2_sample_size` and :func:`ks_sample_size` give the number of
samples that detects a given deviation with a given probability; with the defaults (alpha = 1e-6,
power 0.99) a categorical check on ``n >= chi2_sample_size(0.01, bins)`` samples catches any
deviation of total variation 0.01 (measured on the merged bins) with probability >= 99%.

>>> import numpy as np
>>> from speculate.testing import assert_categorical_matches
>>> rng = np.random.default_rng(0)
>>> p = np.array([0.5, 0.3, 0.2])
>>> pval = assert_categorical_matches(rng.choice(3, size=10_000, p=p), p)
>>> pval > 1e-6
True
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
from scipy import stats as st

DEFAULT_ALPHA = 1e-6

__all__ = [
    "DEFAULT_ALPHA",
    "GofResult",
    "assert_categorical_matches",
    "assert_continuous_matches",
    "assert_same_categorical",
    "assert_same_continuous",
    "chi2_gof",
    "chi2_power",
    "chi2_sample_size",
    "ks_power_bound",
    "ks_sample_size",
]


class GofResult(NamedTuple):
    statistic: float
    df: int
    pvalue: float
    detail: str  # the largest deviations, for failure messages


def _cells(samples: Any, probs: Any) -> tuple[list, np.ndarray, np.ndarray]:
    """Outcome labels, observed counts and expected probabilities on a common list of cells."""
    if isinstance(probs, Mapping):
        labels = list(probs)
        expected = np.array([float(probs[c]) for c in labels])
        counts = Counter(_hashable(s) for s in samples)
        unknown = [c for c in counts if c not in probs]
        if unknown:
            raise AssertionError(
                f"{sum(counts[c] for c in unknown)} samples are outcomes the reference law does not "
                f"list, e.g. {unknown[0]!r}"
            )
        observed = np.array([counts.get(c, 0) for c in labels], dtype=np.float64)
    else:
        expected = np.asarray(probs, dtype=np.float64).ravel()
        s = np.asarray(samples).ravel()
        if s.size and (not np.issubdtype(s.dtype, np.integer) or s.min() < 0 or s.max() >= expected.size):
            bad = s[(s < 0) | (s >= expected.size)] if np.issubdtype(s.dtype, np.number) else s[:1]
            raise AssertionError(f"samples contain outcomes outside 0..{expected.size - 1}: {bad[:5]}")
        observed = np.bincount(s.astype(np.int64), minlength=expected.size).astype(np.float64)
        labels = list(range(expected.size))
    if np.any(expected < 0) or not math.isclose(expected.sum(), 1.0, abs_tol=1e-6):
        raise ValueError(f"reference probabilities must be >= 0 and sum to 1, got sum {expected.sum()}")
    return labels, observed, expected / expected.sum()


def _hashable(x: Any) -> Hashable:
    if isinstance(x, np.ndarray):
        return tuple(x.tolist())
    if isinstance(x, list):
        return tuple(_hashable(v) for v in x)
    if isinstance(x, np.generic):
        return x.item()
    return x


def _merge(expected_counts: np.ndarray, min_expected: float) -> np.ndarray:
    """Bin index per cell: cells with expected count < min_expected are pooled (smallest first)."""
    order = np.argsort(expected_counts, kind="stable")
    bins = np.empty(len(expected_counts), np.int64)
    b, acc, nbins = 0, 0.0, 0
    for i in order:
        bins[i] = b
        acc += expected_counts[i]
        if acc >= min_expected:
            b, acc, nbins = b + 1, 0.0, b + 1
    if acc > 0 and nbins > 0:  # leftover small pool: fold it into the last full bin
        bins[bins == b] = b - 1
    return bins


def chi2_gof(samples: Iterable, probs: Any, *, min_expected: float = 5.0) -> GofResult:
    """Chi-square goodness of fit of ``samples`` to ``probs`` (an array over 0..V-1 or a dict).

    Cells with probability 0 must have no samples (else p = 0); cells whose expected count is below
    ``min_expected`` are pooled.
    """
    labels, observed, expected = _cells(samples, probs)
    n = observed.sum()
    if n == 0:
        raise ValueError("no samples")
    impossible = (expected == 0) & (observed > 0)
    if impossible.any():
        i = int(np.flatnonzero(impossible)[0])
        return GofResult(
            math.inf,
            0,
            0.0,
            f"outcome {labels[i]!r} has probability 0 but was sampled {int(observed[i])} times",
        )
    keep = expected > 0
    labels = [lab for lab, k in zip(labels, keep, strict=False) if k]
    observed, expected = observed[keep], expected[keep] * n
    bins = _merge(expected, min_expected)
    nb = int(bins.max()) + 1
    ob, eb = np.bincount(bins, observed, nb), np.bincount(bins, expected, nb)
    if nb < 2:
        return GofResult(0.0, 0, 1.0, "a single bin: nothing to test")
    stat = float(np.sum((ob - eb) ** 2 / eb))
    z = (observed - expected) / np.sqrt(expected)
    worst = np.argsort(-np.abs(z))[:3]
    detail = "; ".join(
        f"outcome {labels[i]!r}: observed {int(observed[i])}, expected {expected[i]:.1f} ({z[i]:+.1f} sd)"
        for i in worst
    )
    return GofResult(stat, nb - 1, float(st.chi2.sf(stat, nb - 1)), detail)


def assert_categorical_matches(
    samples: Iterable,
    probs: Any,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_expected: float = 5.0,
    label: str = "",
) -> float:
    """Raise AssertionError if the chi-square test rejects ``samples ~ probs`` at level ``alpha``.

    Returns the p-value. ``probs``: an array over outcomes 0..V-1, or a dict {outcome: probability}
    for any hashable outcomes (tuples of a joint law, for instance).
    """
    r = chi2_gof(samples, probs, min_expected=min_expected)
    if not r.pvalue >= alpha:
        raise AssertionError(
            f"{label + ': ' if label else ''}samples do not follow the reference law: chi-square "
            f"{r.statistic:.1f} on {r.df} df, p = {r.pvalue:.3g} < alpha = {alpha:g}. {r.detail}"
        )
    return r.pvalue


def assert_same_categorical(
    a: Iterable,
    b: Iterable,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_expected: float = 5.0,
    label: str = "",
) -> float:
    """Two-sample chi-square test of homogeneity for discrete (hashable) samples; returns the p-value."""
    ca, cb = Counter(_hashable(x) for x in a), Counter(_hashable(x) for x in b)
    labels = sorted(set(ca) | set(cb), key=repr)
    oa = np.array([ca.get(c, 0) for c in labels], np.float64)
    ob = np.array([cb.get(c, 0) for c in labels], np.float64)
    na, nb_ = oa.sum(), ob.sum()
    if na == 0 or nb_ == 0:
        raise ValueError("both samples must be non-empty")
    pooled = (oa + ob) / (na + nb_)
    bins = _merge(pooled * min(na, nb_), min_expected)
    k = int(bins.max()) + 1
    if k < 2:
        return 1.0
    ta, tb = np.bincount(bins, oa, k), np.bincount(bins, ob, k)
    table = np.vstack([ta, tb])
    stat, pval, dof, _ = st.chi2_contingency(table, correction=False)
    if not pval >= alpha:
        pa, pb = oa / na, ob / nb_
        worst = np.argsort(-np.abs(pa - pb))[:3]
        detail = "; ".join(f"{labels[i]!r}: {pa[i]:.4f} vs {pb[i]:.4f}" for i in worst)
        raise AssertionError(
            f"{label + ': ' if label else ''}the two samples differ: chi-square {stat:.1f} on {dof} df, "
            f"p = {pval:.3g} < alpha = {alpha:g}. Largest differences (frequency a vs b): {detail}"
        )
    return float(pval)


def _as_2d(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        a = a.reshape(a.shape[0], -1)
    if not np.all(np.isfinite(a)):
        raise AssertionError("samples contain NaN or inf")
    return a


def _directions(d: int, n_random: int, seed: int) -> np.ndarray:
    dirs = [np.eye(d)]
    if d > 1 and n_random > 0:
        r = np.random.default_rng(seed).standard_normal((n_random, d))
        dirs.append(r / np.linalg.norm(r, axis=1, keepdims=True))
    return np.vstack(dirs)


def assert_same_continuous(
    a: Any,
    b: Any,
    *,
    alpha: float = DEFAULT_ALPHA,
    n_projections: int = 16,
    seed: int = 0,
    label: str = "",
) -> float:
    """Two-sample test for continuous samples (rows are outcomes; 1-D or multivariate).

    Kolmogorov-Smirnov on every coordinate and on ``n_projections`` random unit directions (seeded;
    two laws are equal iff all their 1-D projections are, by Cramer-Wold), Bonferroni-corrected so
    the whole check has level ``alpha``. Returns the smallest corrected p-value.
    """
    xa, xb = _as_2d(a), _as_2d(b)
    if xa.shape[1] != xb.shape[1]:
        raise ValueError(f"samples have different dimensions: {xa.shape[1]} and {xb.shape[1]}")
    dirs = _directions(xa.shape[1], n_projections, seed)
    pa, pb = xa @ dirs.T, xb @ dirs.T
    pvals = np.array([st.ks_2samp(pa[:, j], pb[:, j]).pvalue for j in range(len(dirs))])
    corrected = min(1.0, float(pvals.min()) * len(dirs))
    if not corrected >= alpha:
        j = int(np.argmin(pvals))
        what = f"coordinate {j}" if j < xa.shape[1] else f"random projection {j - xa.shape[1]}"
        raise AssertionError(
            f"{label + ': ' if label else ''}the two samples differ along {what}: KS p = {pvals[j]:.3g} "
            f"(x{len(dirs)} Bonferroni = {corrected:.3g}) < alpha = {alpha:g}; means "
            f"{pa[:, j].mean():.4g} vs {pb[:, j].mean():.4g}, sds {pa[:, j].std():.4g} vs {pb[:, j].std():.4g}"
        )
    return corrected


def assert_continuous_matches(samples: Any, cdf: Any, *, alpha: float = DEFAULT_ALPHA, label: str = "") -> float:
    """One-sample Kolmogorov-Smirnov test of 1-D ``samples`` against ``cdf`` (a callable or a
    frozen scipy distribution); returns the p-value."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise AssertionError("samples contain NaN or inf")
    f = cdf.cdf if hasattr(cdf, "cdf") else cdf
    r = st.kstest(x, f)
    if not r.pvalue >= alpha:
        raise AssertionError(
            f"{label + ': ' if label else ''}samples do not follow the reference CDF: KS D = {r.statistic:.4g}, "
            f"p = {r.pvalue:.3g} < alpha = {alpha:g} (n = {x.size}, sample mean {x.mean():.4g})"
        )
    return float(r.pvalue)


def chi2_sample_size(tv: float, bins: int, *, alpha: float = DEFAULT_ALPHA, power: float = 0.99) -> int:
    """Samples a chi-square test on ``bins`` cells needs to catch any deviation of total variation
    ``tv`` with probability ``power`` at level ``alpha``.

    Any deviation of TV t has chi-square divergence >= 4 t^2 (Cauchy-Schwarz), so the test's
    noncentrality is at least n 4 t^2; the smallest noncentrality reaching ``power`` is solved for.
    """
    if not 0 < tv <= 1 or bins < 2:
        raise ValueError("need 0 < tv <= 1 and bins >= 2")
    return math.ceil(chi2_noncentrality(bins - 1, alpha, power) / (4 * tv * tv))


def chi2_noncentrality(df: int, alpha: float, power: float) -> float:
    """The smallest noncentrality at which a chi-square test on ``df`` degrees of freedom at level
    ``alpha`` has power ``power`` (bisection on scipy's noncentral chi-square)."""
    crit = st.chi2.isf(alpha, df)
    lo, hi = 0.0, 1.0
    while st.ncx2.sf(crit, df, hi) < power:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if st.ncx2.sf(crit, df, mid) < power else (lo, mid)
    return hi


def ks_sample_size(d: float, *, alpha: float = DEFAULT_ALPHA, power: float = 0.99) -> int:
    """Samples a one-sample KS test needs to catch a CDF deviation of sup-distance ``d`` with
    probability >= ``power`` at level ``alpha`` (conservative: DKW bounds on both sides).
    For the two-sample test with n samples each, use twice this n per sample."""
    if not 0 < d <= 1:
        raise ValueError("need 0 < d <= 1")
    c_alpha = math.sqrt(-0.5 * math.log(alpha / 2))  # level alpha threshold on sqrt(n) D_n
    c_beta = math.sqrt(-0.5 * math.log((1 - power) / 2))  # the empirical CDF stays this close
    return math.ceil(((c_alpha + c_beta) / d) ** 2)


def chi2_power(
    null: Any, truth: Any, n: int, *, alpha: float = DEFAULT_ALPHA, two_sample: bool = False, min_expected: float = 5.0
) -> float:
    """Power of the chi-square checks above against one alternative: ``n`` samples (per sample) from
    ``truth`` tested against ``null`` (``assert_categorical_matches``), or, with ``two_sample``,
    ``n`` from each tested for homogeneity (``assert_same_categorical``).

    Cells are pooled as the checks pool them (expected counts below ``min_expected``, under the
    null, or under the pooled law for two samples); the power is the noncentral chi-square
    approximation with noncentrality ``n sum (t - p)^2 / p`` (one sample) or
    ``n sum (t - p)^2 / (t + p)`` (two samples) over the pooled cells.

    >>> chi2_power([0.5, 0.5], [0.55, 0.45], 10_000) > 0.99    # a shift of 0.05 in 10^4 draws
    True
    """
    p, t = np.asarray(null, np.float64), np.asarray(truth, np.float64)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"null and truth must be 1-D laws of the same length, got {p.shape} and {t.shape}")
    ref = (p + t) / 2 if two_sample else p
    keep = ref > 0
    p, t, ref = p[keep], t[keep], ref[keep]
    bins = _merge(ref * n, min_expected)
    k = int(bins.max()) + 1
    if k < 2:
        return 0.0
    pb, tb = np.bincount(bins, p, k), np.bincount(bins, t, k)
    lam = n * float(np.sum((tb - pb) ** 2 / ((tb + pb) if two_sample else pb)))
    return float(st.ncx2.sf(st.chi2.isf(alpha, k - 1), k - 1, lam))


def ks_power_bound(n: int, distance: float, *, alpha: float = DEFAULT_ALPHA) -> float:
    """A lower bound on the power of the one-sample KS check (``assert_continuous_matches``) on
    ``n`` samples whose CDF is at sup-distance ``distance`` from the null (DKW inequality): the
    check rejects when the empirical CDF strays more than c = sqrt(log(2 / alpha) / (2 n)) from the
    null, and it strays less than ``distance - c`` from the truth with probability at most
    2 exp(-2 n (distance - c)^2). :func:`ks_sample_size` inverts it.

    >>> ks_power_bound(300_000, 0.01) >= 0.99
    True
    """
    c = math.sqrt(math.log(2.0 / alpha) / (2.0 * n))
    if distance <= c:
        return 0.0
    return max(0.0, 1.0 - 2.0 * math.exp(-2.0 * n * (distance - c) ** 2))
