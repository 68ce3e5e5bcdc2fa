"""Bad input to speculative_simulate: clear errors naming the problem; no wrong samples, no hang."""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.physics import DoubleWell, Langevin, frozen_correction, simulate, speculative_simulate


def wall(F_value, limit):
    """Constant force F_value, NaN beyond x > limit."""

    def force(X):
        F = np.full_like(X, F_value)
        F[X > limit] = np.nan
        return F

    return force


def test_draft_with_wrong_shape():
    model = Langevin(force=DoubleWell(), draft_force=lambda X: X[:, :1], dt=0.01)
    with pytest.raises(ValueError, match=r"draft_force returned shape \(1, 1, 1\).*\(1, 2, 1\)"):
        speculative_simulate(model, np.zeros((2, 1)), 5)


def test_target_with_wrong_shape():
    model = Langevin(force=lambda X: X[:1], draft_force=DoubleWell(), dt=0.01)
    with pytest.raises(ValueError, match=r"force returned shape"):
        speculative_simulate(model, np.zeros((3, 2, 1)), 5, lookahead=2)


@pytest.mark.parametrize("draft", ["frozen", "function"])
def test_nonfinite_target_at_a_reached_configuration_names_the_step(draft):
    # row 1: x_t = 0.05 + 0.1 t (no noise to speak of): NaN from x_10 = 1.05 on; row 0 stays clear
    exact = wall(10.0, 1.0)
    d = "frozen" if draft == "frozen" else (lambda X: np.full_like(X, 10.0))
    model = Langevin(force=exact, draft_force=d, dt=0.01, kT=1e-12)
    with pytest.raises(ValueError, match=r"force is not finite at step 10 \(row 1, particle 0"):
        speculative_simulate(model, np.array([[[-5.0]], [[0.05]]]), 40, lookahead=4, rng=0)


def test_nonfinite_target_at_an_unreached_draft_is_harmless():
    # the exact chain stays near 0; the draft jumps to x = 100 where the exact force is NaN
    model = Langevin(force=wall(0.0, 1.0), draft_force=lambda X: np.full_like(X, 1e4), dt=0.01,
                     kT=1e-6)
    traj = speculative_simulate(model, np.zeros((3, 1, 1)), 20, lookahead=3, rng=0)
    assert np.isfinite(traj.positions).all() and np.abs(traj.positions).max() < 0.01
    assert traj.stats.accepted == 0


@pytest.mark.parametrize("corrected", [False, True])
def test_nonfinite_draft_truncates_the_draft(corrected):
    cheap = wall(0.0, 0.2)
    draft = frozen_correction(cheap) if corrected else cheap
    model = Langevin(force=DoubleWell(), draft_force=draft, dt=0.01)
    traj = speculative_simulate(model, np.full((4, 1, 1), 0.0), 200, lookahead=6, rng=0)
    assert np.isfinite(traj.positions).all()
    assert traj.stats.draft_truncations > 0 and traj.stats.accepted > 0


def test_bad_arguments():
    model = Langevin(force=DoubleWell(), dt=0.01)
    with pytest.raises(TypeError, match="Langevin"):
        speculative_simulate(DoubleWell(), np.zeros((1, 1)), 5)
    with pytest.raises(ValueError, match="x0"):
        speculative_simulate(model, np.zeros(4), 5)
    with pytest.raises(ValueError, match="n_steps"):
        speculative_simulate(model, np.zeros((1, 1)), -3)
    with pytest.raises(ValueError, match="lookahead"):
        speculative_simulate(model, np.zeros((1, 1)), 5, lookahead=-1)
    with pytest.raises(TypeError, match="lookahead"):
        speculative_simulate(model, np.zeros((1, 1)), 5, lookahead=2.5)
    with pytest.raises(ValueError, match="dt"):
        Langevin(force=DoubleWell(), dt=-0.01)


def test_zero_steps_returns_x0():
    model = Langevin(force=DoubleWell(), dt=0.01)
    for fn in (simulate, speculative_simulate):
        traj = fn(model, np.ones((2, 1)), 0)
        assert traj.positions.shape == (1, 2, 1)
        np.testing.assert_array_equal(traj.final, np.ones((2, 1)))


def test_overflowing_draft_is_cut_short_not_an_error():
    # free particle; the draft's mean x + dt F overflows to inf (F = 1.7e308, dt = 2)
    model = Langevin(force=np.zeros_like, draft_force=lambda X: np.full_like(X, 1.7e308), dt=2.0)
    with np.errstate(over="ignore"):
        traj = speculative_simulate(model, np.zeros((2, 1, 1)), 10, lookahead=3, rng=0)
    assert np.isfinite(traj.positions).all() and traj.stats.draft_truncations > 0
