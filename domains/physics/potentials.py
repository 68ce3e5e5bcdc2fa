"""Analytic potentials with a known stationary law: the correctness fixtures.

Each potential acts on a batch of configurations ``X[B, N, d]``: N independent particles in the
same external field. ``energy(X)`` returns ``[B]`` (summed over particles) and ``force(X)`` (also
``potential(X)``) returns ``-grad energy`` with the shape of X. The continuous-time overdamped
Langevin SDE dX = F/gamma dt + sqrt(2 kT/gamma) dW has the Boltzmann law exp(-U/kT)/Z as its
stationary law; the Euler-Maruyama chain's stationary law differs from it by O(dt).

Example:
    >>> import numpy as np
    >>> well = DoubleWell(barrier=2.0)
    >>> X = np.array([[[1.0]], [[0.0]]])            # B=2 configurations of N=1 particle in d=1
    >>> well.energy(X).tolist(), well.force(X)[:, 0, 0].tolist()
    ([0.0, 2.0], [-0.0, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _as_batch(X: np.ndarray, d: int | None, name: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 3:
        raise ValueError(f"{name}: configurations must have shape [B, N, d], got {X.shape}")
    if d is not None and X.shape[2] != d:
        raise ValueError(f"{name}: expected d={d} coordinates per particle, got {X.shape[2]}")
    return X


@dataclass(frozen=True)
class DoubleWell:
    """U(x) = barrier * (x_0^2 - 1)^2 + stiffness/2 * |x_{1:}|^2 for every particle, in any d >= 1.

    Minima at x_0 = +-1 (the other coordinates 0), barrier height ``barrier`` at x_0 = 0; in
    d >= 2 the extra coordinates are harmonic with spring constant ``stiffness``. ``tilt`` adds
    ``tilt * x_0`` (an asymmetric well), useful for a draft that is slightly wrong.

    Example:
        >>> import numpy as np
        >>> DoubleWell(barrier=1.0, tilt=0.5).force(np.zeros((1, 1, 1)))[0, 0, 0]
        np.float64(-0.5)
    """

    barrier: float = 1.0
    stiffness: float = 1.0
    tilt: float = 0.0

    def __post_init__(self) -> None:
        for name in ("barrier", "stiffness", "tilt"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"DoubleWell: {name} must be finite")

    def energy(self, X: np.ndarray) -> np.ndarray:
        X = _as_batch(X, None, "DoubleWell.energy")
        x0 = X[..., 0]                                             # [B, N]
        u = self.barrier * (x0**2 - 1.0) ** 2 + self.tilt * x0
        u = u + 0.5 * self.stiffness * np.sum(X[..., 1:] ** 2, axis=-1)
        return u.sum(axis=1)                                       # [B]

    def force(self, X: np.ndarray) -> np.ndarray:
        X = _as_batch(X, None, "DoubleWell.force")
        with np.errstate(over="ignore", invalid="ignore"):  # far out: inf, which the samplers handle
            F = -self.stiffness * X                                # [B, N, d]
            x0 = X[..., 0]
            F[..., 0] = -4.0 * self.barrier * x0 * (x0**2 - 1.0) - self.tilt
        return F

    __call__ = force

    def stationary_density_1d(self, x: np.ndarray, kT: float) -> np.ndarray:
        """The normalised Boltzmann density of the first coordinate, exp(-U(x)/kT)/Z."""
        grid = np.linspace(-6.0, 6.0, 24001)
        u = self.barrier * (grid**2 - 1.0) ** 2 + self.tilt * grid
        w = np.exp(-(u - u.min()) / kT)
        Z = np.trapezoid(w, grid)
        x = np.asarray(x, dtype=np.float64)
        ux = self.barrier * (x**2 - 1.0) ** 2 + self.tilt * x
        return np.exp(-(ux - u.min()) / kT) / Z


def _mb_default(values: tuple[float, ...]) -> np.ndarray:
    return np.array(values, dtype=np.float64)


@dataclass(frozen=True)
class MuellerBrown:
    """The Mueller-Brown surface (Mueller & Brown 1979), times ``scale``, in d = 2.

    U(x, y) = scale * sum_i A_i exp(a_i (x - x_i)^2 + b_i (x - x_i)(y - y_i) + c_i (y - y_i)^2),
    three minima (the deepest near (-0.558, 1.442), U = -146.7) joined by two saddles. With
    scale = 0.1 the barriers are a few kT at kT = 1.

    Example:
        >>> import numpy as np
        >>> mb = MuellerBrown()
        >>> round(float(mb.energy(np.array([[[-0.558, 1.442]]]))[0]), 1)
        -146.7
    """

    scale: float = 1.0
    A: np.ndarray = field(default_factory=lambda: _mb_default((-200.0, -100.0, -170.0, 15.0)))
    a: np.ndarray = field(default_factory=lambda: _mb_default((-1.0, -1.0, -6.5, 0.7)))
    b: np.ndarray = field(default_factory=lambda: _mb_default((0.0, 0.0, 11.0, 0.6)))
    c: np.ndarray = field(default_factory=lambda: _mb_default((-10.0, -10.0, -6.5, 0.7)))
    x0: np.ndarray = field(default_factory=lambda: _mb_default((1.0, 0.0, -0.5, -1.0)))
    y0: np.ndarray = field(default_factory=lambda: _mb_default((0.0, 0.5, 1.5, 1.0)))

    def _terms(self, X: np.ndarray):
        X = _as_batch(X, 2, "MuellerBrown")
        dx = X[..., 0, None] - self.x0                             # [B, N, 4]
        dy = X[..., 1, None] - self.y0                             # [B, N, 4]
        e = self.scale * self.A * np.exp(self.a * dx**2 + self.b * dx * dy + self.c * dy**2)
        return dx, dy, e

    def energy(self, X: np.ndarray) -> np.ndarray:
        _, _, e = self._terms(X)
        return e.sum(axis=(1, 2))                                  # [B]

    def force(self, X: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):  # far out: inf or NaN, which the samplers handle
            dx, dy, e = self._terms(X)
            fx = -(e * (2.0 * self.a * dx + self.b * dy)).sum(axis=-1)  # [B, N]
            fy = -(e * (self.b * dx + 2.0 * self.c * dy)).sum(axis=-1)
        return np.stack([fx, fy], axis=-1)                         # [B, N, 2]

    __call__ = force

    minima = ((-0.558, 1.442), (0.623, 0.028), (-0.050, 0.467))
