"""The built-in systems: analytic potentials, Lennard-Jones kernels, the neural potential."""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.physics import DoubleWell, LennardJones, MuellerBrown, fcc_lattice, radial_distribution


def numeric_force(energy, X, h=1e-6, n_particles=None):
    """-grad energy by central differences, X [1, N, d] (first n_particles particles only)."""
    F = np.zeros_like(X)
    n = X.shape[1] if n_particles is None else n_particles
    for idx in np.ndindex(n, X.shape[2]):
        Xp, Xm = X.copy(), X.copy()
        Xp[(0, *idx)] += h
        Xm[(0, *idx)] -= h
        F[(0, *idx)] = -(energy(Xp)[0] - energy(Xm)[0]) / (2 * h)
    return F


@pytest.mark.parametrize(
    "pot, d",
    [(DoubleWell(1.5), 1), (DoubleWell(1.0, stiffness=2.0, tilt=0.3), 2), (MuellerBrown(0.1), 2)],
)
def test_analytic_force_is_minus_gradient(pot, d):
    X = np.random.default_rng(0).uniform(-1.0, 1.5, size=(1, 3, d))
    np.testing.assert_allclose(pot.force(X), numeric_force(pot.energy, X), rtol=1e-6, atol=1e-6)


def test_mueller_brown_minima():
    mb = MuellerBrown()
    for m in mb.minima:
        F = mb.force(np.array([[m]]))
        assert np.linalg.norm(F) < 0.5          # minima are quoted to 3 decimals


def test_double_well_stationary_density_normalised():
    x = np.linspace(-6, 6, 20001)
    assert abs(np.trapezoid(DoubleWell(2.0, tilt=0.2).stationary_density_1d(x, 0.7), x) - 1) < 1e-9


def test_potentials_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\[B, N, d\]"):
        DoubleWell().force(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="d=2"):
        MuellerBrown().force(np.zeros((1, 1, 3)))


@pytest.fixture(scope="module")
def lj_batch():
    x0, L = fcc_lattice(3, 0.8)                                  # N = 108, L = 5.13
    rng = np.random.default_rng(1)
    X = x0[None] + 0.08 * rng.standard_normal((4, *x0.shape))
    X[1] += L * rng.integers(-2, 3, size=x0.shape)               # unwrapped images: same physics
    return X, L


def test_lj_lattice_in_balance():
    x0, L = fcc_lattice(3, 0.9)          # odd n_cells: no pair sits exactly at the cutoff L/2
    assert x0.shape == (108, 3) and fcc_lattice(6, 0.8)[0].shape == (864, 3)
    assert np.abs(LennardJones(L)(x0[None])).max() < 1e-9


def test_lj_force_is_minus_gradient(lj_batch):
    X, L = lj_batch
    lj = LennardJones(L, cutoff=2.0)                             # gradient of the shifted energy
    num = numeric_force(lj.energy, X[:1], n_particles=5)[:, :5]
    np.testing.assert_allclose(lj(X[:1])[:, :5], num, rtol=1e-5, atol=1e-5)


def test_lj_periodic_images_do_not_matter(lj_batch):
    X, L = lj_batch
    lj = LennardJones(L)
    wrapped = X - L * np.floor(X / L)
    np.testing.assert_allclose(lj(X), lj(wrapped), atol=1e-9)
    np.testing.assert_allclose(lj.energy(X), lj.energy(wrapped), rtol=1e-12)


def test_lj_torch_and_numba_agree(lj_batch):
    pytest.importorskip("torch")
    X, L = lj_batch
    np.testing.assert_allclose(LennardJones(L, backend="torch")(X), LennardJones(L)(X), atol=1e-9)


def test_lj_cells_match_all_pairs_at_same_cutoff():
    x0, L = fcc_lattice(5, 0.8)                      # L = 8.55: 3 cells of 2.85 at rc 2.5
    X = x0[None] + 0.1 * np.random.default_rng(2).standard_normal((3, *x0.shape))
    cells = LennardJones(L, cutoff=2.5, method="cells")
    assert int(L // cells.rc) >= 3                              # the cell-list path is exercised
    np.testing.assert_allclose(cells(X), LennardJones(L, cutoff=2.5)(X), atol=1e-10)
    # the short cutoff is a real approximation of the exact force, but a close one
    exact = LennardJones(L)(X)
    err = np.linalg.norm(cells(X) - exact) / np.linalg.norm(exact)
    assert 1e-4 < err < 0.05


def test_lj_overlap_gives_nonfinite_force():
    X = np.zeros((1, 2, 3))
    assert not np.isfinite(LennardJones(10.0)(X)).all()


def test_lj_bad_parameters():
    with pytest.raises(ValueError, match="cutoff"):
        LennardJones(5.0, cutoff=3.0)
    with pytest.raises(ValueError, match="method"):
        LennardJones(5.0, method="fast")
    with pytest.raises(ValueError, match="box"):
        LennardJones(-1.0)


def test_rdf_of_ideal_gas_is_one():
    rng = np.random.default_rng(3)
    L = 6.0
    X = rng.uniform(0, L, size=(200, 100, 3))
    _, g, counts = radial_distribution(X, L, nbins=10)
    # Poisson-ish counts; 200 configurations x ~10^3 pairs per bin at the outer bins
    assert np.abs(g.mean(0)[3:] - 1).max() < 0.05
    assert counts.sum() == np.sum(counts)


@pytest.mark.gpu
def test_lj_torch_on_cuda_matches_cpu(lj_batch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    X, L = lj_batch
    gpu = LennardJones(L, backend="torch", device="cuda")(X)
    np.testing.assert_allclose(gpu, LennardJones(L)(X), atol=1e-8)


def test_mlp_potential_force_is_minus_gradient_and_batch_consistent():
    torch = pytest.importorskip("torch")
    from speculate.domains.physics.neural import MLPPotential, TorchForce

    torch.manual_seed(0)
    f = TorchForce(MLPPotential(d=2, width=16, depth=2), dtype=torch.float64)
    X = np.random.default_rng(0).standard_normal((5, 2, 2))
    np.testing.assert_allclose(f(X[:1]), numeric_force(f.energy, X[:1]), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(f(X)[2:3], f(X[2:3]), rtol=1e-12, atol=1e-14)


def test_fit_potential_learns_double_well():
    torch = pytest.importorskip("torch")
    from speculate.domains.physics.neural import MLPPotential, TorchForce, fit_potential

    torch.manual_seed(0)
    well = DoubleWell(1.0)
    X = np.random.default_rng(0).uniform(-1.6, 1.6, size=(2048, 1, 1))
    module = MLPPotential(d=1, width=32, depth=2)
    before = np.linalg.norm(TorchForce(module)(X) - well.force(X)) / np.linalg.norm(well.force(X))
    info = fit_potential(module, well.energy, well.force, X, steps=300, batch=256, lr=1e-2)
    assert info["relative_force_rmse"] < 0.1 < before


@pytest.mark.gpu
def test_torch_force_on_cuda_matches_cpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from speculate.domains.physics.neural import MLPPotential, TorchForce

    torch.manual_seed(0)
    module = MLPPotential(d=2, width=64, depth=2)
    X = np.random.default_rng(0).standard_normal((9, 3, 2))
    cpu = TorchForce(module, device="cpu", dtype=torch.float64)(X)
    gpu = TorchForce(module, device="cuda", dtype=torch.float64)(X)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-9, atol=1e-12)
