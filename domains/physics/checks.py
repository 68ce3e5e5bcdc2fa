"""Statistical checks of simulated trajectories: is a sampler's output the Euler-Maruyama chain?

Used by the tests, the conformance cases and the demo; usable on your own runs:
  * ``innovations``: the standardised steps z_t = (x_{t+1} - x_t - dt F(x_t)/gamma) / s; for the
    exact chain every z is an independent N(0, 1) draw, whatever the force (so a KS test of all of
    them checks every transition at once);
  * ``path_outcomes``: bin paths (x_t1, x_t2, ...) of many chains into hashable outcomes, the
    keys of ``exact_law.binned_path_law``: feed them to speculate.testing's chi-square checks;
  * ``chi2_power``: the power of a chi-square test against a given alternative law;
  * ``ks_power_bound``: a lower bound on the power of a KS test (DKW).

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> from speculate.domains.physics.checks import innovations
    >>> model = Langevin(force=DoubleWell(), dt=0.01)
    >>> traj = simulate(model, np.zeros((500, 1, 1)), 20, seed=0)
    >>> z = innovations(model, traj.positions)            # [500, 20, 1, 1]
    >>> z.shape, bool(abs(z.mean()) < 0.05)
    ((500, 20, 1, 1), True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

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


def _merge(expected: np.ndarray, *tables: np.ndarray, min_expected: float = 5.0):
    keep = expected >= min_expected
    out = [np.append(t[keep], t[~keep].sum()) for t in (expected, *tables)]
    nz = out[0] > 0
    return [t[nz] for t in out]


def chi2_power(p: np.ndarray, q: np.ndarray, n: int, alpha: float, two_sample: bool) -> float:
    """Power of the chi-square test at level alpha, n draws (per sample), null p, truth q.

    Noncentral chi-square approximation with noncentrality n sum (q - p)^2 / p (goodness of fit)
    or n sum (q - p)^2 / (p + q) (two samples of n each), after the same merging of small cells.
    """
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    ref = (p + q) / 2 if two_sample else p
    e, p2, q2 = _merge(ref * n, p, q)
    df = len(e) - 1
    lam = n * np.sum((q2 - p2) ** 2 / ((p2 + q2) if two_sample else p2))
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam))


def ks_power_bound(n: int, alpha: float, distance: float) -> float:
    """A lower bound on the power of the one-sample KS test (DKW inequality).

    The test at level alpha rejects when sup |F_n - F| exceeds c = sqrt(log(2/alpha) / (2n)); if the
    truth is at KS distance ``distance`` from the null, it fails to reject only if the empirical
    CDF strays by distance - c from the truth, which has probability at most 2 exp(-2 n (distance -
    c)^2).
    """
    c = np.sqrt(np.log(2.0 / alpha) / (2.0 * n))
    if distance <= c:
        return 0.0
    return float(max(0.0, 1.0 - 2.0 * np.exp(-2.0 * n * (distance - c) ** 2)))
