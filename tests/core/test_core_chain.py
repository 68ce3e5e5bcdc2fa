"""chain()/chains(): whole emitted sequences follow the target's joint law, for every rule.

Joint-law checks compare the law of whole sequences (not per-position marginals) produced over
several rounds, with rows of different contexts (different target and draft tables) in one batch,
so that a bug that mixes rows, drops or repeats an outcome at a round boundary, or biases any rule
shows. The long-chain checks use segments: a chain's state resets every L outcomes, so its
consecutive L-outcome segments are i.i.d. draws of the joint law, produced by rounds that start
anywhere inside a segment and span segment boundaries.

Power: each chi-square check draws chi2_sample_size(TV, cells, alpha=ALPHA / m) samples (m checks
in the test), so any deviation of total variation TV (0.02 in the default run, 0.01 under the
``slow`` marker) of the law it checks fails it with probability >= 99%; the continuous check uses
ks_sample_size. The kernels themselves are tested at TV 0.01 (test_core_speculative_sample.py) and
exactly in proofs/.
"""

import itertools

import numpy as np
import pytest
import scipy.stats as st

import speculate as sp
from speculate import theory
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import (
    assert_categorical_matches,
    assert_continuous_matches,
    chi2_gof,
    chi2_sample_size,
    ks_sample_size,
)

V, L = 3, 3
_rng = np.random.default_rng(2024)
# per chain id c and context (previous two outcomes, V = none yet): target T and draft Q tables
T = _rng.dirichlet(np.full(V, 0.6), (3, V + 1, V + 1))
Q = _rng.dirichlet(np.full(V, 0.6), (3, V + 1, V + 1))
T[0, V, V] = [0.7, 0.0, 0.3]  # zeros in the target...
Q[1, V, V] = [0.0, 1.0, 0.0]  # ...and a one-hot draft
TVS = [0.02, pytest.param(0.01, marks=pytest.mark.slow)]  # the deviation each check catches


def _ctx(states):
    s = np.asarray(states, dtype=np.int64).reshape(len(states), -1)
    return s[:, 0], s[:, -2], s[:, -1]


def target(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=T[c, a, b], validate=False)


@sp.batched
def draft(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=Q[c, a, b], validate=False)


def step(state, x):
    return (state[0], state[2], int(x))


def segment_step(state, x):
    """State (c, position in the segment, a, b): after L outcomes the context resets to (V, V)."""
    c, pos, _, b = state
    return (c, 0, V, V) if pos == L - 1 else (c, pos + 1, b, int(x))


def joint_law(c: int, length: int = L) -> dict:
    law = {}
    for seq in itertools.product(range(V), repeat=length):
        pr, a, b = 1.0, V, V
        for x in seq:
            pr *= T[c, a, b][x]
            a, b = b, x
        law[seq] = pr
    return law


def segments_per_context(tv: float) -> int:
    """Segments each context needs: 3 checks (one per context) of the V^L-cell joint law."""
    return chi2_sample_size(tv, V**L, alpha=ALPHA / 3)


def check_segments(res, rows_per_context: int, tv: float, label: str) -> None:
    """Every context's L-outcome segments, pooled over its rows, follow joint_law(c)."""
    for c in range(3):
        seqs = []
        for s in res.samples[c * rows_per_context : (c + 1) * rows_per_context]:
            assert len(s) % L == 0
            seqs += [tuple(s[i : i + L]) for i in range(0, len(s), L)]
        assert len(seqs) >= segments_per_context(tv)
        assert_categorical_matches(seqs, joint_law(c), alpha=ALPHA / 3, label=f"{label} context {c}")


def segment_starts(tv: float, rows: int = 64):
    """64 rows per context, the three contexts in one batch, ragged lengths (whole segments)."""
    m = -(-segments_per_context(tv) // rows)
    starts = [(c, 0, V, V) for c in range(3) for _ in range(rows)]
    n = [L * (m + i % 3) for i in range(rows)] * 3  # m, m + 1, m + 2 segments: at least m each
    return starts, n, rows


@pytest.mark.parametrize("tv", TVS)
@pytest.mark.parametrize(
    ("verify", "branches", "k"),
    [("token", 1, 2), ("block", 1, 2), ("block", 1, 5), ("token", 3, 2), ("token", 1, 0)],
)
def test_joint_law_over_many_rounds(verify, branches, k, tv):
    """Catches any TV `tv` deviation of a context's 3-outcome joint law with power >= 0.99 (Bonferroni
    over the 3 contexts). Rounds start anywhere inside a segment, so most segments are produced by
    two or more rounds (k = 0: exactly three)."""
    starts, n, rows = segment_starts(tv)
    res = sp.chains(target, draft, segment_step, starts, n, lookahead=k, verify=verify, branches=branches, rng=11)
    assert [len(s) for s in res.samples] == n and res.stats.emitted == sum(n)
    assert res.stats.rounds >= max(n) // (k + 1)
    check_segments(res, rows, tv, f"{verify} m={branches} k={k}")


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
    """Two checks at ALPHA / 2 on n rows: the first outcome's law (TV 0.02 caught with power >= 0.99)
    and the first-depth acceptance 1 - (1 - a1)(1 - a2) (a shift of 0.02 caught with power >= 0.99)."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    a1 = theory.acceptance_rate(p, q)
    r = np.maximum(p - q, 0)
    a2 = theory.acceptance_rate(r / r.sum(), q)
    want = theory.multi_draft_acceptance([a1, a2])
    n = chi2_sample_size(0.02, 3, alpha=ALPHA / 2)
    sd = np.sqrt(want * (1 - want) / n)
    assert st.norm.sf(st.norm.isf(ALPHA / 4) - 0.02 / sd) >= 0.99  # the binomial check's power
    tgt = lambda states: sp.Categorical(probs=np.broadcast_to(p, (len(states), 4)))  # noqa: E731
    drf = sp.batched(lambda states: sp.Categorical(probs=np.broadcast_to(q, (len(states), 4))))
    # two outcomes per chain: the first round drafts one outcome on each of the 2 branches (a chain
    # that needs only one outcome is not drafted at all); a second round, if any, drafts nothing
    res = sp.chains(tgt, drf, lambda s, x: s, [0] * n, 2, lookahead=1, branches=2, rng=9)
    kept = int(res.stats.accepted_per_position[1])
    assert res.stats.lookahead_counts[1] == 1
    assert st.binomtest(kept, n, want).pvalue >= ALPHA / 2
    assert_categorical_matches([s[0] for s in res.samples], p, alpha=ALPHA / 2)


def _stopped_law(c: int, length: int = 4) -> dict:
    law = {}
    for seq, pr in joint_law(c, length).items():
        cut = seq[: seq.index(0) + 1] if 0 in seq else seq
        law[cut] = law.get(cut, 0.0) + pr
    return law


@pytest.mark.parametrize("tv", TVS)
def test_stop_condition_truncates_exactly(tv):
    """Stop after outcome 0: the law of the variable-length sequences (up to 4 outcomes; 31 cells) of
    two contexts in one batch (one with a zero in the target). TV `tv` caught with power >= 0.99."""
    n_each = chi2_sample_size(tv, len(_stopped_law(2)), alpha=ALPHA / 2)
    starts = [(c, V, V) for _ in range(n_each) for c in (0, 2)]  # contexts interleaved
    stop = lambda s, x: x == 0  # noqa: E731
    res = sp.chains(target, draft, step, starts, 4, lookahead=3, stop=stop, rng=1)
    for j, c in enumerate((0, 2)):
        seqs = [tuple(s) for s in res.samples[j::2]]
        assert_categorical_matches(seqs, _stopped_law(c), alpha=ALPHA / 2, label=f"stop, context {c}")


@pytest.mark.parametrize("tv", TVS)
def test_auto_lookahead_is_exact(tv):
    """lookahead="auto" changes k between rounds from the past alone: the segments' joint law per
    context, TV `tv` caught with power >= 0.99; and a fixed cost_ratio makes it reproducible."""
    starts, n, rows = segment_starts(tv)
    res = sp.chains(target, draft, segment_step, starts, n, lookahead="auto", cost_ratio=0.01, rng=4)
    assert len(res.stats.lookahead_counts) >= 2  # k did change
    check_segments(res, rows, tv, "auto")
    few = dict(lookahead="auto", cost_ratio=0.01, rng=4)
    again = sp.chains(target, draft, segment_step, starts[:50], 30, **few).samples
    assert again == sp.chains(target, draft, segment_step, starts[:50], 30, **few).samples


def test_auto_lookahead_adapts():
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


AR = [(0.9, 0.7, 0.1, 0.5), (0.5, 0.6, -0.2, 1.0), (-0.7, -0.5, 0.0, 0.3)]  # per context: a, b, d, scale


@pytest.mark.parametrize("tv", TVS)
def test_gaussian_chain_matches_the_target_law(tv):
    """AR(1) chains, three contexts in one batch: target x' ~ N(a x, s), draft N(b x + d, s) (reflection
    coupling in the Gaussian kernel). Whitened, z_t = (x_t - a x_{t-1}) / s are i.i.d. N(0, 1) under
    the target law; blocks of 3 consecutive z (spanning rounds) are checked by one-sample KS on
    each coordinate and 4 random unit projections, per context (21 checks at ALPHA / 21): a CDF
    deviation of `tv` along any of them is caught with probability >= 0.99 (ks_sample_size)."""
    checks = 3 * (3 + 4)
    blocks = ks_sample_size(tv, alpha=ALPHA / checks)
    rows = 64
    steps = 3 * -(-blocks // rows)

    def ctx(states):
        s = np.asarray(states, np.float64).reshape(len(states), 2)
        return s[:, 0].astype(np.int64), s[:, 1]

    coef = np.array(AR)
    tgt = lambda states: (lambda c, x: sp.Normal(coef[c, 0] * x, coef[c, 3], batch_ndims=1))(*ctx(states))  # noqa: E731
    drf = sp.batched(
        lambda states: (lambda c, x: sp.Normal(coef[c, 1] * x + coef[c, 2], coef[c, 3], batch_ndims=1))(*ctx(states))
    )
    starts = [(c, 1.0) for c in range(3) for _ in range(rows)]
    res = sp.chains(tgt, drf, lambda s, x: (s[0], float(x)), starts, steps, lookahead=3, rng=2)
    assert res.stats.routes.get("gaussian", 0) > 0 and 0 < res.stats.acceptance_rate < 1
    dirs = np.random.default_rng(0).standard_normal((4, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    for c, (a, _, _, s) in enumerate(AR):
        x = np.array([[1.0, *map(float, seq)] for seq in res.samples[c * rows : (c + 1) * rows]])
        z = ((x[:, 1:] - a * x[:, :-1]) / s).reshape(-1, 3)  # [blocks, 3]
        assert len(z) >= blocks
        for j, col in enumerate([*z.T, *(z @ dirs.T).T]):
            assert_continuous_matches(col, st.norm(), alpha=ALPHA / checks, label=f"context {c}, check {j}")


class _Coin:
    """A user distribution following the protocol only (no fast path): exercises the general rule."""

    discrete = True

    def __init__(self, p1):
        self.p1 = p1

    def sample(self, rng):
        return int(rng.random() < self.p1)

    def log_prob(self, y):
        return float(np.log(self.p1 if y == 1 else 1 - self.p1))


COINS = {0: (0.3, 0.8), 1: (0.6, 0.1)}  # per context: P(1 | last outcome 0), P(1 | last outcome 1)


@pytest.mark.parametrize("tv", TVS)
def test_general_distributions_position_by_position(tv):
    """Distributions that only follow the protocol (the general rule, position by position), two
    contexts in one batch, 2-outcome segments over many rounds: the law of (first, second) per
    context, TV `tv` caught with power >= 0.99."""
    n_seg = chi2_sample_size(tv, 4, alpha=ALPHA / 2)
    rows = 64
    per_row = -(-n_seg // rows)
    tgt = lambda states: [_Coin(COINS[c][last]) for c, _, last in states]  # noqa: E731
    drf = lambda s: _Coin(0.5)  # noqa: E731
    stp = lambda s, x: (s[0], 0, 0) if s[1] == 1 else (s[0], 1, x)  # noqa: E731 - reset after 2 outcomes
    starts = [(c, 0, 0) for _ in range(rows) for c in (0, 1)]
    res = sp.chains(tgt, drf, stp, starts, 2 * per_row, lookahead=2, rng=8)
    assert res.stats.routes == {"general": res.stats.rounds}
    for c, (p0, p1) in COINS.items():
        law = {(a, b): (p0 if a else 1 - p0) * ((p1 if b else 1 - p1) if a else (p0 if b else 1 - p0))
               for a in (0, 1) for b in (0, 1)}  # fmt: skip
        segs = [tuple(s[i : i + 2]) for s in res.samples[c::2] for i in range(0, len(s), 2)]
        assert_categorical_matches(segs, law, alpha=ALPHA / 2, label=f"general rule, context {c}")
    with pytest.raises(ValueError, match="Categorical"):
        sp.chains(tgt, drf, stp, [(0, 0, 0)], 2, lookahead=2, verify="block", rng=0)


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


@pytest.mark.parametrize("where", ["target", "draft", "step"])
def test_keyboard_interrupt_mid_run_then_the_same_call_gives_the_undisturbed_samples(where):
    """A KeyboardInterrupt in round 3 of many propagates with the loop's note; a following chains()
    call with the same seed gives exactly the samples and states of an undisturbed run."""
    starts = [(c, V, V) for c in range(3)] * 2
    run = dict(lookahead=2, rng=7)
    undisturbed = sp.chains(target, draft, step, starts, 20, **run)
    calls = {"target": 0, "draft": 0, "step": 0}
    fail_at = {"target": 3, "draft": 5, "step": 40}[where]

    def interrupting(name, fn):
        def wrapped(*a):
            calls[name] += 1
            if name == where and calls[name] == fail_at:
                raise KeyboardInterrupt
            return fn(*a)

        return wrapped

    tgt, stp = interrupting("target", target), interrupting("step", step)
    drf = sp.batched(interrupting("draft", draft))
    with pytest.raises(KeyboardInterrupt) as info:
        sp.chains(tgt, drf, stp, starts, 20, **run)
    phase = {"target": "score", "draft": "propose", "step": "propose"}[where]
    assert any(f"raised in {phase} of round" in n for n in info.value.__notes__), info.value.__notes__
    assert not any("of round 1 " in n for n in info.value.__notes__)  # mid-run, not at the start
    again = sp.chains(tgt, drf, stp, starts, 20, **run)  # the counter is past fail_at: no interrupt
    assert again.samples == undisturbed.samples and again.states == undisturbed.states


def test_greedy_drafts_the_argmax_so_a_draft_equal_to_the_target_is_always_kept():
    """Regression: under verify="greedy" a stochastic draft was sampled, so a draft equal to the target
    was kept only with probability max p (alpha 0.34 here). A Categorical draft now proposes its argmax
    (first maximum on ties, as the greedy kernel), a point mass its value: every draft is kept, and the
    output is still step-by-step greedy decoding of the target."""
    starts = [(c, V, V) for c in range(3)] * 3
    want = []
    for c, _, _ in starts:
        a, b, seq = V, V, []
        for _ in range(25):
            seq.append(int(np.argmax(T[c, a, b])))
            a, b = b, seq[-1]
        want.append(seq)
    per_state = lambda s: target([s])[0]  # noqa: E731 - an unbatched draft: the list path
    point_mass = lambda s: sp.PointMass(int(np.argmax(T[s[0], s[1], s[2]])))  # noqa: E731
    for drf in (sp.batched(target), per_state, point_mass):
        res = sp.chains(target, drf, step, starts, 25, lookahead=4, verify="greedy", rng=0)
        assert res.samples == want
        assert res.stats.proposed > 50 and res.stats.accepted == res.stats.proposed
    # ties: both take the first maximum, so the draft is still always kept
    tie = np.array([0.4, 0.4, 0.2])
    tied = lambda states: sp.Categorical(probs=np.broadcast_to(tie, (len(states), 3)))  # noqa: E731
    res = sp.chain(tied, sp.batched(tied), lambda s, x: s, 0, 20, lookahead=4, verify="greedy", rng=0)
    assert res.samples == [0] * 20 and res.stats.accepted == res.stats.proposed
    # other rules still sample: the token rule's output is a random draw, not the argmax path
    res = sp.chains(target, sp.batched(target), step, starts, 25, lookahead=4, verify="token", rng=0)
    assert res.samples != want


def test_a_normal_target_without_batch_ndims_gets_a_hint():
    """Regression: Normal(loc_vector, 1.0) for a list of states was refused with "batch shape ()"
    and no way forward; the message now says to pass batch_ndims=1."""
    tgt = lambda states: sp.Normal(0.9 * np.asarray(states, float), 1.0)  # noqa: E731 - forgot batch_ndims=1
    drf = sp.batched(lambda states: sp.Normal(np.asarray(states, float), 1.0, batch_ndims=1))
    with pytest.raises(ValueError, match=r"target returned a Normal with batch shape \(\).*pass batch_ndims=1"):
        sp.chain(tgt, drf, lambda s, x: float(x), 0.0, 5, rng=0)
    flat = sp.batched(lambda states: sp.Normal(np.asarray(states, float), 1.0))
    with pytest.raises(ValueError, match=r"draft returned a Normal .*batch_ndims=1"):
        sp.chain(tgt, flat, lambda s, x: float(x), 0.0, 5, rng=0)
    one_row = lambda states: sp.Categorical(probs=[0.5, 0.5])  # noqa: E731
    with pytest.raises(ValueError, match=r"probs \(or logits\) of shape \(\d+, num_outcomes\)"):
        sp.chain(one_row, sp.batched(one_row), lambda s, x: s, 0, 5, rng=0)


@pytest.mark.parametrize(
    ("bad", "match"),
    [({"target": 5}, "target must be callable"), ({"stop": "x"}, "stop must be callable")],
)
def test_functions_are_checked_before_any_work(bad, match):
    args = {"target": target, "draft": draft, "step": step, "stop": None, **bad}
    with pytest.raises(TypeError, match=match):
        sp.chains(args["target"], args["draft"], args["step"], [(0, V, V)], 3, stop=args["stop"], rng=0)


def test_a_probability_array_returned_bare_by_the_target_warns():
    """Plain arrays are point masses; rows that sum to 1 were probably meant as a Categorical."""
    bare = lambda states: T[_ctx(states)]  # noqa: E731 - forgot sp.Categorical(probs=...)
    with pytest.warns(sp.distributions.PlainValueWarning, match=r"target.*speculate\.Categorical"):
        res = sp.chain(bare, draft, lambda s, x: s, (0, V, V), 2, lookahead=1, rng=0)
    assert np.array_equal(res.samples[0], T[0, V, V])  # a point mass at the array, as before


@pytest.mark.parametrize(("n", "states", "error"), [
    (np.uint64(2**63), [0], ValueError),  # would wrap to a negative int64: no outcomes, silently
    (2.5, [], TypeError),  # refused even when there are no chains
    ("5", [], TypeError),
    ([], [], None),  # no chains, no counts: nothing to do
])
def test_the_number_of_outcomes_is_checked_whatever_the_number_of_chains(n, states, error):
    tgt = lambda s: sp.Categorical(probs=np.full((len(s), 2), 0.5))  # noqa: E731
    drf = lambda s: sp.Categorical(probs=[0.5, 0.5])  # noqa: E731
    if error is None:
        assert sp.chains(tgt, drf, lambda s, x: s, states, n, rng=0).samples == []
        return
    with pytest.raises(error, match="outcomes per chain"):
        sp.chains(tgt, drf, lambda s, x: s, states, n, rng=0)


def test_proposal_lengths_must_be_integers():
    from speculate.rounds import Proposal, run

    class FloatLengths:
        def propose(self, rows, k, branches, need, rng):
            q = sp.Categorical(probs=np.full((len(rows), k, 2), 0.5), validate=False)
            return Proposal(q.sample(rng), q, lengths=np.full(len(rows), 1.5))

        def score(self, rows, proposal):
            return sp.Categorical(probs=np.full((len(rows), proposal.outcomes.shape[1] + 1, 2), 0.5))

        def commit(self, rows, proposal, verdict):
            return verdict.n_accepted + 1, None

    with pytest.raises(TypeError, match="lengths must be integers"):
        run(FloatLengths(), 1, 10, lookahead=3, rng=0)


def test_a_step_that_mutates_and_returns_its_state_is_refused():
    """A step that appends in place and returns its input corrupts every drafted path (a chi-square
    of 1.4e6 in the report): refused at its first call; returning an unchanged immutable state is fine."""
    P = np.array([[0.9, 0.1], [0.2, 0.8]])
    tgt = lambda states: sp.Categorical(probs=P[np.array([s[-1] for s in states])])  # noqa: E731
    drf = lambda s: sp.Categorical(probs=[[0.8, 0.2], [0.3, 0.7]][s[-1]])  # noqa: E731

    def mutating(state, x):
        state.append(x)
        return state

    with pytest.raises(ValueError, match="step returned the list it was given"):
        sp.chain(tgt, drf, mutating, [0], n=10, lookahead=3, rng=0)
    out = sp.chain(tgt, drf, lambda s, x: [*s, x], [0], n=10, lookahead=3, rng=0)
    assert len(out.samples) == 10
    same = sp.chain(lambda st_: sp.Categorical(probs=np.tile([0.5, 0.5], (len(st_), 1))),
                    lambda s: sp.Categorical(probs=[0.5, 0.5]), lambda s, x: s, 7, n=5, rng=0)
    assert same.state == 7  # an int state returned unchanged is not a mutation


def test_an_exception_in_the_users_functions_names_the_function():
    """Regression: an exception from step or stop called while drafting was labelled only 'raised in
    propose'; now a note names the user's function."""
    P = np.array([[0.9, 0.1], [0.2, 0.8]])
    tgt = lambda states: sp.Categorical(probs=P[np.array(states)])  # noqa: E731
    drf = lambda s: sp.Categorical(probs=P[s])  # noqa: E731

    def bad_step(s, x):
        raise KeyError("boom")

    def bad_stop(s, x):
        raise ZeroDivisionError("stop")

    with pytest.raises(KeyError) as e:
        sp.chain(tgt, drf, bad_step, 0, n=5, lookahead=2, rng=0)
    assert any("your step(state, outcome)" in n for n in e.value.__notes__)
    with pytest.raises(ZeroDivisionError) as e:
        sp.chain(tgt, drf, lambda s, x: x, 0, n=5, lookahead=2, rng=0, stop=bad_stop)
    assert any("your stop(state, outcome)" in n for n in e.value.__notes__)
    with pytest.raises(RuntimeError) as e:
        sp.chain(tgt, lambda s: (_ for _ in ()).throw(RuntimeError("d")), lambda s, x: x, 0, n=5, rng=0)
    assert any("your draft(state)" in n for n in e.value.__notes__)


def _redo_rejected_rounds(monkeypatch) -> None:
    """A planted fault the auto rule must never have: a round in which every row rejected its first
    draft is verified again with fresh uniforms (a rule that reacts to the round's own outcome)."""
    real = sp.rounds.verify_round

    def redo(target, proposal, rule, m, k, R, rng):
        out = real(target, proposal, rule, m, k, R, rng)
        return real(target, proposal, rule, m, k, R, rng) if k > 0 and not np.any(out[0]) else out

    monkeypatch.setattr(sp.rounds, "verify_round", redo)


def _single_chain_segments(c: int, tv: float, **kw) -> tuple[list, int]:
    """One chain (one row: every rejection rejects the whole round) of context ``c``'s segments."""
    need = chi2_sample_size(tv, V**L, alpha=ALPHA)
    res = sp.chain(target, draft, segment_step, (c, 0, V, V), L * need, **kw)
    s = res.samples
    return [tuple(s[i : i + L]) for i in range(0, len(s), L)], res.stats.rounds


@pytest.mark.parametrize(("mode", "tv"), [("cost_ratio", 0.02), ("measured", 0.05),
                                          pytest.param("measured", 0.02, marks=pytest.mark.slow)])
def test_auto_lookahead_is_exact_on_a_single_chain(mode, tv, monkeypatch):
    """lookahead="auto" on ONE chain, whose draft is far from the target (about half the rounds reject
    their first draft: the whole round), with the cost ratio fixed (k from alpha alone, 0 included)
    or measured (k from the measured costs of each width; many rounds at k = 0): the segments' joint
    law, TV `tv` caught with power >= 0.99 at ALPHA. With the fixed cost, the planted fault of
    ``_redo_rejected_rounds`` fails the same check (p < ALPHA on the same seed), so this test sees
    faults that only whole-round rejections trigger, which the many-row tests above average away."""
    kw = dict(lookahead="auto", rng=21, cost_ratio=0.05 if mode == "cost_ratio" else None)
    seqs, rounds = _single_chain_segments(2, tv, **kw)
    assert rounds < len(seqs) * L  # it did speculate
    assert_categorical_matches(seqs, joint_law(2), alpha=ALPHA, label=f"auto {mode}, one chain")
    if mode != "cost_ratio":
        return
    _redo_rejected_rounds(monkeypatch)
    biased, _ = _single_chain_segments(2, tv, **kw)
    assert chi2_gof(biased, joint_law(2)).pvalue < ALPHA  # the planted fault is caught


def test_auto_lookahead_can_choose_plain_decoding():
    """A useless draft (acceptance near 0) at a cost: the rule drafts nothing (k = 0) in most rounds,
    probing every 8th, and stays exact (one chain's first outcomes against the target's law)."""
    p = np.array([0.97, 0.01, 0.01, 0.01])
    q = np.array([0.0, 0.0, 0.0, 1.0])
    res = sp.chain(lambda s: sp.Categorical(probs=np.broadcast_to(p, (len(s), 4))), lambda s: sp.Categorical(probs=q),
                   lambda s, x: s, 0, 4000, lookahead="auto", cost_ratio=0.5, rng=3)
    counts = res.stats.lookahead_counts
    assert counts[0] > 0.8 * res.stats.rounds and sum(v for k, v in counts.items() if k > 0) > 0
    assert_categorical_matches(res.samples, p, alpha=ALPHA)


def test_auto_at_k0_throughout_is_lookahead_0_draw_for_draw():
    """A fixed cost_ratio >= 1 (a draft step costs a target call): no k can pay, auto drafts nothing in
    any round, and the run is the lookahead=0 run with the same seed, outcome for outcome."""
    starts = [(c, 0, V, V) for c in range(3)] * 4
    auto = sp.chains(target, draft, segment_step, starts, 60, lookahead="auto", cost_ratio=1.5, rng=8)
    plain = sp.chains(target, draft, segment_step, starts, 60, lookahead=0, rng=8)
    assert set(auto.stats.lookahead_counts) == {0}
    assert auto.samples == plain.samples
