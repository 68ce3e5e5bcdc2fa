"""The Langevin model and plain Euler-Maruyama simulation (the reference for the speculative path).

Statistical tests here are seeded and use speculate.testing.DEFAULT_ALPHA per test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from speculate.domains.physics import DoubleWell, Langevin, MuellerBrown, simulate
from speculate.domains.physics.path_law import binned_path_law

from speculate.testing import DEFAULT_ALPHA as ALPHA


@pytest.mark.parametrize("name, value", [("dt", 0.0), ("dt", -1e-3), ("kT", 0.0), ("gamma", -2.0),
                                         ("dt", math.inf), ("kT", math.nan)])
def test_nonpositive_or_nonfinite_parameters_rejected(name, value):
    with pytest.raises(ValueError, match=name):
        Langevin(force=DoubleWell(), **{name: value})


def test_bad_force_and_draft_rejected():
    with pytest.raises(TypeError, match="force must be callable"):
        Langevin(force=3.0)
    with pytest.raises(ValueError, match="draft_force"):
        Langevin(force=DoubleWell(), draft_force="freeze")
    with pytest.raises(TypeError, match="dt"):
        Langevin(force=DoubleWell(), dt="0.1")


def test_bad_x0_and_steps_rejected():
    model = Langevin(force=DoubleWell(), dt=0.01)
    with pytest.raises(ValueError, match="x0"):
        simulate(model, np.zeros(3), 5)
    with pytest.raises(ValueError, match="non-finite"):
        simulate(model, np.full((1, 1), np.nan), 5)
    with pytest.raises(ValueError, match="n_steps"):
        simulate(model, np.zeros((1, 1)), -1)
    with pytest.raises(ValueError, match="record_every"):
        simulate(model, np.zeros((1, 1)), 5, record_every=0)


def test_force_shape_mismatch_names_shapes():
    model = Langevin(force=lambda X: X[:, :, :1] * 0, dt=0.01)
    with pytest.raises(ValueError, match=r"returned shape \(1, 2, 1\).*\(1, 2, 2\)"):
        simulate(model, np.zeros((2, 2)), 3)


def test_nonfinite_force_names_the_step():
    # drift 10 per unit time, no noise to speak of: x_t = 0.05 + 0.1 t; NaN once x > 1 (t = 10)
    def force(X):
        F = np.full_like(X, 10.0)
        F[X > 1.0] = np.nan
        return F

    model = Langevin(force=force, dt=0.01, kT=1e-12)
    with pytest.raises(ValueError, match=r"force is not finite at step 10 \(particle 0"):
        simulate(model, np.full((1, 1), 0.05), 50)


def test_recording_and_shapes():
    model = Langevin(force=MuellerBrown(0.1), dt=1e-4)
    traj = simulate(model, np.zeros((3, 2, 2)), 10, rng=1, record_every=4)
    assert traj.positions.shape == (3, 3, 2, 2)
    assert traj.steps.tolist() == [0, 4, 8]
    assert traj.final.shape == (3, 2, 2)
    assert traj.stats.target_calls == 10 and traj.stats.calls_per_step == 1.0
    np.testing.assert_array_equal(traj.positions[:, 0], 0.0)
    again = simulate(model, np.zeros((3, 2, 2)), 10, rng=1, record_every=4)
    np.testing.assert_array_equal(traj.final, again.final)     # seeded: reproducible


def test_simulation_stats_extend_the_core_stats():
    from speculate.domains.physics import SimulationStats, speculative_simulate

    from speculate import Stats

    model = Langevin(force=DoubleWell(), draft_force=DoubleWell(tilt=0.5), dt=0.01)
    plain = simulate(model, np.zeros((3, 1, 1)), 20, rng=0).stats
    spec = speculative_simulate(model, np.zeros((3, 1, 1)), 20, lookahead=4, rng=0).stats
    for st in (plain, spec):
        assert type(st) is SimulationStats and isinstance(st, Stats)
        assert st.steps == 20 and st.emitted == 60 and st.wall_time > 0
        assert "target_configurations=" in st.summary() and "calls_per_step=" in st.summary()
        d = st.as_dict()
        assert d["calls_per_step"] == st.calls_per_step and d["draft_truncations"] == 0
    # a plain run is a run of rounds without drafts: one exact-force call per step
    assert (plain.rounds, plain.target_calls, plain.proposed, plain.calls_per_step) == (20, 20, 0, 1.0)
    assert plain.tokens_per_call == 1.0 and plain.target_configurations == 60
    assert spec.target_calls < 20 and spec.target_configurations == spec.proposed + spec.row_rounds


def test_one_step_transition_is_the_euler_maruyama_gaussian():
    """KS of the standardised one-step innovations (1 step, 20000 replicas x 2 particles x 2-D)."""
    pot = MuellerBrown(0.1)
    model = Langevin(force=pot, dt=1e-3, kT=0.7, gamma=1.3)
    X0 = np.random.default_rng(5).uniform(-1, 1, size=(20000, 2, 2))
    traj = simulate(model, X0, 1, rng=2)
    z = (traj.final - model.mean(X0, pot.force(X0))) / model.noise_scale
    assert stats.kstest(z.ravel(), "norm").pvalue > ALPHA
    assert abs(model.noise_scale - math.sqrt(2 * 0.7 * 1e-3 / 1.3)) < 1e-15


def test_binned_path_law_matches_plain_simulation():
    """Chi-square of 3-step bin paths against the exact law (64 cells, n = 200000, at ALPHA)."""
    model = Langevin(force=DoubleWell(1.0), dt=0.05)
    edges = [-1.0, 0.0, 1.0]
    law = binned_path_law(model, 0.3, edges, 3)
    traj = simulate(model, np.full((200000, 1, 1), 0.3), 3, rng=3)
    lab = np.searchsorted(edges, traj.positions[:, 1:, 0, 0], side="right")    # [n, 3]
    keys = sorted(law)
    index = {k: i for i, k in enumerate(keys)}
    counts = np.bincount([index[tuple(r)] for r in lab], minlength=len(keys))
    p = np.array([law[k] for k in keys])
    keep = p * len(lab) >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep], p[~keep].sum()) * len(lab)
    assert stats.chisquare(obs, exp).pvalue > ALPHA


def test_binned_path_law_is_converged():
    model = Langevin(force=DoubleWell(1.0, tilt=0.2), dt=0.05)
    edges = [-1.0, 0.0, 1.0]
    a = binned_path_law(model, 0.3, edges, 2)
    b = binned_path_law(model, 0.3, edges, 2, lo=-9.0, hi=9.0, order=48)   # wider, finer
    assert max(abs(a[k] - b[k]) for k in a) < 1e-12
    c = binned_path_law(model, 0.3, edges, 3)
    d = binned_path_law(model, 0.3, edges, 3, order=16)                     # coarser
    assert max(abs(c[k] - d[k]) for k in c) < 1e-12
    assert abs(sum(c.values()) - 1) < 1e-12


@pytest.mark.slow
def test_long_run_approaches_boltzmann_law():
    """At small dt the Euler-Maruyama chain samples exp(-U/kT) up to O(dt): a model sanity check."""
    well = DoubleWell(1.0)
    model = Langevin(force=well, dt=2e-3, kT=0.5)
    traj = simulate(model, np.zeros((400, 1, 1)), 20000, rng=4, record_every=100)
    x = traj.positions[:, 20:, 0, 0].ravel()                      # burn-in 2000 steps
    hist, edges = np.histogram(x, bins=40, range=(-2, 2), density=True)
    mid = 0.5 * (edges[1:] + edges[:-1])
    assert np.abs(hist - well.stationary_density_1d(mid, 0.5)).max() < 0.05


@pytest.mark.parametrize("draft", ["function", "frozen", "corrected"])
def test_speculative_recording_every_few_steps_keeps_the_same_trajectory(draft):
    """record_every > 1 skips the bookkeeping of blocks that cross no recorded step: the recorded
    positions must be those of the same seeded run recorded at every step."""
    from speculate.domains.physics import frozen_correction, speculative_simulate

    well = DoubleWell()
    cheap = DoubleWell(barrier=1.5)  # not a constant offset: the corrected draft is not exact either
    d = {"function": cheap, "frozen": "frozen", "corrected": frozen_correction(cheap)}[draft]
    model = Langevin(force=well, draft_force=d, dt=0.05)
    x0 = np.full((7, 2, 1), 0.4)
    every = speculative_simulate(model, x0, 30, lookahead=4, rng=5)
    sparse = speculative_simulate(model, x0, 30, lookahead=4, rng=5, record_every=3)
    np.testing.assert_array_equal(sparse.positions, every.positions[:, ::3])
    np.testing.assert_array_equal(sparse.final, every.final)
    assert every.stats.rejections > 0  # the reflection path is part of the run
