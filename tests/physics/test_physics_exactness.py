"""speculative_simulate samples exactly the Euler-Maruyama chain of the exact force.

Fixture: a 1-D double well, dt = 0.05, 12500 replicas (rows) of N = 16 independent particles,
half started at x = +1.6 and half at -1.6 (a row-mixing bug shows as a sign error), lookahead 3,
so that steps 1, 2 and 8 fall in different rounds. Outcome per particle: the bins of
(x_1, x_2, x_8) with edges (0.8, 1.0, 1.2) (the -1.6 half mirrored): 100000 paths per half.

Per draft kind, 7 tests at ALPHA / 7 each (Bonferroni; ALPHA = speculate.testing.DEFAULT_ALPHA), all
from speculate.testing:
  * chi-square goodness of fit of each half's binned paths against the exact law (numerical
    integration, error < 1e-12);
  * two-sample chi-square of each half's binned paths against plain ``simulate``;
  * two-sample test of each half's raw (x_1, x_2, x_8) against plain ``simulate`` (KS on every
    coordinate and 16 random projections, Bonferroni inside);
  * KS of all 1.6 million standardised steps against N(0, 1).
Power (checked below from the exact laws): the two-sample chi-square catches a 4% drift error
(F -> 1.04 F, TV 0.025 on the bins) and the goodness of fit a 3% one (TV 0.019) with probability
>= 0.99 each; the goodness of fit catches ANY deviation of TV >= 0.019 on the bins with
probability >= 0.99; the KS test catches any per-step law at KS distance >= 0.0045 from N(0, 1)
with probability >= 0.99 (DKW bound).

Under ``-m slow`` the same test runs on four times as many replicas (25000 rows per half, 400000
paths): the goodness of fit then catches ANY deviation of TV >= 0.01 on the bins (and a 1.5% drift
error) with probability >= 0.99, the KS test any per-step law at KS distance 0.0023.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from speculate.domains.physics import (
    DoubleWell,
    Langevin,
    MuellerBrown,
    frozen_correction,
    simulate,
    speculative_simulate,
)
from speculate.domains.physics.checks import innovations, path_outcomes
from speculate.domains.physics.path_law import binned_path_law

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import (
    ConformanceCase,
    assert_categorical_matches,
    assert_continuous_matches,
    assert_same_categorical,
    assert_same_continuous,
    chi2_power,
    ks_power_bound,
)

DT, X0, EDGES, OBS, STEPS = 0.05, 1.6, (0.8, 1.0, 1.2), (1, 2, 8), 8
ROWS, N = 6250, 16                                   # per half: 100000 particle paths
SLOW_ROWS = 25000                                    # under -m slow: 400000

WELL = DoubleWell(1.0)
DRAFTS = {
    "function": DoubleWell(1.0, tilt=0.5),           # a wrong force: alpha ~ 0.87
    "frozen": "frozen",                              # training-free: alpha ~ 0.2 at this dt
    "corrected": frozen_correction(DoubleWell(1.2)),
}


class Scaled:
    """c * force: the planted drift error of the power calculation."""

    def __init__(self, force, c):
        self.force, self.c = force, c

    def __call__(self, X):
        return self.c * self.force(X)


@pytest.fixture(scope="module")
def exact_law():
    return binned_path_law(Langevin(force=WELL, dt=DT), X0, EDGES, STEPS, observe=OBS)


def halves(positions):
    """[2 rows, T, N, 1] -> the (x_1, x_2, x_8) paths of both halves, mirrored: 2 x [rows N, 3]."""
    rows = positions.shape[0] // 2
    P = positions[..., 0][:, list(OBS)]                              # [2 rows, 3, N]
    a = P[:rows].transpose(0, 2, 1).reshape(-1, len(OBS))
    b = -P[rows:].transpose(0, 2, 1).reshape(-1, len(OBS))
    return a, b


def x0(rows=ROWS):
    return np.concatenate([np.full((rows, N, 1), X0), np.full((rows, N, 1), -X0)])


@pytest.fixture(scope="module")
def plain_paths():
    traj = simulate(Langevin(force=WELL, dt=DT), x0(), STEPS, rng=12345)
    return halves(traj.positions)


def check_paths(draft, lookahead, exact_law, plain_paths, rows):
    model = Langevin(force=WELL, draft_force=DRAFTS[draft], dt=DT)
    traj = speculative_simulate(model, x0(rows), STEPS, lookahead=lookahead, rng=7)
    assert 0 < traj.stats.accepted < traj.stats.proposed        # both branches are exercised
    for name, half, ref in zip(("+1.6", "-1.6"), halves(traj.positions), plain_paths, strict=True):
        label = f"{draft}, start {name}"
        outcomes = path_outcomes(half, EDGES)
        assert_categorical_matches(outcomes, exact_law, alpha=ALPHA / 7, label=label)
        assert_same_categorical(outcomes, path_outcomes(ref, EDGES), alpha=ALPHA / 7, label=label)
        assert_same_continuous(half, ref, alpha=ALPHA / 7, label=label)
    z = innovations(model, traj.positions).ravel()                  # 1.6 million N(0, 1)
    assert_continuous_matches(z, stats.norm, alpha=ALPHA / 7, label=f"{draft}: standardised steps")


@pytest.mark.parametrize("draft, lookahead", [("function", 3), ("frozen", 3), ("corrected", 3),
                                              ("function", "auto")])
def test_speculative_paths_have_the_exact_law(draft, lookahead, exact_law, plain_paths):
    check_paths(draft, lookahead, exact_law, plain_paths, ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["function", "frozen", "corrected"])
def test_speculative_paths_have_the_exact_law_at_tv_001(draft, exact_law):
    plain = halves(simulate(Langevin(force=WELL, dt=DT), x0(SLOW_ROWS), STEPS, rng=54321).positions)
    check_paths(draft, 3, exact_law, plain, SLOW_ROWS)


def test_the_exactness_tests_have_power(exact_law):
    keys = sorted(exact_law)
    p = np.array([exact_law[k] for k in keys])
    n = ROWS * N
    for c, two_sample in ((1.04, True), (1.03, False)):
        wrong_model = Langevin(force=Scaled(WELL, c), dt=DT)
        wrong = binned_path_law(wrong_model, X0, EDGES, STEPS, observe=OBS)
        q = np.array([wrong[k] for k in keys])
        assert chi2_power(p, q, n, alpha=ALPHA / 7, two_sample=two_sample) >= 0.99
    case = ConformanceCase("paths", lambda n, seed: [], exact_law, n=n)
    assert case.detectable_tv(alpha=ALPHA / 7) <= 0.019
    assert ks_power_bound(2 * n * STEPS, 0.0045, alpha=ALPHA / 7) >= 0.99
    # the slow variant: four times the replicas
    slow = SLOW_ROWS * N
    assert ConformanceCase("paths", lambda n, seed: [], exact_law, n=slow).detectable_tv(alpha=ALPHA / 7) <= 0.01
    wrong = binned_path_law(Langevin(force=Scaled(WELL, 1.015), dt=DT), X0, EDGES, STEPS, observe=OBS)
    assert chi2_power(p, np.array([wrong[k] for k in keys]), slow, alpha=ALPHA / 7) >= 0.99
    assert ks_power_bound(2 * slow * STEPS, 0.0023, alpha=ALPHA / 7) >= 0.99


def test_a_biased_sampler_is_caught(exact_law):
    """The same check on plain simulation with a 4% drift error rejects (seeded)."""
    wrong = simulate(Langevin(force=Scaled(WELL, 1.04), dt=DT), x0()[:ROWS], STEPS, rng=3)
    paths = wrong.positions[..., 0][:, list(OBS)].transpose(0, 2, 1).reshape(-1, len(OBS))
    with pytest.raises(AssertionError, match="do not follow the reference law"):
        assert_categorical_matches(path_outcomes(paths, EDGES), exact_law, alpha=ALPHA / 7)


def test_seeded_runs_are_reproducible():
    model = Langevin(force=WELL, draft_force=DRAFTS["function"], dt=DT)
    a = speculative_simulate(model, np.full((3, 2, 1), 0.5), 30, lookahead=4, rng=11)
    b = speculative_simulate(model, np.full((3, 2, 1), 0.5), 30, lookahead=4, rng=11)
    np.testing.assert_array_equal(a.positions, b.positions)
    c = speculative_simulate(model, np.full((3, 2, 1), 0.5), 30, lookahead=4, rng=12)
    assert not np.array_equal(a.positions, c.positions)
    g = speculative_simulate(model, np.full((3, 2, 1), 0.5), 30, lookahead=4, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(a.positions, g.positions)  # an int seed = a Generator seeded with it
    for fn in (simulate, speculative_simulate):  # rng=None: unpredictable
        x, y = (fn(model, np.full((3, 2, 1), 0.5), 30, rng=None).positions for _ in range(2))
        assert not np.array_equal(x, y)
    with pytest.raises(ValueError, match="rng"):
        simulate(model, np.full((3, 2, 1), 0.5), 30, rng=-1)


def test_lookahead_zero_is_plain_simulation_through_the_loop():
    model = Langevin(force=WELL, draft_force=DRAFTS["function"], dt=DT)
    traj = speculative_simulate(model, np.full((4, 1, 1), 0.5), 25, lookahead=0, rng=1)
    assert traj.stats.target_calls == 25 and traj.stats.proposed == 0
    z = innovations(model, traj.positions)
    assert np.isfinite(z).all() and z.shape == (4, 25, 1, 1)


def test_mueller_brown_2d_steps_and_endpoints_are_exact():
    """2-D, 2 particles, frozen correction of a wrong draft: every step N(0, 1), endpoints vs plain.

    Two checks at ALPHA / 2: KS of the 0.8 million standardised steps (catches a per-step law
    at KS distance 0.005 w.p. >= 0.99) and a two-sample test of the final configurations
    (4 coordinates and 16 projections, 4000 replicas each).
    """
    mb = MuellerBrown(0.1)
    model = Langevin(force=mb, draft_force=frozen_correction(MuellerBrown(0.08)), dt=3e-4)
    X0 = np.tile(np.array(MuellerBrown.minima[:2]), (4000, 1, 1))       # [4000, 2, 2]
    spec = speculative_simulate(model, X0, 50, lookahead=6, rng=3)
    plain = simulate(model, X0, 50, rng=4)
    assert 0 < spec.stats.accepted < spec.stats.proposed
    z = innovations(model, spec.positions).ravel()
    assert_continuous_matches(z, stats.norm, alpha=ALPHA / 2, label="Mueller-Brown steps")
    assert_same_continuous(spec.final.reshape(4000, -1), plain.final.reshape(4000, -1),
                           alpha=ALPHA / 2, label="Mueller-Brown endpoints")


def test_auto_at_k0_runs_the_plain_chain_draw_for_draw():
    """With a fixed cost_ratio >= 1 no lookahead can pay: auto runs every step through the process's
    own plain path (LangevinProcess.plain, several steps per call of the loop), which is ``simulate``'s
    Euler-Maruyama step: the same configurations, draw for draw, and the same recorded trajectory."""
    from speculate.domains.physics import DoubleWell, Langevin, simulate, speculative_simulate

    model = Langevin(force=DoubleWell(), draft_force="frozen", dt=1e-3)
    x0 = np.zeros((3, 2, 1))
    spec = speculative_simulate(model, x0, 50, lookahead="auto", cost_ratio=2.0, rng=7, record_every=5)
    plain = simulate(model, x0, 50, rng=7, record_every=5)
    assert np.array_equal(spec.positions, plain.positions)
    assert set(spec.stats.lookahead_counts) == {0} and spec.stats.target_calls == 50


@pytest.mark.parametrize("n_steps", [1, 2, 3, 6])
def test_auto_measured_short_runs_finish(n_steps):
    """Regression: a measured ``lookahead="auto"`` run of 2 steps crashed in numpy's polyfit (no target
    call measured yet when the first plain stretch asked the rule for k). Every short run finishes, with
    every step recorded and a finite configuration."""
    from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate

    model = Langevin(force=DoubleWell(), draft_force="frozen", dt=1e-3)
    sim = speculative_simulate(model, np.zeros((2, 1, 1)), n_steps, lookahead="auto", rng=3)
    assert sim.positions.shape == (2, n_steps + 1, 1, 1) and np.isfinite(sim.final).all()
    assert sim.stats.steps == n_steps


@pytest.mark.parametrize("record_every", [1, 3, 7])
def test_plain_stretches_record_what_the_block_write_records(record_every):
    """LangevinProcess.plain without outcomes (what speculative_simulate runs: only the recorded steps are
    written, straight into the recorder) records exactly what the block write of every outcome does, for
    rows at different steps stopping at different lengths."""
    from speculate.domains.physics import DoubleWell, Langevin
    from speculate.domains.physics.langevin import Recorder
    from speculate.domains.physics.process import LangevinProcess, SimulationStats

    model = Langevin(force=DoubleWell(), dt=1e-2)
    x0 = np.linspace(-1, 1, 4).reshape(4, 1, 1)
    rows, n = np.array([0, 2, 3]), np.array([9, 4, 11])
    recs = []
    for keep in (True, False):
        rec = Recorder(x0, 40, record_every)
        rec.positions[:, 1:] = np.nan  # what is not recorded stays NaN in both
        proc = LangevinProcess(model, x0, rec, SimulationStats(steps=40), keep_outcomes=keep)
        proc.step[:] = [5, 0, 2, 13]  # rows at different steps
        out, used, _ = proc.plain(rows, n, np.random.default_rng(1))
        assert (out is None) == (not keep and record_every > 1) and used.tolist() == n.tolist()
        recs.append((rec.positions.copy(), proc.X.copy(), proc.step.copy()))
    for a, b in zip(*recs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_auto_continues_what_the_model_measured():
    """A model's measured ``lookahead="auto"`` control is kept per batch width and continued by its next
    run: the measuring rounds (k = 1, then 4) come once, not in every short run; a fixed cost_ratio, a
    fixed lookahead or another model keep nothing."""
    from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate

    model = Langevin(force=DoubleWell(), draft_force="frozen", dt=1e-3)
    x0 = np.zeros((2, 1, 1))
    first = speculative_simulate(model, x0, 30, lookahead="auto", rng=1)
    assert list(model.controls) == [(16, 2)] and first.stats.lookahead_counts.get(1, 0) >= 1
    ctl = model.controls[(16, 2)]
    rounds = ctl.rounds
    second = speculative_simulate(model, x0, 30, lookahead="auto", rng=2)
    assert model.controls[(16, 2)] is ctl and ctl.rounds > rounds  # the same control, continued
    assert ctl.call or ctl.plain_step  # its measurements survive the runs
    speculative_simulate(model, x0[:1], 5, lookahead="auto", rng=3)  # another width: its own control
    assert set(model.controls) == {(16, 2), (16, 1)}
    speculative_simulate(model, x0, 5, lookahead="auto", cost_ratio=0.1, rng=3)
    speculative_simulate(model, x0, 5, lookahead=3, rng=3)
    assert set(model.controls) == {(16, 2), (16, 1)}
    assert second.positions.shape == first.positions.shape
