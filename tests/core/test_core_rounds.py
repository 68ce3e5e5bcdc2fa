"""The round loop as a generator (speculate.rounds.rounds): the events a streaming caller sees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import speculate as sp
from speculate.rounds import Proposal, rounds, run

T = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])  # target: next symbol given the last
D = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.4, 0.4, 0.2]])  # draft


class Markov:
    """B rows of a first-order chain over 3 symbols; the state is each row's last symbol."""

    def __init__(self, B: int) -> None:
        self.last = np.zeros(B, np.int64)

    def propose(self, rows, k, branches, need, rng):
        x = np.empty((len(rows), k), np.int64)
        q = np.empty((len(rows), k, 3))
        s = self.last[rows]
        for i in range(k):
            q[:, i] = D[s]
            x[:, i] = sp.Categorical(probs=D[s], validate=False).sample(rng)
            s = x[:, i]
        return Proposal(x, sp.Categorical(probs=q, validate=False), context=x)

    def score(self, rows, proposal):
        states = np.concatenate([self.last[rows][:, None], proposal.context], axis=1)  # [R, k+1]
        return sp.Categorical(probs=T[states], validate=False)

    def commit(self, rows, proposal, verdict):
        n = verdict.n_accepted + 1
        self.last[rows] = verdict.outcomes[np.arange(len(rows)), n - 1]
        return n, None


def test_the_events_add_up_to_what_run_returns():
    n = np.array([7, 0, 12, 3])
    streamed = [[] for _ in n]
    finished = []
    for event in rounds(Markov(4), 4, n, lookahead=3, rng=5):
        assert len(event.rows) == len(event.used) == event.outcomes.shape[0]
        for i, (r, u) in enumerate(zip(event.rows.tolist(), event.used, strict=True)):
            streamed[r] += event.outcomes[i, :u].tolist()
        finished += event.finished
    assert streamed == run(Markov(4), 4, n, lookahead=3, rng=5).samples
    assert sorted(finished) == [0, 2, 3]  # each row reported once, when done; row 1 never ran


def test_stopping_early_keeps_what_was_committed():
    proc = Markov(2)
    loop = rounds(proc, 2, 100, lookahead=2, rng=0)
    seen = [next(loop) for _ in range(3)]
    loop.close()  # a caller that stops early: no error, no note
    assert seen[-1].stats.rounds == 3
    last = seen[-1].outcomes[np.arange(2), np.asarray(seen[-1].used) - 1]
    np.testing.assert_array_equal(proc.last, last)  # the process holds the last committed symbols


def test_bad_arguments_are_refused_before_the_first_round():
    with pytest.raises(ValueError, match="verify must be one of"):
        rounds(Markov(1), 1, 5, verify="bogus")  # raised at the call, not at the first next()


def test_one_off_costs_are_not_taken_for_the_drafts_cost():
    """Regression: the first call of a fresh process counted Numba's compilation of the draft's draws as
    draft time (auto lookahead estimated c = 0.153 instead of 0.002; a first chain() reported c = 191).
    The draws are compiled before any round is timed, and auto lookahead skips the first round's times."""
    import speculate._inverse_cdf as icdf
    from speculate.rounds import _Lookahead

    P = np.array([[0.9, 0.1], [0.2, 0.8]])
    sp.chain(lambda s: sp.Categorical(probs=P[np.array(s)]), lambda s: sp.Categorical(probs=P[s]),
             lambda s, x: x, 0, n=3, lookahead=2, rng=0)
    assert icdf._WARM
    ctl = _Lookahead("auto", 8)
    ctl.update(np.array([2]), None, 2, t_draft=100.0, t_target=0.001)  # a first round of compilation
    assert ctl.c is None and ctl.step is None and not ctl.call  # no time of the first round is kept
    ctl.update(np.array([2]), None, 2, t_draft=0.002, t_target=0.01)
    assert ctl.c == pytest.approx(0.1) and ctl.call == {2: 0.01}
    assert ctl.k == 0  # then one plain round measures the target call without drafts
    ctl.update(np.array([0]), None, 0, t_draft=0.0, t_target=0.004)
    # alpha (0.9 * 2 + 2 + 1) / (0.9 * 2 + 2 + 2): two rounds of 2 kept, decay 0.9, a Beta(1, 1) prior;
    # T(k) = 0.004 + 0.003 k (the line through the two widths measured); step 0.001
    alpha = 4.8 / 5.8
    rates = [sp.theory.expected_tokens(alpha, k) / (0.001 * k + 0.004 + 0.003 * k) for k in range(9)]
    assert ctl.k == int(np.argmax(rates))


def test_probes_are_spaced_by_their_measured_loss():
    """Where drafting does not pay, a probe's loss against plain steps sets the rounds until the next one,
    so that probes cost at most PROBE_BUDGET of the time (the doubling schedule cost LJ at N = 108 about
    6% of a 1000-step run); with a fixed cost_ratio >= 1 no probe comes and a plain stretch is unbounded."""
    from speculate.rounds import Lookahead

    ctl = Lookahead("auto", 8)
    assert ctl.k == Lookahead.FIRST == 1  # one draft step: this round's times are skipped (one-off costs)
    ctl.update(np.array([1]), None, 1, t_draft=1.0, t_target=1.0)
    assert ctl.k == Lookahead.MEASURE == 4  # the measuring round: a width the line can extrapolate from
    ctl.update(np.array([4]), None, 4, t_draft=0.024, t_target=0.025)  # a draft step costs a plain step
    assert ctl.k == 0
    ctl.update_plain(1, 0.005)  # a plain step: 5 ms
    # the measuring round lost as a probe would (49 ms for 5 outcomes, 25 ms plain): it spaces the first probe
    first = int(np.ceil(0.024 / (Lookahead.PROBE_BUDGET * 0.005)))
    assert ctl.k == 0 and ctl.loss == pytest.approx(0.024) and ctl.every == first
    assert ctl.plain_steps() == first - 1
    ctl.update_plain(first - 1, 0.005 * (first - 1))
    assert ctl.k >= 1 and ctl.probing  # the probe
    k = ctl.k
    ctl.update(np.array([k]), None, k, t_draft=0.006 * k, t_target=0.005 + 0.005 * k)
    assert ctl.k == 0
    loss = 0.006 * k + 0.005 * k - k * 0.005  # the probe kept all k + 1 outcomes; plain: 5 ms each
    assert ctl.loss == pytest.approx(loss)
    assert ctl.every == min(int(np.ceil(loss / (Lookahead.PROBE_BUDGET * 0.005))), Lookahead.MAX_PROBE)
    assert Lookahead("auto", 8, cost_ratio=2.0).plain_steps() >= 2**62  # no probe ever: one stretch

    # a cheap draft that was rejected while measuring: drafting would pay at a higher alpha, so the
    # measuring round's loss does not push the first probe out (a misjudged start is undone in 8 rounds)
    ctl = Lookahead("auto", 8)
    ctl.update(np.array([0]), None, 1, t_draft=1.0, t_target=1.0)  # rejected; its times are skipped
    ctl.update(np.array([0]), None, 4, t_draft=0.008, t_target=0.0052)  # rejected: alpha 1/4; 2 ms a step
    ctl.update_plain(1, 0.005)
    assert ctl.k == 0 and ctl.every == Lookahead.PROBE and ctl.loss is None
    assert not ctl._hopeless()  # at alpha = 1, k = 8 would make 9 tokens in 21 ms, plain 4.3


def test_a_plain_path_does_not_cancel_drafting_that_pays():
    """Regression: with a process's plain path (k = 0 measured as plain steps, never as a target call at
    width 0) every drafting round sent the rule back to 0 "to measure k = 0", so physics runs where
    drafting pays alternated 8 plain steps and one drafting round."""
    from speculate.rounds import Lookahead

    ctl = Lookahead("auto", 8)
    ctl.update(np.array([1]), None, 1, t_draft=1.0, t_target=1.0)  # one-off costs: not kept
    ctl.update(np.array([1]), None, 1, t_draft=0.0001, t_target=0.0051)  # a cheap draft, a flat call
    assert ctl.k == 0
    ctl.update_plain(1, 0.005)
    assert ctl.k > 1
    for _ in range(5):  # drafting keeps paying: the rule keeps drafting
        ctl.update(np.array([ctl.k]), None, ctl.k, t_draft=0.0001 * ctl.k, t_target=0.005 + 0.0001 * ctl.k)
        assert ctl.k > 1


def test_the_time_without_drafts_is_measured_again_while_drafting_pays():
    """Regression: the width-0 time was measured once, in the first rounds, and never again while drafting
    paid; as a cache grows every call gets slower, the stale intercept made wide blocks look expensive
    (auto below a fixed k = 4 at text batch 8). One round at k = 0 after REFRESH rounds of drafting
    measures it again, and old widths fade from the line."""
    from speculate.rounds import Lookahead

    ctl = Lookahead("auto", 8)
    ctl.update(np.array([1]), None, 1, t_draft=1.0, t_target=1.0)  # one-off costs: not kept
    ctl.update(np.array([1]), None, 1, t_draft=0.0001, t_target=0.0051)
    ctl.update(np.array([0]), None, 0, t_draft=0.0, t_target=0.005)
    ks = []
    for r in range(3 * Lookahead.REFRESH):
        k = ctl.k
        ks.append(k)
        slow = 1 + r / 50  # every call slows as the cache grows: 5 ms -> 25 ms at width 0
        ctl.update(np.array([k]), None, k, t_draft=0.0001 * k, t_target=slow * (0.005 + 0.0001 * k))
    zeros = [i for i, k in enumerate(ks) if k == 0]
    assert 2 <= len(zeros) <= 4 and all(b - a > Lookahead.REFRESH for a, b in itertools.pairwise(zeros))
    a, _, _ = ctl._width_line()  # the intercept is the last refresh's time (5 ms before any: stale)
    assert a == pytest.approx(0.005 * (1 + zeros[-1] / 50), rel=0.15) and a > 0.015


def test_the_rule_stops_searching_only_where_no_larger_k_can_win():
    """``Lookahead._best`` stops at the first k >= 1 whose rate falls (expected tokens, concave in k, over
    the round's time, convex in k, is quasi-concave): over random costs, acceptances and width lines it
    picks what the exhaustive search over 0..max picks. Planting ``break`` at the first fall from k = 0
    (a plain path cheaper than any width line) fails this."""
    from speculate.rounds import Lookahead

    rng = np.random.default_rng(5)
    for _ in range(3000):
        ctl = Lookahead("auto", int(rng.integers(1, 17)))
        widths = rng.choice(np.arange(0, 9), size=int(rng.integers(1, 4)), replace=False)
        ctl.call = {int(k): float(rng.uniform(1e-4, 1e-2)) * (1 + float(rng.uniform(0, 2)) * k) for k in widths}
        ctl.seen = {int(k): int(rng.integers(0, 50)) for k in widths}
        ctl.rounds = 60
        ctl.step = float(rng.choice([0.0, rng.uniform(0, 5e-3)]))
        ctl.rest = float(rng.uniform(0, 1e-3))
        ctl.plain_step = float(rng.uniform(1e-4, 1e-2)) if rng.random() < 0.5 else None
        alpha = float(rng.choice([0.0, 1.0, rng.uniform()]))
        a, b, floor = ctl._width_line()
        for positive in (False, True):
            rates = []
            for k in range(1 if positive else 0, ctl.max + 1):
                t = k * ctl.step + max(a + b * k, floor) + ctl.rest
                if k == 0 and ctl.plain_step is not None:
                    t = min(t, ctl.plain_step)
                rates.append(sp.theory.expected_tokens(alpha, k) / t)
            best = int(np.argmax(np.array(rates) >= max(rates) / (1 + 1e-9))) + (1 if positive else 0)
            assert ctl._best(alpha, positive)[0] == best, (alpha, positive, ctl.call, ctl.plain_step)
