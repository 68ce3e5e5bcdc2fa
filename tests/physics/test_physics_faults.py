
"""Faults in the middle of a run: an exception raised by the exact force or the draft force in round
r of many propagates unchanged, with the round loop's note naming the phase, the round and the rows
(KeyboardInterrupt too); nothing outlives the failed call, so the next call with the same model and
seed returns exactly the Simulation of an undisturbed run (and of a fresh model).

The physics domain keeps no cache between calls: a run's state (committed configurations, the
frozen drafts' memory, the recorder) belongs to that call's process and is dropped with it; the
model and the draft objects are immutable. These tests hold it to that for every kind of draft.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from speculate.domains.physics import DoubleWell, Langevin, frozen_correction, simulate, speculative_simulate

WELL, CHEAP = DoubleWell(1.0), DoubleWell(1.5, tilt=0.5)  # not a constant offset: no draft is exact
X0 = np.array([[[1.2], [-0.4]], [[0.1], [0.9]], [[-1.1], [0.3]], [[0.6], [-0.8]]])  # 4 rows in different states
STEPS, K, SEED = 40, 3, 17
TIMES = {"draft_time", "target_time", "verify_time", "commit_time", "wall_time", "cost_ratio", "steps_per_second"}


class Injector:
    """A force that counts its calls, logs the round each call belongs to (the exact force's calls
    so far + 1: one exact-force call per round), and raises ``error`` on call ``at`` when armed."""

    def __init__(self, force, rounds=None):
        self.force, self.rounds = force, rounds  # rounds: the exact force's Injector, to read the round from
        self.calls, self.log, self.at, self.error = 0, [], None, None

    def __call__(self, X):
        self.calls += 1
        self.log.append(self.rounds.calls + 1 if self.rounds is not None else self.calls)
        if self.calls == self.at:
            raise self.error(f"injected failure at call {self.calls}")
        return self.force(X)

    def reset(self, at=None, error=None):
        self.calls, self.log, self.at, self.error = 0, [], at, error


def make(kind):
    exact = Injector(WELL)
    cheap = Injector(CHEAP, rounds=exact)
    draft = {"function": cheap, "frozen": "frozen", "corrected": frozen_correction(cheap)}[kind]
    return Langevin(force=exact, draft_force=draft, dt=0.05), exact, cheap


def same_simulation(a, b):
    np.testing.assert_array_equal(a.positions, b.positions)
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.final, b.final)
    assert _counters(a.stats) == _counters(b.stats)


def _counters(stats):
    """The stats' fields except times, arrays as lists (derived rates may be NaN: left out)."""
    return {f.name: (v.tolist() if isinstance(v := getattr(stats, f.name), np.ndarray) else v)
            for f in dataclasses.fields(stats) if f.name not in TIMES}


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("kind, where", [("function", "force"), ("function", "draft"), ("frozen", "force"),
                                         ("corrected", "force"), ("corrected", "draft")])
def test_a_force_failing_mid_run_propagates_with_its_round_and_leaves_nothing_behind(kind, where, error):
    model, exact, cheap = make(kind)
    ref = speculative_simulate(model, X0, STEPS, lookahead=K, rng=SEED)  # undisturbed
    assert ref.stats.rounds >= 10 and ref.stats.rejections > 0
    fn = exact if where == "force" else cheap
    at = len(fn.log) // 2  # a call in the middle of the run
    r = fn.log[at - 1]  # its round
    assert 3 <= r <= ref.stats.rounds - 3  # round r of many
    exact.reset(), cheap.reset()
    fn.reset(at=at, error=error)
    with pytest.raises(error, match=f"injected failure at call {at}") as info:
        speculative_simulate(model, X0, STEPS, lookahead=K, rng=SEED)
    phase = "score" if where == "force" else "propose"
    notes = getattr(info.value, "__notes__", [])
    assert any(f"raised in {phase} of round {r} (rows " in n for n in notes), notes
    fn.reset()  # disarmed: the same model and seed again
    again = speculative_simulate(model, X0, STEPS, lookahead=K, rng=SEED)
    same_simulation(again, ref)
    fresh, _, _ = make(kind)
    same_simulation(speculative_simulate(fresh, X0, STEPS, lookahead=K, rng=SEED), ref)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_plain_simulate_names_the_failing_step_and_leaves_nothing_behind(error):
    model, exact, _ = make("frozen")
    ref = simulate(model, X0, STEPS, rng=SEED)
    exact.reset(at=STEPS // 2, error=error)
    with pytest.raises(error, match="injected failure") as info:
        simulate(model, X0, STEPS, rng=SEED)
    notes = getattr(info.value, "__notes__", [])
    assert any(f"simulate: raised in step {STEPS // 2 - 1} of {STEPS}" in n for n in notes), notes
    exact.reset()
    same_simulation(simulate(model, X0, STEPS, rng=SEED), ref)
    same_simulation(simulate(make("frozen")[0], X0, STEPS, rng=SEED), ref)


def test_a_nonfinite_force_reached_mid_run_names_its_step_and_round():
    """The domain's own error (a non-finite exact force at a configuration the chain reaches) is
    raised in score (the committed configuration) or commit (a reached draft), with the note; the
    same call with a finite force afterwards is undisturbed."""
    calls = {"n": 0, "poison": True}

    def force(X):
        calls["n"] += 1
        F = WELL(X)
        if calls["poison"] and calls["n"] >= 6:
            F[X[..., 0] > 0.9] = np.nan  # from round 6 on, undefined to the right of 0.9
        return F

    model = Langevin(force=force, draft_force=CHEAP, dt=0.05)
    with pytest.raises(ValueError, match="force is not finite at step") as info:
        speculative_simulate(model, np.full((4, 1, 1), 1.0), STEPS, lookahead=K, rng=SEED)
    assert any("speculate.rounds.run: raised in" in n and "of round 6" in n for n in info.value.__notes__)
    calls.update(n=0, poison=False)
    ref = speculative_simulate(model, np.full((4, 1, 1), 1.0), STEPS, lookahead=K, rng=SEED)
    fresh = Langevin(force=WELL, draft_force=CHEAP, dt=0.05)
    same_simulation(speculative_simulate(fresh, np.full((4, 1, 1), 1.0), STEPS, lookahead=K, rng=SEED), ref)
