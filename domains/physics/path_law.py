"""Exact laws of binned Euler-Maruyama paths in 1-D, by numerical integration (error < 1e-12).

For a 1-D chain x_{t+1} ~ N(m(x_t), s^2), m(x) = x + dt F(x)/gamma, started at a fixed x_0, the
probability that (x_1, ..., x_n) falls in a given tuple of bins is a nested Gaussian integral.
``binned_path_law`` evaluates it with composite Gauss-Legendre quadrature on panels no wider than
s/4 whose ends include every bin edge (so every integrand is smooth on every panel), and the last
step in closed form with the normal CDF. It is the exact reference for conformance tests and the
basis of the power calculations of the statistical tests.

Example:
    >>> from speculate.domains.physics import DoubleWell, Langevin
    >>> law = binned_path_law(Langevin(force=DoubleWell(), dt=0.05), x0=0.0, edges=[0.0], n=2)
    >>> sorted(law), round(sum(law.values()), 12)        # bins 0: x < 0, 1: x >= 0
    ([(0, 0), (0, 1), (1, 0), (1, 1)], 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr

from speculate.testing.quadrature import panel_nodes

from .langevin import Langevin


def binned_path_law(
    model: Langevin,
    x0: float,
    edges: Sequence[float],
    n: int,
    *,
    observe: Sequence[int] | None = None,
    lo: float = -6.0,
    hi: float = 6.0,
    order: int = 24,
) -> dict[tuple[int, ...], float]:
    """P(bin(x_t) for t in observe) for the 1-D Euler-Maruyama chain of ``model`` from x0.

    ``observe``: the steps (in 1..n, default all of them) whose bins form the outcome, in
    increasing order; the other steps are integrated out.

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
    observe = set(range(1, n + 1)) if observe is None else set(int(t) for t in observe)
    if not observe or not observe <= set(range(1, n + 1)):
        raise ValueError(f"binned_path_law: observe must be a non-empty subset of 1..{n}")
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
        p = bin_probs(m0)[0] if 1 in observe else np.ones(1)
        return {(b,) if 1 in observe else (): float(v) for b, v in enumerate(p)}
    x, w = panel_nodes(lo, hi, edges, s / 4.0, order)
    label = np.searchsorted(edges, x, side="right")             # bin of every node
    mx = mean(x)
    K = None
    prefixes = {(): w * np.exp(-0.5 * ((x - m0[0]) / s) ** 2) / (s * np.sqrt(2 * np.pi))}
    for t in range(1, n):                                       # prefixes: weight * density of x_t
        if t in observe:
            prefixes = {
                (*pre, b): np.where(label == b, a, 0.0)
                for pre, a in prefixes.items()
                for b in range(len(edges) + 1)
            }
        if t < n - 1:
            if K is None:
                K = np.exp(-0.5 * ((x[None, :] - mx[:, None]) / s) ** 2) / (s * np.sqrt(2 * np.pi))
            prefixes = {pre: (a @ K) * w for pre, a in prefixes.items()}
    law: dict[tuple[int, ...], float] = {}
    last = bin_probs(mx)                                        # [M, nbins]: x_n given x_{n-1}
    for pre, a in prefixes.items():
        if n in observe:
            for c, v in enumerate(a @ last):
                law[(*pre, c)] = float(v)
        else:
            law[pre] = float(a.sum())
    return law
