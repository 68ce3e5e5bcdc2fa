"""A Lennard-Jones fluid in a cubic periodic box: exact and short-cutoff forces, energy, g(r).

u(r) = 4 eps ((sigma/r)^12 - (sigma/r)^6), truncated and shifted at ``cutoff``. The EXACT target is
the sum over ALL pairs with the minimum-image convention and the largest spherical cutoff the
minimum image allows (L/2): O(N^2) per configuration, Numba-parallel over (configuration,
particle) on CPU, or torch on any device (``backend="torch", device="cuda"``). The cheap DRAFT is
the same potential with a short cutoff evaluated with cell lists (Numba): O(N) per configuration.
Positions need not be wrapped into the box; every routine applies the periodic images itself.

Example:
    >>> from speculate.domains.physics.lennard_jones import LennardJones, fcc_lattice
    >>> x0, box = fcc_lattice(n_cells=3, density=0.8)          # N = 4 * 3**3 = 108 particles
    >>> exact = LennardJones(box)                              # all pairs, cutoff L/2
    >>> draft = LennardJones(box, cutoff=2.5, method="cells")  # short cutoff, cell lists
    >>> F = exact(x0[None])                                    # [B=1, N=108, d=3]
    >>> F.shape, bool(abs(F).max() < 1e-9)                     # a perfect lattice is in balance
    ((1, 108, 3), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

# ---------------------------------------------------------------------------- Numba kernels


@numba.njit(cache=True, inline="always")
def _pair(r2, sig2, eps, rc2):
    """(force factor f with F_i = f (r_i - r_j), energy u) of one pair at squared distance r2."""
    if r2 >= rc2:
        return 0.0, 0.0
    s2 = sig2 / r2
    s6 = s2 * s2 * s2
    return 24.0 * eps * (2.0 * s6 * s6 - s6) / r2, 4.0 * eps * (s6 * s6 - s6)


@numba.njit(cache=True, inline="always")
def _image(v, L, inv_L):
    return v - L * np.floor(v * inv_L + 0.5)


@numba.njit(parallel=True, cache=True, nogil=True)
def _forces_all_pairs_rows(X, L, rc, eps, sig):
    """All pairs in 3-D, parallel over (configuration, particle)."""
    B, N, _ = X.shape
    F = np.zeros_like(X)
    rc2, sig2, inv_L = rc * rc, sig * sig, 1.0 / L
    for t in numba.prange(B * N):
        b, i = t // N, t % N
        f0 = 0.0
        f1 = 0.0
        f2 = 0.0
        x0, x1, x2 = X[b, i, 0], X[b, i, 1], X[b, i, 2]
        for j in range(N):
            if j == i:
                continue
            v0 = _image(x0 - X[b, j, 0], L, inv_L)
            v1 = _image(x1 - X[b, j, 1], L, inv_L)
            v2 = _image(x2 - X[b, j, 2], L, inv_L)
            f, _ = _pair(v0 * v0 + v1 * v1 + v2 * v2, sig2, eps, rc2)
            f0 += f * v0
            f1 += f * v1
            f2 += f * v2
        F[b, i, 0] = f0
        F[b, i, 1] = f1
        F[b, i, 2] = f2
    return F


@numba.njit(parallel=True, cache=True, nogil=True)
def _forces_all_pairs_nd(X, L, rc, eps, sig):
    """All pairs in any dimension d (the 3-D kernels above are the fast path)."""
    B, N, d = X.shape
    F = np.zeros_like(X)
    rc2, sig2, inv_L = rc * rc, sig * sig, 1.0 / L
    for t in numba.prange(B * N):
        b, i = t // N, t % N
        dr = np.empty(d)
        for j in range(N):
            if j == i:
                continue
            r2 = 0.0
            for k in range(d):
                dr[k] = _image(X[b, i, k] - X[b, j, k], L, inv_L)
                r2 += dr[k] * dr[k]
            f, _ = _pair(r2, sig2, eps, rc2)
            for k in range(d):
                F[b, i, k] += f * dr[k]
    return F


def _forces_all_pairs(X, L, rc, eps, sig):
    # One sequential loop over j per (configuration, particle): the force of a configuration is
    # bit-for-bit the same whatever batch it comes in (so plain and speculative runs use the same
    # function), and one configuration alone still uses every thread.
    if X.shape[2] != 3:
        return _forces_all_pairs_nd(X, L, rc, eps, sig)
    return _forces_all_pairs_rows(X, L, rc, eps, sig)


@numba.njit(parallel=True, cache=True, nogil=True)
def _energy_all_pairs(X, L, rc, eps, sig):
    B, N, d = X.shape
    E = np.zeros(B)
    rc2, sig2 = rc * rc, sig * sig
    c6 = (sig2 / rc2) ** 3
    shift = 4.0 * eps * (c6 * c6 - c6)                       # u(rc): the energy is shifted by it
    for b in numba.prange(B):
        e = 0.0
        for i in range(N):
            for j in range(i + 1, N):
                r2 = 0.0
                for k in range(d):
                    v = _image(X[b, i, k] - X[b, j, k], L, 1.0 / L)
                    r2 += v * v
                if r2 < rc2:
                    _, u = _pair(r2, sig2, eps, rc2)
                    e += u - shift
        E[b] = e
    return E


@numba.njit(parallel=True, cache=True, nogil=True)
def _forces_cells(X, L, rc, eps, sig):
    """Short-cutoff forces with cell lists (d = 3, at least 3 cells per side)."""
    B, N, _ = X.shape
    nc = int(L // rc)
    ncell = nc * nc * nc
    w = L / nc
    rc2, sig2, inv_L = rc * rc, sig * sig, 1.0 / L
    head = np.full((B, ncell), -1, np.int64)
    nxt = np.empty((B, N), np.int64)
    cell = np.empty((B, N, 3), np.int64)
    for b in numba.prange(B):                       # build one linked cell list per configuration
        for i in range(N):
            c = np.empty(3, np.int64)
            for k in range(3):
                x = X[b, i, k] - L * np.floor(X[b, i, k] / L)
                c[k] = int(x / w) % nc
                cell[b, i, k] = c[k]
            flat = (c[0] * nc + c[1]) * nc + c[2]
            nxt[b, i] = head[b, flat]
            head[b, flat] = i
    F = np.zeros_like(X)
    for t in numba.prange(B * N):
        b, i = t // N, t % N
        f0 = 0.0
        f1 = 0.0
        f2 = 0.0
        for o0 in range(-1, 2):
            for o1 in range(-1, 2):
                for o2 in range(-1, 2):
                    c0 = (cell[b, i, 0] + o0) % nc
                    c1 = (cell[b, i, 1] + o1) % nc
                    c2 = (cell[b, i, 2] + o2) % nc
                    j = head[b, (c0 * nc + c1) * nc + c2]
                    while j >= 0:
                        if j != i:
                            v0 = _image(X[b, i, 0] - X[b, j, 0], L, inv_L)
                            v1 = _image(X[b, i, 1] - X[b, j, 1], L, inv_L)
                            v2 = _image(X[b, i, 2] - X[b, j, 2], L, inv_L)
                            f, _ = _pair(v0 * v0 + v1 * v1 + v2 * v2, sig2, eps, rc2)
                            f0 += f * v0
                            f1 += f * v1
                            f2 += f * v2
                        j = nxt[b, j]
        F[b, i, 0] = f0
        F[b, i, 1] = f1
        F[b, i, 2] = f2
    return F


@numba.njit(parallel=True, cache=True, nogil=True)
def _rdf_counts(X, L, r_max, nbins):
    B, N, d = X.shape
    counts = np.zeros((B, nbins), np.int64)
    for b in numba.prange(B):
        for i in range(N):
            for j in range(i + 1, N):
                r2 = 0.0
                for k in range(d):
                    v = _image(X[b, i, k] - X[b, j, k], L, 1.0 / L)
                    r2 += v * v
                r = math.sqrt(r2)
                if r < r_max:
                    counts[b, int(r / r_max * nbins)] += 2
    return counts


# ---------------------------------------------------------------------------- torch kernel


def _forces_torch(X, L: float, rc: float, eps: float, sig: float, chunk_bytes: float = 2**28):
    """All-pairs minimum-image forces in torch, on X's device; chunked over the batch."""
    import torch

    B, N, d = X.shape
    per = max(1, int(chunk_bytes // (N * N * d * X.element_size() * 3)))
    eye = torch.eye(N, dtype=torch.bool, device=X.device)
    out = []
    for s in range(0, B, per):
        x = X[s : s + per]                                   # [b, N, d]
        dr = x[:, :, None, :] - x[:, None, :, :]             # [b, N, N, d]  r_i - r_j
        dr = dr - L * torch.round(dr / L)
        r2 = (dr * dr).sum(-1)                               # [b, N, N]
        keep = (r2 < rc * rc) & ~eye
        s2 = torch.where(keep, sig * sig / torch.where(keep, r2, 1.0), 0.0)
        s6 = s2 * s2 * s2
        f = 24.0 * eps * (2.0 * s6 * s6 - s6) / torch.where(keep, r2, 1.0)   # [b, N, N]
        out.append((f[..., None] * dr).sum(2))               # [b, N, d]
    return torch.cat(out)


# ---------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class LennardJones:
    """Lennard-Jones forces in a cubic periodic box of side ``box``.

    Args:
        box: side length L. cutoff: spherical cutoff (default and maximum: L/2, the exact target).
        method: "all_pairs" (O(N^2), every pair by minimum image) or "cells" (cell lists, O(N);
            needs d = 3 and a cutoff of at most L/3; it is the cheap draft's method).
        backend: "numba" (CPU) or "torch" (all pairs on ``device``, e.g. "cuda").
        epsilon, sigma: the LJ energy and length units.

    ``__call__(X[B, N, d]) -> F[B, N, d]`` takes and returns NumPy arrays (float64) whatever the
    backend; ``force_torch`` takes and returns tensors on the device.

    Example:
        >>> import numpy as np
        >>> lj = LennardJones(box=10.0)
        >>> X = np.array([[[0.0, 0.0, 0.0], [2 ** (1 / 6), 0.0, 0.0]]])   # at the minimum of u
        >>> bool(np.allclose(lj(X), 0.0)), round(float(lj.energy(X)[0] + 1.0), 3)
        (True, 0.0)
    """

    box: float
    cutoff: float | None = None
    method: str = "all_pairs"
    backend: str = "numba"
    device: str = "cpu"
    epsilon: float = 1.0
    sigma: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.box) and self.box > 0):
            raise ValueError(f"LennardJones: box must be finite and > 0, got {self.box}")
        rc = self.rc
        if not (0 < rc <= self.box / 2 * (1 + 1e-12)):
            raise ValueError(
                f"LennardJones: cutoff must be in (0, box/2 = {self.box / 2}], got {rc}"
            )
        if self.method not in ("all_pairs", "cells"):
            raise ValueError(
                f"LennardJones: method must be 'all_pairs' or 'cells', got {self.method!r}"
            )
        if self.backend not in ("numba", "torch"):
            raise ValueError(
                f"LennardJones: backend must be 'numba' or 'torch', got {self.backend!r}"
            )
        if self.method == "cells" and self.backend != "numba":
            raise ValueError("LennardJones: method='cells' is implemented for backend='numba' only")
        if not (self.epsilon > 0 and self.sigma > 0):
            raise ValueError("LennardJones: epsilon and sigma must be > 0")

    @property
    def rc(self) -> float:
        return self.box / 2 if self.cutoff is None else float(self.cutoff)

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 3:
            raise ValueError(f"LennardJones: configurations must be [B, N, d], got {X.shape}")
        return X

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        if self.backend == "torch":
            import torch

            Xt = torch.as_tensor(X, device=self.device)
            return self.force_torch(Xt).cpu().numpy()
        if self.method == "cells" and int(self.box // self.rc) >= 3 and X.shape[2] == 3:
            return _forces_cells(X, self.box, self.rc, self.epsilon, self.sigma)
        return _forces_all_pairs(X, self.box, self.rc, self.epsilon, self.sigma)

    force = __call__

    def force_torch(self, X):
        """Forces of torch configurations X [B, N, d] on their own device (all pairs)."""
        return _forces_torch(X, self.box, self.rc, self.epsilon, self.sigma)

    def energy(self, X: np.ndarray) -> np.ndarray:
        """Potential energy [B] (truncated and shifted at the cutoff), all pairs."""
        return _energy_all_pairs(self._check(X), self.box, self.rc, self.epsilon, self.sigma)


def fcc_lattice(n_cells: int, density: float, d: int = 3) -> tuple[np.ndarray, float]:
    """An fcc lattice of 4 n_cells^3 particles at ``density``: (positions [N, 3], box side L).

    N = 108, 256, 500, 864 for n_cells = 3, 4, 5, 6.
    """
    if d != 3:
        raise ValueError("fcc_lattice: only d = 3")
    if n_cells < 1 or density <= 0:
        raise ValueError("fcc_lattice: n_cells >= 1 and density > 0 required")
    N = 4 * n_cells**3
    L = (N / density) ** (1.0 / 3.0)
    a = L / n_cells
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]) + 0.25
    grid = np.stack(np.meshgrid(*[np.arange(n_cells)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    return ((grid + basis[None]) * a).reshape(-1, 3), float(L)


def radial_distribution(X: np.ndarray, box: float, r_max: float | None = None, nbins: int = 100):
    """g(r) of configurations X [B, N, 3]: (bin centres [nbins], g [B, nbins], counts [B, nbins]).

    Counts each pair once per particle (i.e. twice), normalised by the ideal-gas count
    N (N - 1)/L^3 * 4 pi r^2 dr at the same density.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    r_max = box / 2 if r_max is None else float(r_max)
    counts = _rdf_counts(X, float(box), r_max, int(nbins))
    edges = np.linspace(0.0, r_max, nbins + 1)
    N = X.shape[1]
    shell = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    ideal = N * (N - 1) / box**3 * shell
    return 0.5 * (edges[1:] + edges[:-1]), counts / ideal, counts
