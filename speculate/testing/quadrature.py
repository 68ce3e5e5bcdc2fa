"""Quadrature for the exact laws of continuous processes (the physics and diffusion domains' path
and marginal laws integrate Gaussian transition densities over bins).

>>> import numpy as np
>>> x, w = panel_nodes(0.0, 2.0, np.array([0.5]), width=1.0, order=4)
>>> round(float(w.sum()), 12), round(float((w * x**3).sum()), 12)     # exact for low degrees
(2.0, 4.0)
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["panel_nodes"]


def panel_nodes(lo: float, hi: float, edges: np.ndarray, width: float, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes and weights on [lo, hi]: panels no wider than ``width``, split
    at the ``edges`` inside (bin edges, where the integrand jumps), ``order`` nodes per panel."""
    cuts = np.unique(np.concatenate([[lo, hi], edges[(edges > lo) & (edges < hi)]]))
    g, w = np.polynomial.legendre.leggauss(order)
    xs, ws = [], []
    for a, b in itertools.pairwise(cuts):
        m = max(1, int(np.ceil((b - a) / width)))
        p = np.linspace(a, b, m + 1)
        half = 0.5 * np.diff(p)[:, None]  # [m, 1]
        mid = 0.5 * (p[1:] + p[:-1])[:, None]
        xs.append((mid + half * g).ravel())  # [m * order]
        ws.append((half * w).ravel())
    return np.concatenate(xs), np.concatenate(ws)
