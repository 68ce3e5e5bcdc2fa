"""Charged particles: the Ewald target is right (Madelung constant, alpha independence, forces =
-grad energy, Newton's third law), the Debye-Hueckel draft is the screened pair force, bad input is
refused, and speculative runs with the ionic fluid agree with plain ones.

The two-sample check follows tests/physics/test_physics_lennard_jones.py: B = 256 replicas of
N = 32 ions (LJ core + Ewald, density 0.8, kT = 1, dt = 5e-4) run 20 steps speculatively and
plainly, once with the Debye-Hueckel draft (about 1% of the drafts rejected) and once with the
frozen draft (about a quarter rejected, so that the reflection path carries many steps). The
total energy and two g(r) shell counts per replica are compared with assert_same_continuous
(two-sample KS on 3 features + 16 projections, Bonferroni inside), and every standardised step
with N(0, 1). Two checks per draft at ALPHA / 2 each (ALPHA = speculate.testing.DEFAULT_ALPHA).
Power: each two-sample KS test catches a KS distance of 0.5 (a 1.35 sd shift of a Gaussian
feature) with probability >= 0.99 (test_ionic_tests_have_power).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from speculate.domains.physics import Langevin, simulate, speculative_simulate
from speculate.domains.physics.checks import innovations
from speculate.domains.physics.coulomb import DebyeHueckel, Ewald, IonicFluid, ionic_fluid, rock_salt
from speculate.domains.physics.lennard_jones import radial_distribution

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_continuous_matches, assert_same_continuous

MADELUNG_NACL = 1.747564594633182


@pytest.mark.parametrize("n_cells", [1, 2])
def test_madelung_constant_of_rock_salt(n_cells):
    X, q, box = rock_salt(n_cells)
    E = Ewald(box, q).energy(X[None])[0]
    assert abs(-E / (len(q) / 2) - MADELUNG_NACL) < 1e-5


def test_energy_does_not_depend_on_the_splitting():
    X, q, box = rock_salt(2)
    X = X + 0.1 * np.random.default_rng(0).standard_normal(X.shape)  # off the lattice
    energies = [Ewald(box, q, alpha=a, k_max=14).energy(X[None])[0] for a in (1.6, 2.0, 2.5)]
    assert np.ptp(energies) < 1e-4 * abs(energies[0])
    assert abs(Ewald(box, q).energy(X[None])[0] - energies[-1]) < 1e-4 * abs(energies[0])


def _random_neutral(n=16, box=4.0, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, box, (1, n, 3)), np.where(np.arange(n) % 2 == 0, 1.0, -1.0), box


def test_forces_are_minus_the_energy_gradient():
    X, q, box = _random_neutral()
    ew = Ewald(box, q)
    F, h = ew(X), 1e-5
    Fd = np.zeros_like(F)
    for i in range(X.shape[1]):
        for d in range(3):
            Xp, Xm = X.copy(), X.copy()
            Xp[0, i, d] += h
            Xm[0, i, d] -= h
            Fd[0, i, d] = -(ew.energy(Xp)[0] - ew.energy(Xm)[0]) / (2 * h)
    np.testing.assert_allclose(F, Fd, atol=1e-6 * np.abs(F).max())


def test_forces_sum_to_zero_translate_and_do_not_depend_on_the_batch():
    X, q, box = _random_neutral(seed=1)
    X2 = np.concatenate([X, X + 0.3])  # a rigid translation: the same forces
    for force in (Ewald(box, q), DebyeHueckel(box, q, cutoff=1.5)):
        np.testing.assert_array_equal(force(X2)[1], force(X2[1:2])[0])
    F = Ewald(box, q)(X2)
    assert np.abs(F.sum(axis=1)).max() < 1e-9
    np.testing.assert_allclose(F[0], F[1], atol=1e-9)


def test_debye_hueckel_is_the_screened_pair_force():
    X = np.array([[[1.0, 1.0, 1.0], [2.5, 1.0, 1.0]]])
    q = np.array([1.0, -1.0])
    r, kappa = 1.5, 0.7
    F = DebyeHueckel(10.0, q, cutoff=4.0, kappa=kappa)(X)
    mag = math.exp(-kappa * r) * (1 + kappa * r) / r**2  # attractive: particle 0 pulled towards +x
    np.testing.assert_allclose(F[0, 0], [mag, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(F[0, 1], [-mag, 0, 0], rtol=1e-12)
    assert np.all(DebyeHueckel(10.0, q, cutoff=1.0)(X) == 0)  # beyond the cutoff


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Ewald(4.0, np.array([1.0, 1.0])), "neutral"),
        (lambda: Ewald(4.0, np.array([1.0, -1.0]), r_cut=3.0), "r_cut"),
        (lambda: Ewald(-1.0, np.array([1.0, -1.0])), "box"),
        (lambda: DebyeHueckel(4.0, np.array([1.0, -1.0]), cutoff=3.0), "cutoff"),
        (lambda: Ewald(4.0, np.array([1.0, -1.0]))(np.zeros((1, 3, 3))), r"\[B, 2, 3\]"),
        (lambda: Ewald(4.0, np.array([1.0, -1.0]))(np.full((1, 2, 3), np.nan)), "NaN"),
    ],
)
def test_bad_input_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _features(X, system: IonicFluid):
    _, _, counts = radial_distribution(X, system.box, nbins=40)  # [B, 40], r < L/2
    half = counts.shape[1] // 2
    return np.column_stack([system.energy(X), counts[:, :half].sum(1), counts[:, half:].sum(1)])


@pytest.mark.parametrize("draft", ["debye-hueckel", "frozen"])
def test_ionic_speculative_matches_plain(draft):
    x0, system = ionic_fluid(n_cells=2)  # N = 32
    model = Langevin(force=system.force, draft_force=system.draft if draft == "debye-hueckel" else draft,
                     dt=5e-4, kT=1.0)
    X0 = np.repeat(x0[None], 256, axis=0)
    spec = speculative_simulate(model, X0, 20, lookahead=4, rng=31)
    plain = simulate(model, X0, 20, rng=32)
    if draft == "debye-hueckel":
        assert spec.stats.calls_per_step < 0.5  # the screened draft is close: most drafts are kept
    else:  # the frozen draft is rejected often: the reflection path carries a large share of the steps
        assert spec.stats.rejections >= 1000
    label = f"ionic fluid N=32, {draft} draft: (energy, 2 shell counts)"
    assert_same_continuous(_features(spec.final, system), _features(plain.final, system), alpha=ALPHA / 2, label=label)
    z = innovations(model, spec.positions).ravel()
    assert_continuous_matches(z, stats.norm, alpha=ALPHA / 2, label="standardised steps")


def test_ionic_tests_have_power():
    n, per_test = 256, ALPHA / 2 / 19  # 3 features + 16 projections
    c = np.sqrt(np.log(2 / per_test) / 2) * np.sqrt(2 / n)  # two-sample KS critical value
    eps = 2 * np.sqrt(np.log(400) / (2 * n))  # each ECDF within eps/2 with probability .995
    assert c + eps <= 0.5
    assert 2 * stats.norm.cdf(1.35 / 2) - 1 >= 0.5  # a 1.35 sd shift is that far
