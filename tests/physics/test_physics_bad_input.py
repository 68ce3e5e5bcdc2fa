"""Bad input to speculative_simulate: clear errors naming the problem; no wrong samples, no hang."""

from __future__ import annotations

import math

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


# ------------------------------------------------------------------------------------------------
# regressions of the Reliability issue (found by tests/physics/test_physics_fuzz.py)


def _writes_into_its_input(force):
    def f(X):
        F = force(X)
        X += 1.0  # a force that wraps or shifts its input in place
        return F

    return f


@pytest.mark.parametrize("draft", ["function", "frozen", "corrected"])
def test_a_force_that_writes_into_its_input_does_not_change_the_chain(draft):
    """Before: simulate's chain and the drafted configurations (the draft got a view of them, and
    the exact force was then evaluated at the shifted ones) moved with the force's writes."""
    well, cheap = DoubleWell(), DoubleWell(3.0)
    writes = {"function": _writes_into_its_input(cheap), "frozen": "frozen",
              "corrected": frozen_correction(_writes_into_its_input(cheap))}[draft]
    clean = {"function": cheap, "frozen": "frozen", "corrected": frozen_correction(cheap)}[draft]
    x0 = np.array([[[0.2]], [[-0.9]]])
    a = speculative_simulate(Langevin(force=_writes_into_its_input(well), draft_force=writes, dt=0.1), x0, 12,
                             lookahead=3, rng=1)
    b = speculative_simulate(Langevin(force=well, draft_force=clean, dt=0.1), x0, 12, lookahead=3, rng=1)
    np.testing.assert_array_equal(a.positions, b.positions)
    assert b.stats.rejections > 0
    a = simulate(Langevin(force=_writes_into_its_input(well), dt=0.05), x0, 12, rng=1)
    np.testing.assert_array_equal(a.positions, simulate(Langevin(force=well, dt=0.05), x0, 12, rng=1).positions)


def test_outputs_of_any_real_dtype_or_container_are_taken_as_they_are():
    """Before: a read-only output of a draft force (np.broadcast_to) crashed ("assignment
    destination is read-only") and a bfloat16 torch tensor raised TypeError from torch."""
    import torch

    x0 = np.zeros((2, 1, 1))
    ref = speculative_simulate(Langevin(force=np.negative, draft_force=lambda X: np.full(X.shape, 0.5), dt=0.01),
                               x0, 8, lookahead=3, rng=2)
    for out in (lambda X: np.broadcast_to(0.5, X.shape),                      # read-only
                lambda X: torch.full(X.shape, 0.5, dtype=torch.bfloat16),     # 0.5 exactly in bfloat16
                lambda X: np.full(X.shape, 0.5).tolist(),
                lambda X: np.full(X.shape, 0.5, np.float16)):
        for draft in (out, frozen_correction(out)):
            exact = ref if not isinstance(draft, type(frozen_correction(out))) else None
            sim = speculative_simulate(Langevin(force=np.negative, draft_force=draft, dt=0.01), x0, 8,
                                       lookahead=3, rng=2)
            assert np.isfinite(sim.positions).all()
            if exact is not None:
                np.testing.assert_array_equal(sim.positions, exact.positions)
    ints = simulate(Langevin(force=lambda X: np.ones(X.shape, np.int64), dt=0.01), x0, 5, rng=2)
    floats = simulate(Langevin(force=np.ones_like, dt=0.01), x0, 5, rng=2)
    np.testing.assert_array_equal(ints.positions, floats.positions)


@pytest.mark.parametrize("value, error, match", [
    (lambda X: X + 1j, TypeError, r"force output must hold real numbers.*complex"),   # before: imaginary part dropped
    (lambda X: X > 0, TypeError, r"force output must hold real numbers.*bool"),       # before: read as 0 / 1
    (lambda X: "F", TypeError, r"force output must hold real numbers"),
    (lambda X: [[1.0], [1.0, 2.0]], ValueError, r"force output is not an array of real numbers"),
    (lambda X: {"F": 1}, TypeError, r"force output must hold real numbers"),
])
def test_force_outputs_that_are_not_real_numbers_are_rejected(value, error, match):
    for fn, model in ((simulate, Langevin(force=value, dt=0.01)),
                      (speculative_simulate, Langevin(force=value, dt=0.01)),
                      (speculative_simulate, Langevin(force=DoubleWell(), draft_force=value, dt=0.01))):
        with pytest.raises(error, match=match):
            fn(model, np.zeros((2, 1, 1)), 4)


@pytest.mark.parametrize("x0, error, match", [
    (np.ones((2, 1), complex) + 1j, TypeError, r"x0 must hold real numbers.*complex"),
    (np.ones((2, 1), bool), TypeError, r"x0 must hold real numbers.*bool"),
    ([["1.0", "a"]], TypeError, r"x0 must hold real numbers"),
    ([[1.0], [1.0, 2.0]], ValueError, r"x0 is not an array of real numbers"),
    (np.zeros((0, 2, 1)), ValueError, r"x0 must have shape .*at least one replica"),
    (np.array([[np.nan]]), ValueError, r"x0 contains non-finite values \(first at index \(0, 0\)"),
])
def test_bad_initial_configurations_are_rejected(x0, error, match):
    for fn in (simulate, speculative_simulate):
        with pytest.raises(error, match=match):
            fn(Langevin(force=DoubleWell(), dt=0.01), x0, 3)


def test_a_huge_but_finite_force_never_reaches_the_kernel():
    """Before: an exact or draft force of 1e200 (finite; the chain moves by 1e198 per step) made the
    Gaussian kernel raise "probabilities contain NaN or inf" where simulate ran: the coupling's
    squared distance overflowed. Such a draft is now not verified (kept with probability 0 anyway)."""
    huge = lambda X: np.full(X.shape, 1e200)  # noqa: E731
    x0 = np.zeros((2, 1, 2))
    plain = simulate(Langevin(force=huge, dt=0.01), x0, 5, rng=0)
    sim = speculative_simulate(Langevin(force=huge, draft_force=DoubleWell(), dt=0.01), x0, 5, lookahead=3, rng=0)
    assert np.isfinite(sim.positions).all() and sim.positions.max() > 1e198 and plain.positions.max() > 1e198
    assert sim.stats.accepted == 0 and sim.stats.draft_truncations > 0
    sim = speculative_simulate(Langevin(force=DoubleWell(), draft_force=huge, dt=0.01), x0, 5, lookahead=3, rng=0)
    assert np.isfinite(sim.positions).all() and np.abs(sim.positions).max() < 10 and sim.stats.accepted == 0


@pytest.mark.parametrize("draft", ["frozen", "function"])
def test_an_overflowing_chain_raises_at_the_same_step_in_both_samplers(draft):
    """Before: simulate returned inf positions (the last step's x + dt F overflowed unchecked) and
    speculative_simulate raised a kernel error. Now both name step 1 (x_1 = 5e307, x_2 = 1e308 could
    overflow with its noise: beyond forces.MEAN_LIMIT = 9e307)."""
    force = lambda X: np.full(X.shape, 5e307)  # noqa: E731
    model = Langevin(force=force, draft_force=force if draft == "function" else "frozen", dt=1.0)
    for fn in (simulate, speculative_simulate):
        with pytest.raises(ValueError, match=r"mean x \+ dt F / gamma overflows at step 1 .*particle 0"):
            fn(model, np.zeros((1, 1, 1)), 3, rng=0)


def test_parameters_are_python_floats_and_their_scales_are_checked():
    """Before: float16 parameters were combined in float16 (dt = kT = float16(300) gave an infinite
    noise scale) and scales that overflow or underflow (2 kT dt = 1e600 or 1e-600) passed, giving
    inf or 0 noise."""
    model = Langevin(force=DoubleWell(), dt=np.float16(300), kT=np.float16(300))
    assert type(model.dt) is float and model.noise_scale == pytest.approx(300 * 2**0.5)
    for kw, what in ((dict(dt=1e300, kT=1e300), "noise scale"), (dict(dt=1e-300, kT=1e-300), "noise scale"),
                     (dict(dt=1e300, gamma=1e-300), "dt / gamma")):
        with pytest.raises(ValueError, match=f"Langevin: (the )?{what}.*rescale"):
            Langevin(force=DoubleWell(), **kw)


def test_bad_round_loop_arguments_are_rejected_before_any_work():
    """Before: max_lookahead=inf raised OverflowError, max_lookahead='3' or cost_ratio='a' a bare
    comparison TypeError, max_lookahead=2.5 TypeError from range(), from inside the round loop."""
    calls = []
    model = Langevin(force=lambda X: calls.append(1) or -X, dt=0.01)
    for kw, error, match in ((dict(max_lookahead=math.inf), TypeError, "max_lookahead"),
                             (dict(max_lookahead="3"), TypeError, "max_lookahead"),
                             (dict(max_lookahead=2.5), TypeError, "max_lookahead"),
                             (dict(max_lookahead=True), TypeError, "max_lookahead"),
                             (dict(max_lookahead=0), ValueError, "max_lookahead"),
                             (dict(cost_ratio="a"), TypeError, "cost_ratio"),
                             (dict(cost_ratio=-1.0), ValueError, "cost_ratio"),
                             (dict(lookahead="AUTO"), TypeError, "lookahead")):
        with pytest.raises(error, match=match):
            speculative_simulate(model, np.zeros((1, 1)), 5, **{"lookahead": "auto", **kw})
    for n in (10**30, 2**62 + 1):
        with pytest.raises(ValueError, match=r"n_steps must be an integer in 0\.\.2\*\*62"):
            speculative_simulate(model, np.zeros((1, 1)), n)
    with pytest.raises(ValueError, match="record fewer configurations"):
        simulate(model, np.zeros((1, 1)), 2**62)  # the recorder would need 2^65 bytes
    assert not calls
