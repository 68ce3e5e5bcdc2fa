"""Exact laws of binned Euler-Maruyama paths in 1-D, by numerical integration (error < 1e-12).

For a 1-D chain x_{t+1} ~ N(m(x_t), s^2), m(x) = x + dt F(x)/gamma, started at a fixed x_0, the
probability that (x_1, ..., x_n) falls in a given tuple of bins is a nested Gaussian integral.
``binned_path_law`` evaluates it with composite Gauss-Legendre quadrature on panels no wider than
s/4 whose ends include every bin edge (so every integrand is smooth on every panel), and the last
step in closed form with the normal CDF. It is the exact reference for conformance tests and the
basis of the power calculations of the statistical tests.

Example:
    >>> from domains.physics import DoubleWell, Langevin
    >>> law = binned_path_law(Langevin(force=DoubleWell(), dt=0.05), x0=0.0, edges=[0.0], n=2)
    >>> sorted(law), round(sum(law.values()), 12)        # bins 0: x < 0, 1: x >= 0
    ([(0, 0), (0, 1), (1, 0), (1, 1)], 1.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr

from .langevin import Langevin


def _nodes(lo: float, hi: float, edges: np.ndarray, width: float, order: int):
    """Composite Gauss-Legendre nodes/weights on [lo, hi], panels split at ``edges``."""
    cuts = np.unique(np.concatenate([[lo, hi], edges[(edges > lo) & (edges < hi)]]))
    g, w = np.polynomial.legendre.leggauss(order)
    xs, ws = [], []
    for a, b in itertools.pairwise(cuts):
        m = max(1, int(np.ceil((b - a) / width)))
        p = np.linspace(a, b, m + 1)
        half = 0.5 * np.diff(p)[:, None]                         # [m, 1]
        mid = 0.5 * (p[1:] + p[:-1])[:, None]
        xs.append((mid + half * g).ravel())
        ws.append((half * w).ravel())
    return np.concatenate(xs), np.concatenate(ws)


def binned_path_law(
    model: Langevin,
    x0: float,
    edges: Sequence[float],
    n: int,
    *,
    lo: float = -6.0,
    hi: float = 6.0,
    order: int = 24,
) -> dict[tuple[int, ...], float]:
    """P(bin(x_1), ..., bin(x_n)) for the 1-D Euler-Maruyama chain of ``model`` started at x0.

    ``edges`` are the inner bin edges, increasing; bin b is [edges[b-1], edges[b]) with
    edges[-1] = -inf and edges[len] = +inf. The force is called on arrays [M, 1, 1]. Mass outside
    [lo, hi] before the last step is neglected: choose them so that it is below the accuracy you
    need (the default suits wells of unit size); the returned law is NOT renormalised, so its sum
    shows that mass.
    """
    edges = np.asarray(edges, dtype=np.float64)
    if edges.ndim != 1 or np.any(np.diff(edges) <= 0):
        raise ValueError("binned_path_law: edges must be a strictly increasing 1-D sequence")
    if n < 1:
        raise ValueError("binned_path_law: n must be >= 1")
    s = model.noise_scale

    def mean(x: np.ndarray) -> np.ndarray:
        F = np.asarray(model.force(x.reshape(-1, 1, 1)), dtype=np.float64).reshape(-1)
        return model.mean(x, F)

    cdf_edges = np.concatenate([[-np.inf], edges, [np.inf]])

    def bin_probs(m: np.ndarray) -> np.ndarray:                # [M] means -> [M, nbins]
        c = ndtr((cdf_edges[None, :] - m[:, None]) / s)
        return np.diff(c, axis=1)

    m0 = mean(np.array([float(x0)]))
    if n == 1:
        p = bin_probs(m0)[0]
        return {(b,): float(v) for b, v in enumerate(p)}
    x, w = _nodes(lo, hi, edges, s / 4.0, order)
    label = np.searchsorted(edges, x, side="right")             # bin of every node
    dens = w * np.exp(-0.5 * ((x - m0[0]) / s) ** 2) / (s * np.sqrt(2 * np.pi))  # weight * p(x_1)
    prefixes = {(): dens}
    mx = mean(x)
    for _ in range(n - 2):                                      # propagate x_t -> x_{t+1}
        K = np.exp(-0.5 * ((x[None, :] - mx[:, None]) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        nxt = {}
        for pre, a in prefixes.items():
            for b in range(len(edges) + 1):
                sel = label == b
                if sel.any():
                    nxt[(*pre, b)] = (a[sel] @ K[sel]) * w
        prefixes = nxt
    last = bin_probs(mx)                                        # [M, nbins]
    law: dict[tuple[int, ...], float] = {}
    for pre, a in prefixes.items():
        for b in range(len(edges) + 1):
            sel = label == b
            probs = a[sel] @ last[sel] if sel.any() else np.zeros(len(edges) + 1)
            for c, v in enumerate(probs):
                law[(*pre, b, c)] = float(v)
    return law
