"""Statistical checks of simulated trajectories: is a sampler's output the Euler-Maruyama chain?

Used by the tests, the conformance cases and the demo; usable on your own runs:
  * ``innovations``: the standardised steps z_t = (x_{t+1} - x_t - dt F(x_t)/gamma) / s; for the
    exact chain every z is an independent N(0, 1) draw, whatever the force (so a KS test of all of
    them checks every transition at once);
  * ``path_outcomes``: bin paths (x_t1, x_t2, ...) of many chains into hashable outcomes, the
    keys of ``path_law.binned_path_law``: feed them to speculate.testing's chi-square checks
    (``speculate.testing.chi2_power`` and ``ks_power_bound`` give the power of those checks).

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> from speculate.domains.physics.checks import innovations
    >>> model = Langevin(force=DoubleWell(), dt=0.01)
    >>> sim = simulate(model, np.zeros((500, 1, 1)), 20, rng=0)
    >>> z = innovations(model, sim.positions)             # [500, 20, 1, 1]
    >>> z.shape, bool(abs(z.mean()) < 0.05)
    ((500, 20, 1, 1), True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .langevin import Langevin


def innovations(model: Langevin, positions: np.ndarray) -> np.ndarray:
    """Standardised steps of trajectories [B, T, N, d] (every step recorded): [B, T-1, N, d]."""
    P = np.asarray(positions, dtype=np.float64)
    if P.ndim != 4:
        raise ValueError(f"innovations: positions must be [B, T, N, d], got {P.shape}")
    B, T = P.shape[:2]
    X = P[:, :-1].reshape(B * (T - 1), *P.shape[2:])
    F = np.asarray(model.force(X), dtype=np.float64)
    z = (P[:, 1:].reshape(X.shape) - model.mean(X, F)) / model.noise_scale
    return z.reshape(B, T - 1, *P.shape[2:])


def path_outcomes(paths: np.ndarray, edges: Sequence[float]) -> list[tuple[int, ...]]:
    """Binned paths as hashable outcomes: paths [n, L] of scalars -> n tuples of L bin indices.

    Bin b of a value is the number of ``edges`` at or below it (as in ``binned_path_law``), so
    the outcomes are the keys of that law (for speculate.testing's chi-square checks).
    """
    lab = np.searchsorted(np.asarray(edges, np.float64), np.asarray(paths), side="right")
    return [tuple(r) for r in lab.tolist()]
