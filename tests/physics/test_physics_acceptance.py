"""Reflection-coupling acceptance: 2 Phi(-delta/2) per drafted step, seen in the run's statistics.

A draft whose force is the exact one plus a constant c has the same delta = sqrt(dt/(2 gamma kT))
|c| at every step, so every drafted step is kept independently with probability a = 2 Phi(-delta/2)
and the number of kept drafts per round is truncated-geometric (with the round's drafted length).
The significance level is speculate.testing.DEFAULT_ALPHA, split over the checks of a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from speculate.domains.physics import (
    Langevin,
    LangevinProcess,
    MuellerBrown,
    SimulationStats,
    speculative_simulate,
)
from speculate.domains.physics.langevin import Recorder

from speculate import theory
from speculate.rounds import run
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, chi2_power

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


@dataclass
class ByLength(SimulationStats):
    """SimulationStats that also keeps the kept-draft histogram of each drafted length L: rows near
    their last step draft fewer than K (the round loop drafts no more than a row can use), and
    their kept drafts are truncated-geometric with L, not K."""

    by_length: dict = field(default_factory=dict)  #: L -> counts of 0..K kept drafts

    def add_round(self, k, n_accepted, lengths):
        super().add_round(k, n_accepted, lengths)
        L = np.full(len(n_accepted), k) if lengths is None else np.asarray(lengths)
        for length in np.unique(L).tolist():
            h = self.by_length.setdefault(length, np.zeros(K + 1, np.int64))
            h += np.bincount(n_accepted[L == length], minlength=K + 1)


def test_acceptance_matches_two_phi_minus_half_delta():
    """Four checks at ALPHA / 4: the kept-draft histogram of the rounds that drafted all K steps,
    and the run's alpha, acceptance rate and steps per call against their expectations given the
    drafted lengths (the speculative_simulate path: LangevinProcess on the round loop)."""
    c = offset_for(DELTA, (2, 2))
    model = Langevin(force=POT, draft_force=Offset(POT, c), dt=DT, kT=KT, gamma=GAMMA)
    X0 = np.tile(np.array(MuellerBrown.minima[:2]), (4000, 1, 1))       # [4000, 2, 2]
    st = ByLength(steps=60)
    run(LangevinProcess(model, X0, Recorder(X0, 60, 60), st), len(X0), 60, lookahead=K, rng=5,
        keep_samples=False, stats=st)
    a = 2 * stats.norm.cdf(-DELTA / 2)                                   # 0.764
    np.testing.assert_array_equal(sum(st.by_length.values()), st.accepted_per_position)
    hist = st.by_length[K]                                               # row-rounds with L = K
    pmf = theory.accepted_length_pmf(a, K)
    kept = np.repeat(np.arange(K + 1), hist)                             # one per row-round
    assert_categorical_matches(kept, pmf, alpha=ALPHA / 4, label="accepted-length histogram")
    z = stats.norm.isf(ALPHA / 4 / 2)
    # the per-draft estimate accepted / (accepted + rejections) has sd sqrt(a (1-a) / trials)
    trials = st.accepted + st.rejections
    assert abs(st.alpha - a) < z * math.sqrt(a * (1 - a) / trials)
    # accepted drafts: a sum of independent truncated geometrics, count_L of them with length L
    mean = var = proposed = rounds = 0.0
    for L, h in st.by_length.items():
        p_L = theory.accepted_length_pmf(a, L)
        m_L = float(np.dot(np.arange(L + 1), p_L))
        assert abs(m_L - (theory.expected_tokens(a, L) - 1)) < 1e-12
        mean, rounds, proposed = mean + h.sum() * m_L, rounds + h.sum(), proposed + h.sum() * L
        var += h.sum() * float(np.dot((np.arange(L + 1) - m_L) ** 2, p_L))
    assert st.proposed == proposed and st.row_rounds == rounds
    # accepted / proposed and steps per row per target call (1 + kept drafts, 3.14 when L = K)
    assert abs(st.acceptance_rate - mean / proposed) < z * math.sqrt(var) / proposed
    assert abs(st.tokens_per_call - (1 + mean / rounds)) < z * math.sqrt(var) / rounds
    # power: a histogram from a' = a - 0.01 is caught with probability >= 0.99
    wrong = theory.accepted_length_pmf(a - 0.01, K)
    assert chi2_power(pmf, wrong, int(hist.sum()), alpha=ALPHA / 4) >= 0.99


def test_perfect_draft_is_always_kept():
    model = Langevin(force=POT, draft_force=POT, dt=DT)
    sim = speculative_simulate(model, np.zeros((3, 1, 2)), 50, lookahead=4, rng=0)
    assert sim.stats.accepted == sim.stats.proposed
    assert sim.stats.target_calls == 10                   # 5 steps per call: 4 drafts + 1 bonus
