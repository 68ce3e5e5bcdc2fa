"""Normal transitions whose scale varies along the drafted positions, through the round loop.

The round loop sends a round of Normal proposals to the reflection kernel ("gaussian" route) only
when the draft and the target have the SAME scale at every position a row's verifier reads (target
position i against draft position i, i < length; padding past a row's length may differ), and
otherwise to the one-step rule position by position ("general" route). Here the scale depends on the
state, equal at some positions and rows and unequal at others, rows of different models share a
batch, chains of different lengths leave padding, and one model's draft is so far off (delta = 6,
acceptance 2 Phi(-3) = 0.27%) that almost every round ends in a reflection.

The law is checked exactly through the Rosenblatt transform: under step-by-step target sampling
the innovations U_t = Phi((X_t - m_p(S_{t-1})) / s_p(S_{t-1})) of every chain are i.i.d. uniform on
(0, 1), whatever the states, so the joint law of a whole path is the uniform law on the cube.
Each check runs at ALPHA / (its number of checks) and states the deviation it catches with power
0.99 (chi2_sample_size / ks_sample_size); a misaligned scale check (the target's scale at position
i + 1 compared with the draft's at i) sends the first round to the reflection kernel with the
target's scale 2 where the draft's is 1, which shifts the law of the first step far beyond these.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import speculate as sp
from speculate.rounds import Proposal
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, assert_continuous_matches, chi2_sample_size, ks_sample_size
from speculate.verify import verify_round

# model -> (target mean, target scale, draft mean, draft scale) as functions of (x, t)
MODELS = {
    # equal scales everywhere, varying with the state and the step: the kernel must use position i's
    0: (
        lambda x, t: 0.8 * x,
        lambda x, t: 0.6 + 0.4 * abs(math.tanh(x)) + 0.1 * t,
        lambda x, t: 0.5 * x + 0.3,
        lambda x, t: 0.6 + 0.4 * abs(math.tanh(x)) + 0.1 * t,
    ),
    # unequal at the first step only (target scale 2, draft 1), equal after
    1: (lambda x, t: 0.8 * x, lambda x, t: 2.0 if t == 0 else 1.0, lambda x, t: 0.6 * x, lambda x, t: 1.0),
    # unequal where x <= 0 (target scale 0.3), equal where x > 0
    2: (lambda x, t: 0.7 * x + 0.2, lambda x, t: 1.0 if x > 0 else 0.3, lambda x, t: 0.5 * x + 0.4, lambda x, t: 1.0),
    # equal scales, the draft 6 scales away: rejected (and reflected) in 99.7% of the rounds
    3: (lambda x, t: 0.9 * x, lambda x, t: 0.5, lambda x, t: 0.9 * x + 3.0, lambda x, t: 0.5),
}


def _normals(states, which):
    loc = np.array([MODELS[m][which](x, t) for x, m, t in states])
    scale = np.array([MODELS[m][which + 1](x, t) for x, m, t in states])
    return sp.Normal(loc, scale, batch_ndims=1)


def target(states):
    return _normals(states, 0)


@sp.batched
def draft(states):
    return _normals(states, 2)


def step(state, y):
    _, m, t = state
    return (float(y), m, t + 1)


def innovations(start, path):
    """U_t = Phi((x_t - m_p(s_{t-1})) / s_p(s_{t-1})) along one chain's path."""
    s, out = start, []
    for y in path:
        x, m, t = s
        out.append(stats.norm.cdf((float(y) - MODELS[m][0](x, t)) / MODELS[m][1](x, t)))
        s = step(s, y)
    return out


def _cells(u, bins):
    return tuple(np.minimum((np.asarray(u) * bins).astype(int), bins - 1).tolist())


def _check_uniform_paths(starts, samples, L, bins, tv, d, label):
    """2 checks at ALPHA / 2: chi-square of the binned first L innovations of every chain (the
    joint law of a path's first L steps, bins**L cells) and KS of all innovations pooled."""
    U = [innovations(s, path) for s, path in zip(starts, samples, strict=True)]
    first = [_cells(u[:L], bins) for u in U if len(u) >= L]
    cells = bins**L
    assert len(first) >= chi2_sample_size(tv, cells, alpha=ALPHA / 2), "too few paths for the stated power"
    law = {tuple(int(c) for c in np.unravel_index(i, (bins,) * L)): 1 / cells for i in range(cells)}
    assert_categorical_matches(first, law, alpha=ALPHA / 2, label=f"{label}: joint law of {L} steps")
    pooled = np.concatenate([np.asarray(u) for u in U])
    assert len(pooled) >= ks_sample_size(d, alpha=ALPHA / 2)
    assert_continuous_matches(pooled, stats.uniform(), alpha=ALPHA / 2, label=f"{label}: innovations")


def test_equal_per_position_scales_with_padding_take_the_reflection_route():
    """Models 0 and 3 (equal scales, varying along the positions), 14 000 chains of 2, 3 or 4
    outcomes in one batch (the shorter ones padded, with draft scale 1 in the padding), lookahead 3:
    every round that drafts takes the reflection kernel, and the law is exact: the joint law of
    the first two innovations on 8 x 8 cells catches a binned deviation of TV 0.05 and the KS
    check on all ~42 000 innovations a CDF deviation of 0.025, each with power 0.99."""
    B = 14_000
    rng = np.random.default_rng(0)
    starts = [(float(rng.normal()), int(m), 0) for m in rng.choice([0, 3], B)]
    ns = rng.integers(2, 5, B).tolist()
    res = sp.chains(target, draft, step, starts, ns, lookahead=3, rng=1)
    routes = res.stats.routes
    # padding never forces the general route; only rounds that draft nothing (k = 0: the target is
    # sampled directly, with no draft distribution to compare) go there
    assert routes.get("gaussian", 0) >= 2 and routes.get("general", 0) == res.stats.lookahead_counts.get(0, 0), routes
    assert [len(s) for s in res.samples] == ns
    assert res.stats.accepted > 0 and res.stats.acceptance_rate < 0.9
    _check_uniform_paths(starts, res.samples, L=2, bins=8, tv=0.05, d=0.025, label="equal scales")


def test_scales_unequal_at_the_first_position_take_the_general_route_then_reflection():
    """Models 1 and 3 in one batch, 5 000 chains of 3 outcomes, lookahead 2: in the first round
    model 1's target scale is 2 at position 0 and its draft's 1 (equal at positions 1 and 2), so
    the round must go to the general rule; later rounds have equal scales everywhere and take the
    reflection kernel. Both routes run, and the joint law of the 3 innovations on 4 x 4 x 4 cells
    catches a binned deviation of TV 0.1 (KS on all 15 000: 0.04), power 0.99. With the check
    misaligned the first step of model 1 comes out with the wrong scale: chi-square p ~ 1e-80."""
    B = 5_000
    rng = np.random.default_rng(2)
    starts = [(float(rng.normal()), int(m), 0) for m in rng.choice([1, 3], B)]
    res = sp.chains(target, draft, step, starts, 3, lookahead=2, rng=3)
    assert res.stats.routes.get("general", 0) >= 1 and res.stats.routes.get("gaussian", 0) >= 1, res.stats.routes
    _check_uniform_paths(starts, res.samples, L=3, bins=4, tv=0.1, d=0.04, label="first position unequal")


def test_state_dependent_scales_switch_routes_round_by_round():
    """Two chains in one batch, model 2 (scales unequal where x <= 0: 0.3 against 1) and model 3
    (equal, the draft far off: mostly reflections), 9 000 outcomes each, lookahead 3: rounds whose
    read positions all have equal scales take the reflection kernel, the others the general rule
    (both happen hundreds of times). The innovations of each chain are
    i.i.d. uniform: consecutive triples on 4 x 4 x 4 cells (catches binned TV 0.1) and KS on all
    18 000 (0.035), power 0.99."""
    n = 9_000
    starts = [(0.5, 2, 0), (-0.5, 3, 0)]
    res = sp.chains(target, draft, step, starts, n, lookahead=3, rng=4)
    routes = res.stats.routes
    assert routes.get("general", 0) > 100 and routes.get("gaussian", 0) > 100, routes
    U = [innovations(s, path) for s, path in zip(starts, res.samples, strict=True)]
    triples = [_cells(u[i : i + 3], 4) for u in U for i in range(0, n - 2, 3)]
    assert len(triples) >= chi2_sample_size(0.1, 64, alpha=ALPHA / 2)
    law = {tuple(int(c) for c in np.unravel_index(i, (4, 4, 4))): 1 / 64 for i in range(64)}
    assert_categorical_matches(triples, law, alpha=ALPHA / 2, label="state-dependent: consecutive triples")
    pooled = np.concatenate(U)
    assert len(pooled) >= ks_sample_size(0.035, alpha=ALPHA / 2)
    assert_continuous_matches(pooled, stats.uniform(), alpha=ALPHA / 2, label="state-dependent: innovations")


@pytest.mark.slow
def test_mixed_models_long_paths_slow():
    """All four models in one batch, 40 000 chains of 4 outcomes, lookahead 3, both routes: the
    joint law of the first 3 innovations on 6 x 6 x 6 cells catches a binned deviation of TV 0.05,
    KS on all 160 000 innovations 0.012, power 0.99."""
    B = 40_000
    rng = np.random.default_rng(5)
    starts = [(float(rng.normal()), int(m), 0) for m in rng.choice(4, B)]
    res = sp.chains(target, draft, step, starts, 4, lookahead=3, rng=6)
    assert res.stats.routes.get("general", 0) >= 1
    _check_uniform_paths(starts, res.samples, L=3, bins=6, tv=0.05, d=0.012, label="all models")


# ------------------------------------------------------------------------ the routing itself, exactly
def _round(scale_p, scale_q, lengths):
    """One round of R = 2 rows, k = 3, 1-D events, with the given per-position scales."""
    R, k = 2, 3
    loc_p, loc_q = np.zeros((R, k + 1)), np.full((R, k), 0.5)
    t = sp.Normal(loc_p, np.asarray(scale_p, float), batch_ndims=2)
    d = sp.Normal(loc_q, np.asarray(scale_q, float), batch_ndims=2)
    prop = Proposal(np.full((R, k), 0.25), d, None if lengths is None else np.array(lengths), None)
    return verify_round(t, prop, "token", 1, k, R, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("scale_p", "scale_q", "lengths", "route"),
    [
        # equal at every position, different per position and row: the kernel
        ([[1, 2, 3, 9], [4, 5, 6, 7]], [[1, 2, 3], [4, 5, 6]], None, "gaussian"),
        # row 1 unequal at position 0 only; positions 1..3 of the TARGET equal the draft's 0..2
        ([[1, 2, 3, 9], [7, 4, 5, 6]], [[1, 2, 3], [4, 5, 6]], None, "general"),
        ([[2, 1, 1, 1], [1, 1, 1, 1]], [[1, 1, 1], [1, 1, 1]], None, "general"),
        # unequal only past row 1's length (padding): ignored
        ([[1, 2, 3, 9], [4, 5, 8, 8]], [[1, 2, 3], [4, 5, 1]], [3, 2], "gaussian"),
        # unequal at the last position row 0 reads
        ([[1, 2, 3, 9], [4, 5, 6, 7]], [[1, 2, 4], [4, 5, 6]], [3, 1], "general"),
        # scalar scales, equal and unequal
        (1.5, 1.5, None, "gaussian"),
        (1.5, 1.0, None, "general"),
    ],
)
def test_route_follows_the_scales_each_row_reads(scale_p, scale_q, lengths, route):
    """The per-position equal-scale check compares the target's scale at position i with the
    draft's at position i, for i below each row's length, and nothing else."""
    sp_ = np.broadcast_to(np.asarray(scale_p, float), (2, 4))
    sq_ = np.broadcast_to(np.asarray(scale_q, float), (2, 3))
    if np.ndim(scale_p):
        p_arr, q_arr = sp_, sq_
    else:
        p_arr, q_arr = scale_p, scale_q
    _, nxt, _, got = _round(p_arr, q_arr, lengths)
    assert got == route
    assert np.all(np.isfinite(np.asarray(nxt, dtype=float)))
