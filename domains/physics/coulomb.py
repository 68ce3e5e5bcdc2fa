"""Charged particles in a cubic periodic box: an exact Ewald target and a screened (Debye-Hueckel) draft.

Units: Gaussian, Coulomb constant 1, so the pair energy is q_i q_j / r. The EXACT target is the
Ewald sum of the periodic Coulomb energy (every image of every pair), split with parameter alpha:

    E = 1/2 sum_{i != j} q_i q_j erfc(alpha r_ij) / r_ij                          (real space, r < L/2)
      + (2 pi / V) sum_{k != 0} exp(-k^2 / (4 alpha^2)) / k^2 |S(k)|^2,  S(k) = sum_j q_j e^{i k.r_j}
      - alpha / sqrt(pi) sum_i q_i^2                                              (self term)

with k = 2 pi n / L, |n_x|, |n_y|, |n_z| <= k_max (tin-foil boundary; the box must be neutral). The
defaults alpha = 3.5 / r_cut and k_max = ceil(3.5 alpha L / pi) make the truncation errors of
both sums about erfc(3.5) ~ 1e-6 relative. The cheap DRAFT is the Debye-Hueckel (Yukawa) pair
force q_i q_j exp(-kappa r) / r with a short cutoff: no reciprocal sum. `IonicFluid` adds a
Lennard-Jones core (so that opposite charges do not collapse) to both.

Example (the Madelung constant of rock salt, from the Ewald energy of its conventional cell):
    >>> import numpy as np
    >>> from speculate.domains.physics.coulomb import Ewald, rock_salt
    >>> X, q, box = rock_salt(n_cells=1)                       # 8 ions, nearest-neighbour distance 1
    >>> E = Ewald(box, q).energy(X[None])[0]
    >>> round(float(-E / 4), 5)                                # 4 ion pairs: E = -4 M / a
    1.74756
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import erfc

from .lennard_jones import LennardJones, fcc_lattice

__all__ = ["DebyeHueckel", "Ewald", "IonicFluid", "ionic_fluid", "rock_salt"]


def _minimum_image(X: np.ndarray, box: float) -> tuple[np.ndarray, np.ndarray]:
    """Pair vectors r_i - r_j [B, N, N, 3] by minimum image, and distances [B, N, N] (inf on the diagonal)."""
    dr = X[:, :, None, :] - X[:, None, :, :]
    dr -= box * np.round(dr / box)
    r = np.sqrt(np.einsum("bijd,bijd->bij", dr, dr))
    idx = np.arange(X.shape[1])
    r[:, idx, idx] = np.inf
    return dr, r


def _pairs(X: np.ndarray, box: float, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pair vectors [B, N, N, 3], distances with 1 outside the cutoff, mask of pairs within it)."""
    dr, r = _minimum_image(X, box)
    inside = r < cutoff
    return dr, np.where(inside, r, 1.0), inside


def _check(X: np.ndarray, charges: np.ndarray, who: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 3 or X.shape[2] != 3 or X.shape[1] != charges.shape[0]:
        raise ValueError(f"{who}: configurations must be [B, {charges.shape[0]}, 3], got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{who}: configurations contain NaN or inf")
    return X


@dataclass(frozen=True, eq=False)
class Ewald:
    """Exact periodic Coulomb forces and energy by Ewald summation (see the module docstring).

    Args:
        box: side L of the cubic box. charges: [N], summing to zero.
        alpha: splitting parameter (default 3.5 / r_cut). r_cut: real-space cutoff (default, and at
            most, L/2). k_max: reciprocal vectors per axis (default ceil(3.5 alpha L / pi)).

    ``__call__(X[B, N, 3]) -> F[B, N, 3]``; ``energy(X) -> [B]``. Memory per configuration: N^2 pairs and N K
    phases, K = ((2 k_max + 1)^3 - 1) / 2 reciprocal vectors (``energy`` holds all B at once).
    """

    box: float
    charges: np.ndarray
    alpha: float | None = None
    r_cut: float | None = None
    k_max: int | None = None
    _k: np.ndarray = field(init=False, repr=False)  # [K, 3] reciprocal vectors (half space)
    _a: np.ndarray = field(init=False, repr=False)  # [K] 2 * exp(-k^2 / 4 alpha^2) / k^2 (both halves)

    def __post_init__(self) -> None:
        q = np.asarray(self.charges, dtype=np.float64)
        if q.ndim != 1 or q.size < 2 or not np.all(np.isfinite(q)):
            raise ValueError(f"Ewald: charges must be a finite vector of N >= 2 values, got shape {q.shape}")
        if abs(q.sum()) > 1e-9 * max(1.0, np.abs(q).sum()):
            raise ValueError(f"Ewald: the box must be neutral (tin-foil Ewald), but the charges sum to {q.sum()}")
        if not (math.isfinite(self.box) and self.box > 0):
            raise ValueError(f"Ewald: box must be finite and > 0, got {self.box}")
        rc = self.box / 2 if self.r_cut is None else float(self.r_cut)
        if not (0 < rc <= self.box / 2 * (1 + 1e-12)):
            raise ValueError(f"Ewald: r_cut must be in (0, box/2 = {self.box / 2}], got {rc}")
        alpha = 3.5 / rc if self.alpha is None else float(self.alpha)
        if not alpha > 0:
            raise ValueError(f"Ewald: alpha must be > 0, got {alpha}")
        k_max = math.ceil(3.5 * alpha * self.box / math.pi) if self.k_max is None else int(self.k_max)
        if k_max < 1:
            raise ValueError(f"Ewald: k_max must be >= 1, got {k_max}")
        n = np.arange(-k_max, k_max + 1)
        grid = np.stack(np.meshgrid(n, n, n, indexing="ij"), -1).reshape(-1, 3)
        # half space: k and -k give the same |S(k)|^2, so keep one of each pair and weigh it twice
        first = np.where(grid[:, 0] != 0, grid[:, 0], np.where(grid[:, 1] != 0, grid[:, 1], grid[:, 2]))
        grid = grid[first > 0]
        k = 2 * math.pi / self.box * grid  # [K, 3]
        k2 = np.einsum("kd,kd->k", k, k)
        object.__setattr__(self, "charges", q)
        object.__setattr__(self, "r_cut", rc)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "k_max", k_max)
        object.__setattr__(self, "_k", k)
        object.__setattr__(self, "_a", 2 * np.exp(-k2 / (4 * alpha * alpha)) / k2)

    def _structure(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        phase = X @ self._k.T  # [B, N, K]
        c, s = np.cos(phase), np.sin(phase)
        return c, s, np.stack([self.charges @ c, self.charges @ s])  # S = Re + i Im: [2, B, K]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = _check(X, self.charges, "Ewald")
        return np.concatenate([self._force(x[None]) for x in X]) if len(X) else np.zeros_like(X)

    force = __call__

    def _force(self, X: np.ndarray) -> np.ndarray:
        # one configuration at a time: a configuration's force must not depend on the batch it comes
        # in (plain and speculative runs score batches of different sizes); do not batch this away
        q, a = self.charges, self.alpha
        dr, rs, inside = _pairs(X, self.box, self.r_cut)
        g = erfc(a * rs) / rs + 2 * a / math.sqrt(math.pi) * np.exp(-((a * rs) ** 2))
        w = np.where(inside, q[:, None] * q[None, :] * g / rs**2, 0.0)  # [B, N, N]
        F = np.einsum("bij,bijd->bid", w, dr)
        c, s, S = self._structure(X)
        # F_i = (4 pi q_i / V) sum_k A(k) k Im(conj(S(k)) e^{i k.r_i}) over all k != 0, A = exp(-k^2/4a^2)/k^2;
        # k and -k give equal terms, so the half-space weights a_k = 2 A(k) carry the same sum
        im = s * S[0][:, None, :] - c * S[1][:, None, :]  # Im(conj(S) e^{i k r_i}) [B, N, K]
        F += (4 * math.pi / self.box**3) * q[None, :, None] * ((im * self._a) @ self._k)
        return F

    def energy(self, X: np.ndarray) -> np.ndarray:
        X = _check(X, self.charges, "Ewald")
        q, a = self.charges, self.alpha
        _, rs, inside = _pairs(X, self.box, self.r_cut)
        e_real = 0.5 * np.where(inside, q[:, None] * q[None, :] * erfc(a * rs) / rs, 0.0).sum(axis=(1, 2))
        _, _, S = self._structure(X)
        e_recip = (2 * math.pi / self.box**3) * ((S[0] ** 2 + S[1] ** 2) @ self._a)
        return e_real + e_recip - a / math.sqrt(math.pi) * np.sum(q * q)


@dataclass(frozen=True, eq=False)
class DebyeHueckel:
    """Screened Coulomb (Yukawa) pair forces q_i q_j exp(-kappa r) / r, cut at ``cutoff``, minimum image.

    The cheap draft for :class:`Ewald`: O(N^2) pair terms with no reciprocal sum (kappa sets how
    fast the screened interaction dies; the default 1 / cutoff keeps the draft close to the real-space
    part of the Ewald force).
    """

    box: float
    charges: np.ndarray
    cutoff: float = 2.5
    kappa: float | None = None

    def __post_init__(self) -> None:
        q = np.asarray(self.charges, dtype=np.float64)
        if q.ndim != 1 or not np.all(np.isfinite(q)):
            raise ValueError("DebyeHueckel: charges must be a finite vector")
        if not (0 < self.cutoff <= self.box / 2 * (1 + 1e-12)):
            raise ValueError(f"DebyeHueckel: cutoff must be in (0, box/2 = {self.box / 2}], got {self.cutoff}")
        kappa = 1.0 / self.cutoff if self.kappa is None else float(self.kappa)
        if not kappa >= 0:
            raise ValueError(f"DebyeHueckel: kappa must be >= 0, got {kappa}")
        object.__setattr__(self, "charges", q)
        object.__setattr__(self, "kappa", kappa)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = _check(X, self.charges, "DebyeHueckel")
        q, k = self.charges, self.kappa
        dr, rs, inside = _pairs(X, self.box, self.cutoff)
        w = np.where(inside, q[:, None] * q[None, :] * np.exp(-k * rs) * (1 + k * rs) / rs**3, 0.0)
        return np.einsum("bij,bijd->bid", w, dr)

    force = __call__


@dataclass(frozen=True, eq=False)
class IonicFluid:
    """A Lennard-Jones core plus charges: ``force`` (LJ + Ewald, exact) and ``draft`` (LJ + Debye-Hueckel)."""

    box: float
    charges: np.ndarray
    draft_cutoff: float = 2.5
    lj: LennardJones = field(init=False, repr=False)
    ewald: Ewald = field(init=False, repr=False)
    screened: DebyeHueckel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lj", LennardJones(self.box))
        object.__setattr__(self, "ewald", Ewald(self.box, self.charges))
        rc = min(self.draft_cutoff, self.box / 2)  # a small box caps the cutoff at L/2
        object.__setattr__(self, "screened", DebyeHueckel(self.box, self.charges, cutoff=rc))

    def force(self, X: np.ndarray) -> np.ndarray:
        return self.lj(X) + self.ewald(X)

    def draft(self, X: np.ndarray) -> np.ndarray:
        return self.lj(X) + self.screened(X)

    def energy(self, X: np.ndarray) -> np.ndarray:
        return self.lj.energy(X) + self.ewald.energy(X)


def rock_salt(n_cells: int = 1, spacing: float = 1.0) -> tuple[np.ndarray, np.ndarray, float]:
    """The NaCl lattice: (positions [8 n^3, 3], charges +-1, box side 2 n spacing)."""
    if n_cells < 1:
        raise ValueError(f"rock_salt: n_cells must be >= 1, got {n_cells}")
    m = 2 * n_cells
    g = np.stack(np.meshgrid(*[np.arange(m)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return g * spacing, np.where(g.sum(axis=1) % 2 == 0, 1.0, -1.0), m * spacing


def ionic_fluid(n_cells: int = 2, density: float = 0.8, charge: float = 1.0) -> tuple[np.ndarray, IonicFluid]:
    """A neutral LJ + Coulomb fluid on an fcc lattice (N = 4 n^3, alternating charges +-``charge``)."""
    x0, box = fcc_lattice(n_cells=n_cells, density=density)
    q = np.where(np.arange(len(x0)) % 2 == 0, charge, -charge)
    return x0, IonicFluid(box, q)
