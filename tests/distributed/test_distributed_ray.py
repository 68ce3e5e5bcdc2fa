"""On a local Ray (``ray.init(num_cpus=2)``): ``executor="ray"`` gives the same samples as one process,
a killed worker's task is retried (``max_retries``) with the same result, and
``SpeculativeTextBatches`` in ``Dataset.map_batches`` generates the same tokens as ``generate``.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import dist_helpers as h
import numpy as np
import pytest

import speculate as sp

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_runtime():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(h)  # the workers do not have tests/ on their path
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(h)


def test_chains_and_rollouts_on_ray_equal_one_process(ray_runtime):
    ref = sp.chains(h.target, h.draft, h.step, h.starts(6), 20, lookahead=2, rng=3, shards=1)
    out = sp.chains(h.target, h.draft, h.step, h.starts(6), 20, lookahead=2, rng=3, executor="ray", shards=3)
    assert out.samples == ref.samples and out.stats.accepted == ref.stats.accepted
    pytest.importorskip("gymnasium")
    from speculate.domains.rl import speculative_rollouts

    pol, dr = h.frozenlake_policies()
    ref = speculative_rollouts([h.frozenlake] * 4, pol, dr, max_steps=30, rng=5, shards=1)
    h.same_episodes(speculative_rollouts([h.frozenlake] * 4, pol, dr, max_steps=30, rng=5,
                                         executor=sp.distributed.RayExecutor(max_retries=2)), ref)


def test_a_killed_ray_worker_is_retried_and_the_result_is_unchanged(ray_runtime, tmp_path):
    starts = h.starts(8)
    ref = sp.chains(h.target, h.draft, h.step, starts, 30, lookahead=3, rng=4, shards=1)
    slow = h.SlowTarget(0.03, str(tmp_path))
    out: dict = {}

    def work():
        out["res"] = sp.chains(slow, h.draft, h.step, starts, 30, lookahead=3, rng=4,
                               executor=sp.distributed.RayExecutor(max_retries=3), shards=2)

    t = threading.Thread(target=work)
    t.start()
    deadline = time.time() + 60
    while not any(p.name.isdigit() for p in tmp_path.iterdir()):
        assert time.time() < deadline, "no shard started"
        time.sleep(0.05)
    time.sleep(0.3)
    victim = next(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert t.is_alive()
    os.kill(victim, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive()
    res = out["res"]
    assert res.samples == ref.samples and res.states == ref.states and res.stats.accepted == ref.stats.accepted
    calls = (tmp_path / "calls.log").read_text().split()
    assert str(victim) in calls and len(calls) > ref.stats.target_calls  # the victim's task ran again


def test_ray_data_map_batches_generates_the_same_tokens(ray_runtime):
    pytest.importorskip("transformers")
    pytest.importorskip("ray.data")
    from speculate.domains.text import SpeculativeTextBatches

    prompts = h.PROMPTS[:4]
    ref = h.text_generator().generate(prompts, max_new_tokens=8, rng=6, shards=1)
    ds = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    out = ds.map_batches(SpeculativeTextBatches, batch_size=3, concurrency=1,
                         fn_constructor_kwargs={"max_new_tokens": 8, "seed": 6, "lookahead": 3, "num_threads": 1})
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["prompt"] for r in rows] == prompts
    assert [list(np.asarray(r["new_tokens"]).tolist()) for r in rows] == ref.new_tokens
    assert [r["text"] for r in rows] == [ref_text(t) for t in ref.new_tokens]
    assert sum(r["accepted"] for r in rows) == ref.stats.accepted and all(r["rounds"] >= 1 for r in rows)


def ref_text(ids):
    return h.text_generator().tokenizer.decode(ids)
