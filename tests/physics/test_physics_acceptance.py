"""Reflection-coupling acceptance: 2 Phi(-delta/2) per drafted step, seen in the run's statistics.

A draft whose force is the exact one plus a constant c has the same delta = sqrt(dt/(2 gamma kT))
|c| at every step, so every drafted step is kept independently with probability a = 2 Phi(-delta/2)
and the number of kept drafts per round is truncated-geometric. Tests at alpha = 1e-6 / 3 each.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from speculate.domains.physics import Langevin, MuellerBrown, speculative_simulate
from speculate.domains.physics.checks import chi2_power

from speculate import theory
from speculate.testing import assert_categorical_matches

ALPHA = 1e-6 / 3
POT = MuellerBrown(0.1)
DT, KT, GAMMA, K = 1e-3, 0.8, 1.5, 4
DELTA = 0.6


class Offset:
    """F + c: a draft at constant distance delta from the target in noise units."""

    def __init__(self, force, c):
        self.force, self.c = force, c

    def __call__(self, X):
        return self.force(X) + self.c


def offset_for(delta, shape):
    direction = np.random.default_rng(0).standard_normal(shape)
    return direction / np.linalg.norm(direction) * delta / math.sqrt(DT / (2 * GAMMA * KT))


def test_delta_of_the_model():
    c = offset_for(DELTA, (2, 2))
    model = Langevin(force=POT, dt=DT, kT=KT, gamma=GAMMA)
    X = np.random.default_rng(1).uniform(-1, 1, size=(5, 2, 2))
    np.testing.assert_allclose(model.delta(Offset(POT, c)(X), POT(X)), DELTA, rtol=1e-12)


def test_acceptance_matches_two_phi_minus_half_delta():
    c = offset_for(DELTA, (2, 2))
    model = Langevin(force=POT, draft_force=Offset(POT, c), dt=DT, kT=KT, gamma=GAMMA)
    X0 = np.tile(np.array(MuellerBrown.minima[:2]), (4000, 1, 1))       # [4000, 2, 2]
    traj = speculative_simulate(model, X0, 60, lookahead=K, seed=5)
    a = 2 * stats.norm.cdf(-DELTA / 2)                                   # 0.764
    core = traj.stats.core
    hist = traj.stats.accepted_per_position                              # [K + 1] row-rounds
    pmf = theory.accepted_length_pmf(a, K)
    kept = np.repeat(np.arange(K + 1), hist)                             # one per row-round
    assert_categorical_matches(kept, pmf, alpha=ALPHA, label="accepted-length histogram")
    # the per-draft estimate accepted / (accepted + rejections) has sd sqrt(a (1-a) / trials)
    trials = core.accepted + core.rejections
    assert abs(core.alpha - a) < stats.norm.isf(ALPHA / 2) * math.sqrt(a * (1 - a) / trials)
    # accepted / proposed = E[kept drafts] / K
    mean_kept = float(np.dot(np.arange(K + 1), pmf))
    sd = math.sqrt(float(np.dot((np.arange(K + 1) - mean_kept) ** 2, pmf)) / hist.sum()) / K
    assert abs(traj.stats.acceptance_rate - mean_kept / K) < stats.norm.isf(ALPHA / 2) * sd
    # power: a histogram from a' = a - 0.01 is caught with probability >= 0.99
    wrong = theory.accepted_length_pmf(a - 0.01, K)
    assert chi2_power(pmf, wrong, int(hist.sum()), ALPHA, two_sample=False) >= 0.99
    # steps per row per target call = 1 + kept drafts: expected_tokens(a, K) = 3.14
    z = stats.norm.isf(ALPHA / 2)
    assert abs(core.tokens_per_call - theory.expected_tokens(a, K)) < z * sd * K


def test_perfect_draft_is_always_kept():
    model = Langevin(force=POT, draft_force=POT, dt=DT)
    traj = speculative_simulate(model, np.zeros((3, 1, 2)), 50, lookahead=4, seed=0)
    assert traj.stats.accepted == traj.stats.proposed
    assert traj.stats.target_calls == 10                   # 5 steps per call: 4 drafts + 1 bonus
