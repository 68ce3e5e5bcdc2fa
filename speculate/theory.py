"""Closed forms of speculative sampling (Leviathan et al. 2023, section 3; proofs/06).

>>> from speculate import theory
>>> round(theory.speedup(0.8, 5, 0.0), 2), round(theory.speedup(0.9, 10, 0.0), 2)
(3.69, 6.86)
>>> theory.optimal_lookahead(0.8, 0.05)
8
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "acceptance_rate",
    "accepted_length_pmf",
    "engine_speedup",
    "expected_tokens",
    "multi_draft_acceptance",
    "normal_acceptance",
    "optimal_lookahead",
    "speedup",
    "walltime_improvement",
]


def acceptance_rate(p: Any, q: Any) -> Any:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q), over the last axis (batched)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    a = np.minimum(p, q).sum(axis=-1)
    return float(a) if a.ndim == 0 else a


def normal_acceptance(
    loc_p: Any,
    scale_p: Any,
    loc_q: Any,
    scale_q: Any,
    *,
    batch_ndims: int = 0,
    rng: int | np.random.Generator | None = None,
    n_mc: int = 256,
) -> Any:
    """alpha = 1 - TV(N(loc_p, scale_p^2), N(loc_q, scale_q^2)), independent coordinates.

    The axes past the first ``batch_ndims`` form one event (as in :class:`speculate.Normal`); the
    result has the batch shape. Equal scales: the closed form ``2 Phi(-delta / 2)`` with ``delta =
    |(loc_p - loc_q) / scale|`` over the event, the acceptance of reflection maximal coupling
    (proofs/03). Unequal scales: a Monte Carlo estimate of ``E_{x ~ q} min(1, p(x) / q(x))`` from
    ``n_mc`` draws with ``rng``.

    >>> round(float(normal_acceptance([0.0, 0.0], 1.0, [0.6, 0.8], 1.0)), 6)   # delta = 1
    0.617075
    """
    from scipy.special import ndtr

    lp, lq = np.asarray(loc_p, np.float64), np.asarray(loc_q, np.float64)
    if lp.shape != lq.shape:
        raise ValueError(f"loc_p and loc_q must have the same shape, got {lp.shape} and {lq.shape}")
    sp_, sq = (np.broadcast_to(np.asarray(s, np.float64), lp.shape) for s in (scale_p, scale_q))
    if not (np.all(sp_ > 0) and np.all(sq > 0)):
        raise ValueError("scales must be > 0")
    batch = lp.shape[:batch_ndims]
    lp, lq, sp_, sq = (a.reshape(*batch, -1) for a in (lp, lq, sp_, sq))  # [*batch, D]
    if np.array_equal(sp_, sq):
        delta = np.sqrt((((lp - lq) / sp_) ** 2).sum(axis=-1))
        out = 2.0 * ndtr(-delta / 2.0)
    else:
        from .rng import as_rng

        x = lq + sq * as_rng(rng).standard_normal((n_mc, *lq.shape))  # [n_mc, *batch, D]
        log_ratio = (-0.5 * ((x - lp) / sp_) ** 2 - np.log(sp_) + 0.5 * ((x - lq) / sq) ** 2 + np.log(sq)).sum(-1)
        out = np.exp(np.minimum(log_ratio, 0.0)).mean(axis=0)
    return float(out) if np.ndim(out) == 0 else out


def _check(alpha: float, k: int | None = None, c: float | None = None) -> None:
    if not 0.0 <= alpha <= 1.0 or math.isnan(alpha):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if k is not None and (int(k) != k or k < 0):
        raise ValueError(f"lookahead k must be a non-negative integer, got {k}")
    if c is not None and (not c >= 0.0 or math.isinf(c)):
        raise ValueError(f"cost ratio c must be finite and >= 0, got {c}")


def expected_tokens(alpha: float, k: int) -> float:
    """Expected outcomes per target call with k drafts and i.i.d. acceptance alpha: (1 - a^(k+1))/(1 - a)."""
    _check(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def accepted_length_pmf(alpha: float, k: int) -> np.ndarray:
    """P(n accepted drafts = j), j = 0..k, for token-wise verification with i.i.d. acceptance alpha."""
    _check(alpha, k)
    j = np.arange(k + 1)
    pmf = alpha**j * (1.0 - alpha)
    pmf[k] = alpha**k
    return pmf


def speedup(alpha: float, k: int, c: float) -> float:
    """Expected wall-time improvement: expected_tokens(alpha, k) / (k c + 1) (c = draft/target cost)."""
    _check(alpha, k, c)
    return expected_tokens(alpha, k) / (k * c + 1.0)


walltime_improvement = speedup


def optimal_lookahead(alpha: float, c: float, k_max: int = 64) -> int:
    """The k in 0..k_max that maximises speedup(alpha, k, c) (0 when speculation cannot pay).

    Precisely: the smallest k whose speedup is within a relative 1e-12 of the maximum over 0..k_max
    (for c = 0 the speedup grows forever, and this is where the gain becomes negligible). The
    speedup increases while g(k) = alpha^(k+1) (k c + 1) - c E_k > 0 and decreases after, with g
    decreasing (proofs/06), so both steps are bisections: O(log k_max) evaluations, whatever k_max.
    """
    _check(alpha, None, c)
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)):
        raise TypeError(f"k_max must be an int, got {type(k_max).__name__}")
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    a, c = float(alpha), float(c)

    def tokens(k: int) -> float:
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    lo, hi = 0, int(k_max)  # the first k with g(k) <= 0 (the first maximiser), else k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if a ** (mid + 1) * (mid * c + 1.0) - c * tokens(mid) <= 0.0:
            hi = mid
        else:
            lo = mid + 1
    peak = lo
    floor = tokens(peak) / (peak * c + 1.0) / (1.0 + 1e-12)
    lo, hi = 0, peak  # the speedup does not decrease on 0..peak: the first k reaching the floor
    while lo < hi:
        mid = (lo + hi) // 2
        if tokens(mid) / (mid * c + 1.0) >= floor:
            hi = mid
        else:
            lo = mid + 1
    return lo


def multi_draft_acceptance(alphas: Any) -> float:
    """Acceptance of recursive rejection over m candidates with stage acceptances alpha_i: 1 - prod(1 - alpha_i)."""
    a = np.asarray(alphas, dtype=np.float64)
    if np.any((a < 0) | (a > 1)):
        raise ValueError("stage acceptances must lie in [0, 1]")
    return float(1.0 - np.prod(1.0 - a))


def engine_speedup(alpha: float, t_f: float, t_g: float, t_draft: float = 0.0) -> float:
    """Expected speedup of speculate(f, f_star, g, x) over g(f(x)) run in sequence.

    Sequential: t_f + t_g. Speculative: t_draft + max(t_f, t_g) + (1 - alpha) t_g, since g on the
    guess overlaps f and is redone on rejection (assumes g and f run truly in parallel).
    """
    _check(alpha)
    if min(t_f, t_g, t_draft) < 0:
        raise ValueError("times must be >= 0")
    return (t_f + t_g) / (t_draft + max(t_f, t_g) + (1.0 - alpha) * t_g)
