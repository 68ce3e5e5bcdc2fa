"""Seed-stable sharding without a cluster: row streams, shard layouts, merged stats, errors, and the
exactness of the sharded path (the domains' own law tests, run through ``shards=``).

Same seed, same samples: the sharded path gives every row its own stream, so one process
(``shards=1``), 3 shards, a thread pool and a process pool return bit-identical samples for chains,
RL rollouts, physics trajectories and text (each row's computation is the same sequence of float
operations wherever it runs; text pins one torch thread so the reductions are the same too).
"""

from __future__ import annotations

import functools
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import dist_helpers as h
import numpy as np
import pytest
from speculate.domains.text import generate_sharded

import speculate as sp
from speculate.distributed import PerWorker, map_shards, row_streams, shard_ranges
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, check_conformance, chi2_sample_size


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as ex:
        yield ex


def test_row_streams_are_counter_based_and_independent_of_the_layout():
    a = [np.random.default_rng(s).integers(2**62) for s in row_streams(3, 10)]
    b = [np.random.default_rng(s).integers(2**62) for s in row_streams(3, 4, start=6)]
    assert a[6:] == b and len(set(a)) == 10
    assert a != [np.random.default_rng(s).integers(2**62) for s in row_streams(4, 10)]
    assert shard_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)] and shard_ranges(2, 5) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="shards"):
        shard_ranges(3, 0)


def test_stats_merge_by_summing_and_keep_the_subclass():
    from speculate.domains.physics import SimulationStats

    a, b = sp.Stats(), SimulationStats(steps=7)
    a.add_round(4, np.array([4, 1]), None)
    b.add_round(1, np.array([0]), None)
    m = sum([a, b])
    assert type(m) is SimulationStats and m.steps == 7  # per replica: not summed
    assert (m.rounds, m.row_rounds, m.proposed, m.accepted, m.rejections) == (2, 3, 9, 5, 2)
    assert m.accepted_per_position.tolist() == [1, 1, 0, 0, 1] and m.lookahead_counts == {4: 1, 1: 1}
    assert sp.Stats.merge([]).rounds == 0


def _chains(**kw):
    return sp.chains(h.target, h.draft, h.step, h.starts(7), [20 + i for i in range(7)], lookahead=3, rng=9, **kw)


def test_chains_same_seed_same_samples_in_every_layout(pool):
    ref = _chains(shards=1)
    assert [len(s) for s in ref.samples] == [20 + i for i in range(7)]
    for out in (_chains(shards=3), _chains(shards=7), _chains(executor=ThreadPoolExecutor(2)), _chains(executor=pool)):
        assert out.samples == ref.samples and out.states == ref.states
        assert out.stats.as_dict()["accepted_per_position"] == ref.stats.as_dict()["accepted_per_position"]
    # rows_per_stream: 2 chains per stream and batched loop; stable over layouts of whole streams
    two = _chains(shards=1, rows_per_stream=2)
    assert _chains(shards=4, rows_per_stream=2).samples == two.samples
    # the single-process path (one stream for the batch) is unchanged and still the default
    plain = sp.chains(h.target, h.draft, h.step, h.starts(7), [20 + i for i in range(7)], lookahead=3, rng=9)
    assert plain.stats.rounds < ref.stats.rounds  # one batched loop: fewer target calls


def test_rollouts_same_seed_same_episodes(pool):
    pytest.importorskip("gymnasium")
    from speculate.domains.rl import speculative_rollouts

    pol, dr = h.frozenlake_policies()
    envs = [h.frozenlake] * 6
    ref = speculative_rollouts(envs, pol, dr, max_steps=30, rng=2, shards=1)
    for kw in ({"shards": 4}, {"executor": pool}):
        h.same_episodes(speculative_rollouts(envs, pol, dr, max_steps=30, rng=2, **kw), ref)
    per_env = speculative_rollouts(envs, [pol] * 6, [dr] * 6, max_steps=30, rng=2, shards=3)  # one policy per env
    h.same_episodes(per_env, ref)
    assert ref.stats.emitted == sum(len(e) for e in ref) and all(e.stats is ref.stats for e in ref)
    with pytest.raises(TypeError, match="env constructors"):
        speculative_rollouts([h.frozenlake()], pol, dr, rng=0, executor=pool)


def test_physics_same_seed_same_trajectories(pool):
    from speculate.domains.physics import speculative_simulate

    x0 = np.linspace(-1, 1, 5).reshape(5, 1, 1)
    ref = speculative_simulate(h.langevin(), x0, 40, lookahead=4, rng=3, shards=1)
    for kw in ({"shards": 3}, {"executor": pool}):
        out = speculative_simulate(h.langevin(), x0, 40, lookahead=4, rng=3, **kw)
        np.testing.assert_array_equal(out.positions, ref.positions)
        assert out.stats.accepted == ref.stats.accepted and out.stats.steps == 40
    one = speculative_simulate(h.langevin(), x0[0], 40, lookahead=4, rng=3, shards=2)  # [N, d]: one replica
    np.testing.assert_array_equal(one.positions, ref.positions[0])


def test_text_same_seed_same_tokens(pool):
    pytest.importorskip("transformers")
    gen = h.text_generator()
    ref = gen.generate(h.PROMPTS, max_new_tokens=10, rng=4, shards=1)
    assert all(len(t) == 10 for t in ref.new_tokens)
    for kw in ({"shards": 4}, {"executor": pool}):
        assert gen.generate(h.PROMPTS, max_new_tokens=10, rng=4, **kw).sequences == ref.sequences
    ids = [gen.tokenizer(p).input_ids for p in h.PROMPTS]  # a generator built once per worker
    out = generate_sharded(PerWorker(h.text_generator), ids, max_new_tokens=10, rng=4, executor=pool)
    assert out.sequences == ref.sequences and out.stats.rounds == ref.stats.rounds


def test_a_users_exception_names_the_shard_and_the_row(pool):
    for ex in (None, pool):
        with pytest.raises(RuntimeError, match="user's target failed") as info:
            sp.chains(h.Boom(), h.draft, h.step, [(0, 3, 3)] * 4 + [(1, 3, 3)], 5, rng=0, executor=ex, shards=2)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "shard 1" in notes and "row 4" in notes, notes


def test_per_worker_values_are_built_once_per_process():
    calls = []
    value = PerWorker(lambda: calls.append(1) or len(calls))
    out = map_shards(_read, {"x": list(range(6))}, fixed={"v": value}, merge=lambda parts, t: parts, rng=0, shards=3)
    assert out == [1] * 6 and calls == [1]


def _read(rng, x, v):
    return v


# ---------------------------------------------------------------------------------------------
# exactness of the sharded path: the domains' law tests, through shards=


def test_chains_sharded_joint_law():
    """Each context's 3-outcome joint law, chains run in 3 shards of 256-chain streams (TV 0.02)."""
    per = chi2_sample_size(0.02, h.V**3, alpha=ALPHA / 2)
    res = sp.chains(h.target, h.draft, h.step, h.starts(2 * per), 3, lookahead=2, verify="block", rng=5,
                    shards=3, rows_per_stream=256)
    for c in range(2):
        assert_categorical_matches([tuple(s) for s in res.samples[c::2]], h.joint_law(c), alpha=ALPHA / 2,
                                   label=f"sharded chains, context {c}")


def test_physics_conformance_on_the_sharded_path(monkeypatch):
    from speculate.domains.physics import conformance, speculative_simulate

    monkeypatch.setattr(conformance, "speculative_simulate",
                        functools.partial(speculative_simulate, shards=3, rows_per_stream=500))
    for case in conformance.conformance_cases():
        check_conformance(case, seed=3, alpha=ALPHA / conformance.CHECKS)


@pytest.mark.slow
def test_rl_conformance_on_the_sharded_path(monkeypatch):
    from speculate.domains.rl import conformance, speculative_rollouts

    monkeypatch.setattr(conformance, "speculative_rollouts",
                        functools.partial(speculative_rollouts, shards=3, rows_per_stream=100))
    for case in conformance.conformance_cases():
        check_conformance(case, seed=3, alpha=ALPHA / 2)
