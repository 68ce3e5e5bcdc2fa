"""On a local Dask cluster (2 worker processes, 1 thread each): the same samples as one process, and a
killed worker's shard re-run elsewhere with the same result.

Bit-identical: chains, RL rollouts and physics trajectories (every row's floats come from the same
operations in the same order wherever it runs) and text (one torch thread in every process).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import dist_helpers as h
import numpy as np
import pytest
from speculate.domains.text import generate_sharded

import speculate as sp

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")


@pytest.fixture(scope="module")
def client():
    cloudpickle.register_pickle_by_value(h)  # the workers do not have tests/ on their path
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       silence_logs=50)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()
        cloudpickle.unregister_pickle_by_value(h)


def test_chains_1_process_2_workers_3_shards(client):
    def run(**kw):
        return sp.chains(h.target, h.draft, h.step, h.starts(9), 25, lookahead=3, verify="block", rng=1, **kw)

    ref = run(shards=1)
    for out in (run(executor=client.get_executor()), run(executor=client, shards=3)):
        assert out.samples == ref.samples and out.states == ref.states
        assert out.stats.accepted == ref.stats.accepted and out.stats.rounds == ref.stats.rounds


def test_rollouts_1_process_2_workers_3_shards(client):
    pytest.importorskip("gymnasium")
    from speculate.domains.rl import speculative_rollouts

    pol, dr = h.frozenlake_policies()
    pol_w = sp.distributed.PerWorker(lambda: h.frozenlake_policies()[0])  # built once per worker
    ref = speculative_rollouts([h.frozenlake] * 5, pol, dr, max_steps=40, rng=8, shards=1)
    h.same_episodes(speculative_rollouts([h.frozenlake] * 5, pol_w, dr, max_steps=40, rng=8,
                                         executor=client.get_executor()), ref)
    h.same_episodes(speculative_rollouts([h.frozenlake] * 5, pol, dr, max_steps=40, rng=8, executor=client,
                                         shards=3), ref)


def test_physics_1_process_2_workers_3_shards(client):
    from speculate.domains.physics import speculative_simulate

    x0 = np.linspace(-1, 1, 6).reshape(6, 1, 1)
    ref = speculative_simulate(h.langevin(), x0, 30, lookahead=3, rng=2, shards=1)
    for kw in ({}, {"shards": 3}):
        out = speculative_simulate(h.langevin(), x0, 30, lookahead=3, rng=2, executor=client, **kw)
        np.testing.assert_array_equal(out.positions, ref.positions)
        np.testing.assert_array_equal(out.final, ref.final)


def test_text_1_process_2_workers_3_shards(client):
    pytest.importorskip("transformers")
    gen = h.text_generator()
    ref = gen.generate(h.PROMPTS[:4], max_new_tokens=8, rng=6, shards=1)
    ids = [gen.tokenizer(p).input_ids for p in h.PROMPTS[:4]]
    for shards in (None, 3):
        out = generate_sharded(sp.distributed.PerWorker(h.text_generator), ids, max_new_tokens=8,
                                              rng=6, executor=client, shards=shards)
        assert out.sequences == ref.sequences


def test_a_killed_worker_is_replaced_and_the_result_is_unchanged(client, tmp_path):
    """SIGKILL one worker process while it runs a shard: Dask re-runs that shard on a live worker
    (the nanny restarts the dead one); the samples equal the undisturbed run's."""
    starts = h.starts(8)
    ref = sp.chains(h.target, h.draft, h.step, starts, 30, lookahead=3, rng=4, shards=1)
    slow = h.SlowTarget(0.03, str(tmp_path))
    pids_before = set(client.run(os.getpid).values())
    out: dict = {}

    def work():
        out["res"] = sp.chains(slow, h.draft, h.step, starts, 30, lookahead=3, rng=4, executor=client, shards=2)

    t = threading.Thread(target=work)
    t.start()
    deadline = time.time() + 30
    while not any(p.name.isdigit() and int(p.name) in pids_before for p in tmp_path.iterdir()):
        assert time.time() < deadline, "no shard started"
        time.sleep(0.05)
    time.sleep(0.3)  # well inside the shard (about 1.5 s of sleeping target calls)
    victim = next(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit() and int(p.name) in pids_before)
    assert t.is_alive()  # the run is still going: the victim is inside its shard
    os.kill(victim, signal.SIGKILL)
    t.join(90)
    assert not t.is_alive()
    res = out["res"]
    assert res.samples == ref.samples and res.states == ref.states and res.stats.accepted == ref.stats.accepted
    calls = (tmp_path / "calls.log").read_text().split()
    assert str(victim) in calls and len(calls) > ref.stats.target_calls  # the victim's shard ran twice
    deadline = time.time() + 30  # the nanny restarts the dead worker: two live workers, the victim gone
    while True:
        pids = {p for p in client.run(os.getpid, on_error="return").values() if isinstance(p, int)}
        if len(pids) == 2 and victim not in pids:
            break
        assert time.time() < deadline, pids
        time.sleep(0.2)
