"""chain()/chains(): whole emitted sequences follow the target's joint law, for every rule.

Joint-law checks compare the law of whole sequences (not per-position marginals), with different
target and draft tables per chain so that a row-mixing bug shows. Power: chi2_sample_size(0.05, 27)
samples per chain table catch a TV 0.05 deviation of the joint law with >= 99% probability at
ALPHA; the kernels themselves are tested at TV 0.01 (test_speculative_sample.py) and exactly in
proofs/.
"""

import itertools

import numpy as np
import pytest
import scipy.stats as st

import speculate as sp
from speculate import theory
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, assert_same_continuous, chi2_sample_size

V, L = 3, 3
_rng = np.random.default_rng(2024)
# per chain id c and context (previous two outcomes, V = none yet): target T and draft Q tables
T = _rng.dirichlet(np.full(V, 0.6), (3, V + 1, V + 1))
Q = _rng.dirichlet(np.full(V, 0.6), (3, V + 1, V + 1))
T[0, V, V] = [0.7, 0.0, 0.3]  # zeros in the target...
Q[1, V, V] = [0.0, 1.0, 0.0]  # ...and a one-hot draft


def _ctx(states):
    s = np.asarray(states, dtype=np.int64).reshape(-1, 3)
    return s[:, 0], s[:, 1], s[:, 2]


def target(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=T[c, a, b], validate=False)


@sp.batched
def draft(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=Q[c, a, b], validate=False)


def step(state, x):
    return (state[0], state[2], int(x))


def joint_law(c: int, length: int = L) -> dict:
    law = {}
    for seq in itertools.product(range(V), repeat=length):
        pr, a, b = 1.0, V, V
        for x in seq:
            pr *= T[c, a, b][x]
            a, b = b, x
        law[seq] = pr
    return law


N_EACH = chi2_sample_size(0.05, V**L, alpha=ALPHA)


@pytest.mark.parametrize(
    ("verify", "branches", "k"),
    [("token", 1, 2), ("block", 1, 2), ("block", 1, 5), ("token", 3, 2), ("token", 1, 0)],
)
def test_joint_law_of_whole_sequences(verify, branches, k):
    starts = [(c, V, V) for c in range(3) for _ in range(N_EACH)]
    res = sp.chains(target, draft, step, starts, L, lookahead=k, verify=verify, branches=branches, rng=11)
    for c in range(3):
        seqs = [tuple(s) for s in res.samples[c * N_EACH : (c + 1) * N_EACH]]
        assert_categorical_matches(seqs, joint_law(c), alpha=ALPHA, label=f"{verify} m={branches} k={k} chain {c}")
    assert all(len(s) == L for s in res.samples)
    assert res.stats.emitted == 3 * N_EACH * L


def test_final_state_and_greedy_equals_argmax_decoding():
    res = sp.chains(target, draft, step, [(c, V, V) for c in range(3)], 6, lookahead=3, verify="greedy", rng=0)
    for c in range(3):
        a, b, want = V, V, []
        for _ in range(6):
            x = int(np.argmax(T[c, a, b]))
            want.append(x)
            a, b = b, x
        assert res.samples[c] == want
        assert res.states[c] == (c, want[-2], want[-1])


@pytest.mark.parametrize("k", [1, 4])
def test_accepted_length_histogram_matches_theory(k):
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.3, 0.3, 0.4])
    alpha = theory.acceptance_rate(p, q)
    tgt = lambda states: sp.Categorical(probs=np.broadcast_to(p, (len(states), 3)))  # noqa: E731
    drf = sp.batched(lambda states: sp.Categorical(probs=np.broadcast_to(q, (len(states), 3))))
    # 8 long chains: the loop drafts no more than a chain still needs, so only a chain's last round
    # may have fewer than k drafts: at most 8 of the ~10^4 rounds, a shift far below the test's reach
    res = sp.chains(tgt, drf, lambda s, x: s, [0] * 8, 2500 * (k + 1), lookahead=k, rng=3)
    hist = res.stats.accepted_per_position[: k + 1]
    pmf = theory.accepted_length_pmf(alpha, k)
    assert_categorical_matches(np.repeat(np.arange(k + 1), hist), pmf, alpha=ALPHA)
    rounds = hist.sum()
    mean = (np.arange(k + 1) + 1) @ hist / rounds
    sd = np.sqrt(((np.arange(k + 1) + 1 - theory.expected_tokens(alpha, k)) ** 2 @ pmf) / rounds)
    assert abs(mean - theory.expected_tokens(alpha, k)) < 6 * sd
    assert res.stats.tokens_per_call == pytest.approx(mean)


def test_block_yields_at_least_as_many_outcomes_per_call_as_token():
    starts = [(c, V, V) for c in range(3) for _ in range(3000)]
    per = {}
    for rule in ("token", "block"):
        res = sp.chains(target, draft, step, starts, 4, lookahead=4, verify=rule, rng=5)
        h = res.stats.accepted_per_position
        per[rule] = (np.arange(len(h)) + 1) @ h / h.sum()  # mean outcomes per round
    mt, mb = per["token"], per["block"]
    assert mb > mt  # never worse in expectation (proofs/07); on these problems strictly better


def test_multi_draft_first_depth_acceptance():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    a1 = theory.acceptance_rate(p, q)
    r = np.maximum(p - q, 0)
    a2 = theory.acceptance_rate(r / r.sum(), q)
    want = theory.multi_draft_acceptance([a1, a2])
    tgt = lambda states: sp.Categorical(probs=np.broadcast_to(p, (len(states), 4)))  # noqa: E731
    drf = sp.batched(lambda states: sp.Categorical(probs=np.broadcast_to(q, (len(states), 4))))
    # two outcomes per chain: the first round drafts one outcome on each of the 2 branches (a chain
    # that needs only one outcome is not drafted at all); a second round, if any, drafts nothing
    res = sp.chains(tgt, drf, lambda s, x: s, [0] * 20_000, 2, lookahead=1, branches=2, rng=9)
    kept = int(res.stats.accepted_per_position[1])
    assert res.stats.lookahead_counts[1] == 1
    assert st.binomtest(kept, 20_000, want).pvalue >= ALPHA
    assert_categorical_matches([s[0] for s in res.samples], p, alpha=ALPHA)


def test_stop_condition_truncates_exactly():
    # stop after outcome 0: the law of the (variable-length) sequences up to 4 outcomes
    starts = [(2, V, V)] * 20_000
    stop = lambda s, x: x == 0  # noqa: E731
    res = sp.chains(target, draft, step, starts, 4, lookahead=3, stop=stop, rng=1)
    law = {}
    for seq, pr in joint_law(2, 4).items():
        cut = seq[: seq.index(0) + 1] if 0 in seq else seq
        law[cut] = law.get(cut, 0.0) + pr
    assert_categorical_matches([tuple(s) for s in res.samples], law, alpha=ALPHA)


def test_auto_lookahead_is_exact_and_adapts():
    starts = [(c, V, V) for c in range(3) for _ in range(N_EACH)]
    res = sp.chains(target, draft, step, starts, L, lookahead="auto", cost_ratio=0.01, rng=4)
    for c in range(3):
        seqs = [tuple(s) for s in res.samples[c * N_EACH : (c + 1) * N_EACH]]
        assert_categorical_matches(seqs, joint_law(c), alpha=ALPHA)
    again = sp.chains(target, draft, step, starts[:50], L, lookahead="auto", cost_ratio=0.01, rng=4)
    assert (
        again.samples
        == sp.chains(target, draft, step, starts[:50], L, lookahead="auto", cost_ratio=0.01, rng=4).samples
    )
    p = np.array([0.5, 0.5])
    easy = sp.chain(
        lambda s: sp.Categorical(probs=np.broadcast_to(p, (len(s), 2))),
        lambda s: sp.Categorical(probs=p),
        lambda s, x: s,
        0,
        400,
        lookahead="auto",
        cost_ratio=0.01,
        rng=0,
    )
    assert max(easy.stats.lookahead_counts) > 8  # alpha = 1: lookahead grows


def test_gaussian_chain_matches_direct_sampling():
    # AR(1): target x' ~ N(0.9 x, 0.5), draft N(0.7 x + 0.1, 0.5): verified by reflection coupling
    tgt = lambda states: sp.Normal(0.9 * np.asarray(states, float), 0.5, batch_ndims=1)  # noqa: E731
    drf = sp.batched(lambda states: sp.Normal(0.7 * np.asarray(states, float) + 0.1, 0.5, batch_ndims=1))
    n = 20_000
    res = sp.chains(tgt, drf, lambda s, x: float(x), [1.0] * n, 3, lookahead=3, rng=2)
    spec = np.array([[float(v) for v in s] for s in res.samples])
    rng = np.random.default_rng(99)
    x = np.ones(n)
    ref = []
    for _ in range(3):
        x = 0.9 * x + 0.5 * rng.standard_normal(n)
        ref.append(x)
    # two-sample KS on each coordinate and 16 random projections (Bonferroni inside): with n = 20,000
    # per sample a CDF deviation of ~0.03 along any of them is caught
    assert_same_continuous(spec, np.stack(ref, 1), alpha=ALPHA)
    assert 0 < res.stats.acceptance_rate < 1


class _Coin:
    """A user distribution following the protocol only (no fast path): exercises the general rule."""

    discrete = True

    def __init__(self, p1):
        self.p1 = p1

    def sample(self, rng):
        return int(rng.random() < self.p1)

    def log_prob(self, y):
        return float(np.log(self.p1 if y == 1 else 1 - self.p1))


def test_general_distributions_position_by_position():
    tgt = lambda states: [_Coin(0.8 if s else 0.3) for s in states]  # noqa: E731
    drf = lambda s: _Coin(0.5)  # noqa: E731
    res = sp.chains(tgt, drf, lambda s, x: x, [0] * 5000, 2, lookahead=2, rng=8)
    law = {
        (a, b): (0.3 if a else 0.7) * ((0.8 if b else 0.2) if a else (0.3 if b else 0.7))
        for a in (0, 1)
        for b in (0, 1)
    }
    assert_categorical_matches([tuple(s) for s in res.samples], law, alpha=ALPHA)
    with pytest.raises(ValueError, match="Categorical"):
        sp.chains(tgt, drf, lambda s, x: x, [0], 2, lookahead=2, verify="block", rng=0)


def test_ragged_lengths_and_independent_finishing():
    res = sp.chains(target, draft, step, [(0, V, V), (1, V, V), (2, V, V)], [0, 5, 17], lookahead=4, rng=0)
    assert [len(s) for s in res.samples] == [0, 5, 17]
    assert res.states[0] == (0, V, V)
    tr = sp.chain(target, draft, step, (1, V, V), 7, rng=0)
    assert len(tr.samples) == 7 and tr.state == (1, tr.samples[-2], tr.samples[-1])


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"n": -1}, ValueError, "n"),
        ({"lookahead": -2}, ValueError, "lookahead"),
        ({"lookahead": 2.5}, TypeError, "lookahead"),
        ({"verify": "fast"}, ValueError, "verify"),
        ({"branches": 0}, ValueError, "branches"),
        ({"branches": 2, "verify": "block"}, ValueError, "recursive rejection"),
        ({"cost_ratio": -1.0, "lookahead": "auto"}, ValueError, "cost_ratio"),
    ],
)
def test_bad_arguments(kwargs, err, match):
    args = {"n": 3, **kwargs}
    with pytest.raises(err, match=match):
        sp.chain(target, draft, step, (0, V, V), **args, rng=0)


def test_target_returning_the_wrong_number_of_distributions():
    bad = lambda states: sp.Categorical(probs=np.full((len(states) - 1, V), 1 / V))  # noqa: E731
    with pytest.raises(ValueError, match=r"batch shape .* for \d+ states"):
        sp.chain(bad, draft, step, (0, V, V), 3, rng=0)
    short = lambda states: [sp.Categorical(probs=np.full(V, 1 / V))] * (len(states) + 1)  # noqa: E731
    with pytest.raises(ValueError, match="distributions for"):
        sp.chain(short, draft, step, (0, V, V), 3, rng=0)


def test_vocabulary_mismatch_between_target_and_draft():
    wide = sp.batched(lambda states: sp.Categorical(probs=np.full((len(states), V + 1), 1 / (V + 1))))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        sp.chain(target, wide, step, (0, V, V), 3, rng=0)


def test_normal_shapes_that_do_not_match():
    tgt = lambda states: sp.Normal(np.zeros((len(states), 2)), 1.0, batch_ndims=1)  # noqa: E731
    drf = sp.batched(lambda states: sp.Normal(np.zeros((len(states), 3)), 1.0, batch_ndims=1))
    with pytest.raises(ValueError, match="event shapes differ"):
        sp.chain(tgt, drf, lambda s, x: s, 0.0, 3, rng=0)


def test_draft_probabilities_keep_their_precision_across_steps():
    """A draft whose dtype changes between steps (float32, then float64) must reach the verifier
    unrounded: the proposal holds the probabilities the drafts were sampled from."""
    from speculate.chain import _FunctionProcess

    q64 = np.array([0.1 + 1e-12, 0.9 - 1e-12])
    calls = []

    def mixed_draft(state):
        calls.append(state)
        return sp.Categorical(probs=np.float32([0.5, 0.5]) if len(calls) == 1 else q64)

    proc = _FunctionProcess(None, mixed_draft, lambda s, x: s, [0], None)
    prop = proc.propose(np.array([0]), 3, 1, np.array([10]), np.random.default_rng(0))
    assert prop.dists.probs.dtype == np.float64
    np.testing.assert_array_equal(prop.dists.probs[0, 1:], [q64, q64])


@pytest.mark.parametrize("where", ["target", "draft", "step"])
def test_an_exception_mid_run_propagates_with_its_round(where):
    """A failure in round 3 of many surfaces unchanged, with a note naming the phase and the round;
    the same call on fresh callables then runs to the end (nothing is left half-committed)."""
    calls = {"target": 0, "draft": 0, "step": 0}

    def counted(name, fn):
        def wrapped(*a):
            calls[name] += 1
            if name == where and calls[name] == {"target": 3, "draft": 9, "step": 9}[name]:
                raise RuntimeError(f"{name} failed")
            return fn(*a)
        return wrapped

    tgt = counted("target", lambda states: sp.Categorical(probs=np.full((len(states), 2), 0.5)))
    drf = counted("draft", lambda s: sp.Categorical(probs=[0.6, 0.4]))
    stp = counted("step", lambda s, x: s)
    with pytest.raises(RuntimeError, match=f"{where} failed") as info:
        sp.chains(tgt, drf, stp, [0, 0], 20, lookahead=2, rng=0)
    phase = {"target": "score", "draft": "propose", "step": "propose"}[where]
    assert any(f"raised in {phase} of round" in n for n in info.value.__notes__), info.value.__notes__
    calls.update(target=-100, draft=-100, step=-100)  # no more failures
    res = sp.chains(tgt, drf, stp, [0, 0], 20, lookahead=2, rng=0)
    assert [len(s) for s in res.samples] == [20, 20]
