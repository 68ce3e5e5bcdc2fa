"""Throughput of sharded runs on 1 and 2 Dask worker processes, the engine's overhead per shard, the
time to recover from a killed worker, and the cost of per-row random streams on one process.

Workloads (CPU-bound, one thread per worker process):
- RL: speculative rollouts of CartPole-v1 with a 2x256 MLP policy (torch, one thread) and a linear
  draft, ``lookahead=4``;
- chains: speculative sampling of a 64-state Markov chain whose target costs one 384x384 matrix
  product per call (a stand-in for a model), draft cheap.

Reported: rows/s and the speedup of 2 workers over 1 (goal >= 1.7x on 2 cores), both with 2 shards
per worker; the engine's cost per shard (Dask, Ray, ProcessPoolExecutor: empty shards, seconds per
shard); the time from killing a worker (SIGKILL, mid-shard) to the finished result minus the
undisturbed run's time; and on one process the seed-stable path (one stream and loop per row, or
per ``rows_per_stream`` rows) against the single-stream batched path.

    .venv/bin/python benchmarks/distributed/bench_distributed.py            # a few minutes on 2 quiet cores
    .venv/bin/python benchmarks/distributed/bench_distributed.py --quick    # tiny sizes: checks it runs
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: report.py
from report import describe, machine, write  # noqa: E402

import speculate as sp  # noqa: E402
import speculate.distributed  # noqa: E402

S = 64  # states of the chain
_r = np.random.default_rng(0)
P = _r.dirichlet(np.full(S, 0.3), S)
Q = 0.7 * P + 0.3 * _r.dirichlet(np.full(S, 0.3), S)
W = _r.standard_normal((384, 384)) / 20


class ChainTarget:
    """P[state] after ``work`` 384x384 matrix products per call (a model's cost); optionally marks
    its process id in ``pid_dir`` (for the kill test)."""

    def __init__(self, work: int = 1, pid_dir: str | None = None) -> None:
        self.work, self.pid_dir = work, pid_dir

    def __call__(self, states):
        if self.pid_dir is not None:
            mark = Path(self.pid_dir) / str(os.getpid())
            if not mark.exists():
                mark.write_text("")
        x = np.ones((len(states), 384))
        for _ in range(self.work):
            x = np.tanh(x @ W)
        return sp.Categorical(probs=P[np.asarray(states)], validate=False)


@sp.batched
def chain_draft(states):
    return sp.Categorical(probs=Q[np.asarray(states)], validate=False)


def chain_step(s, x):
    return x


def cartpole():
    import gymnasium as gym

    return gym.make("CartPole-v1")


class MLPPolicy:
    """logits [N, 2] from a 4-256-256-2 torch MLP (random weights from ``seed``; one torch thread)."""

    def __init__(self, seed: int = 0, hidden: int = 256) -> None:
        import torch

        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(seed)
        self.layers = [torch.randn(4, hidden, generator=g) / 2, torch.randn(hidden, hidden, generator=g) / 16,
                       torch.randn(hidden, 2, generator=g) / 16]

    def __call__(self, obs):
        import torch

        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
            for w in self.layers[:-1]:
                x = torch.tanh(x @ w)
            return (x @ self.layers[-1]).double().numpy()


class LinearDraft:
    def __call__(self, obs):
        z = np.asarray(obs) @ np.array([0.1, 0.5, 1.0, 0.8]) * 3
        return np.stack([-z, z], axis=1)


def _rl(rows: int, max_steps: int, **kw):
    from speculate.domains.rl import speculative_rollouts

    sharded = "executor" in kw or "shards" in kw  # PerWorker: built once per worker process
    policy = sp.distributed.PerWorker(MLPPolicy) if sharded else MLPPolicy()
    return speculative_rollouts([cartpole] * rows, policy, LinearDraft(),
                                max_steps=max_steps, lookahead=4, rng=1, **kw)


def _chains(rows: int, n: int, target=None, **kw):
    return sp.chains(target or ChainTarget(), chain_draft, chain_step, [0] * rows, n, lookahead=4, rng=1, **kw)


def _timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cluster(workers: int):
    import cloudpickle
    import distributed

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers import this script by value
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50)
    return cluster, distributed.Client(cluster)


def throughput(sizes: dict) -> list[dict]:
    out = []
    for workers in (1, 2):
        cluster, client = _cluster(workers)
        try:
            client.run(lambda: __import__("torch").set_num_threads(1))
            shards = 2 * workers
            _rl(2 * workers, 20, executor=client, shards=shards)  # warm-up: imports, JIT, policies built
            _chains(2 * workers, 20, executor=client, shards=shards)
            kw = {"executor": client, "shards": shards}
            t_rl = _timed(lambda kw=kw: _rl(sizes["rl_rows"], sizes["rl_steps"], **kw))
            t_ch = _timed(lambda kw=kw: _chains(sizes["chain_rows"], sizes["chain_n"], **kw))
            out.append({"workers": workers, "shards": shards, "rl_seconds": t_rl, "chain_seconds": t_ch,
                        "rl_rollouts_per_s": sizes["rl_rows"] / t_rl, "chains_per_s": sizes["chain_rows"] / t_ch})
        finally:
            client.close()
            cluster.close()
    return out


def _empty(rng, x):
    return x


def overhead(n_shards: int) -> list[dict]:
    """Seconds per empty shard (submit, pickle, run, return, merge) on each engine, after a warm-up."""
    from concurrent.futures import ProcessPoolExecutor

    rows = {"x": list(range(n_shards))}

    def per_shard(ex) -> float:
        def go():
            return sp.distributed.map_shards(_empty, rows, merge=lambda p, t: p, rng=0, executor=ex,
                                             shards=n_shards)

        go()
        return _timed(go, repeat=3) / n_shards

    res = []
    cluster, client = _cluster(2)
    try:
        res.append({"engine": "dask (2 workers)", "seconds_per_shard": per_shard(client)})
    finally:
        client.close()
        cluster.close()
    with ProcessPoolExecutor(2) as ex:
        res.append({"engine": "ProcessPoolExecutor(2)", "seconds_per_shard": per_shard(ex)})
    try:
        import ray
    except ImportError:
        return res
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        res.append({"engine": "ray (2 CPUs)", "seconds_per_shard": per_shard(sp.distributed.RayExecutor())})
    finally:
        ray.shutdown()
    return res


def recovery(sizes: dict) -> dict:
    """Kill one of 2 Dask workers 30% into a run; the extra time over the undisturbed run."""
    cluster, client = _cluster(2)
    try:
        rows, n = sizes["kill_rows"], sizes["kill_n"]
        _chains(4, 10, executor=client, shards=2)
        t_clean = _timed(lambda: _chains(rows, n, target=ChainTarget(work=sizes["kill_work"]), executor=client,
                                         shards=2))
        pids = set(client.run(os.getpid).values())
        with tempfile.TemporaryDirectory() as tmp:
            target = ChainTarget(work=sizes["kill_work"], pid_dir=tmp)
            done: dict = {}
            t0 = time.perf_counter()
            th = threading.Thread(target=lambda: done.setdefault(
                "res", _chains(rows, n, target=target, executor=client, shards=2)))
            th.start()
            time.sleep(0.3 * t_clean)
            victims = [int(p.name) for p in Path(tmp).iterdir() if int(p.name) in pids]
            os.kill(victims[0], signal.SIGKILL)
            th.join()
            t_killed = time.perf_counter() - t0
        same = done["res"].samples == _chains(rows, n, target=ChainTarget(work=sizes["kill_work"]), shards=1).samples
        return {"undisturbed_seconds": t_clean, "killed_seconds": t_killed, "recovery_seconds": t_killed - t_clean,
                "result_identical": bool(same)}
    finally:
        client.close()
        cluster.close()


def stream_cost(sizes: dict) -> list[dict]:
    """One process: the single-stream batched path vs per-row streams vs rows_per_stream blocks."""
    import torch

    torch.set_num_threads(1)
    rows = sizes["rl_rows"]
    res = []
    for name, kw in (("one stream, one batched loop (default)", {}),
                     ("one stream per row (shards=1)", {"shards": 1}),
                     (f"one stream per {rows // 4} rows", {"shards": 1, "rows_per_stream": max(1, rows // 4)})):
        t_rl = _timed(lambda kw=kw: _rl(rows, sizes["rl_steps"], **kw), repeat=2)  # the first run warms up
        t_ch = _timed(lambda kw=kw: _chains(sizes["chain_rows"], sizes["chain_n"], **kw), repeat=2)
        res.append({"path": name, "rl_seconds": t_rl, "chain_seconds": t_ch})
    return res


def markdown(rec: dict) -> str:
    lines = [
        "# Distributed: sharded runs on Dask and Ray",
        "",
        f"Machine: {describe(rec['machine'])}. Command: `{rec['machine']['command']}`.",
        "",
        f"Workloads: RL = {rec['sizes']['rl_rows']} CartPole rollouts of up to {rec['sizes']['rl_steps']} steps "
        f"(2x256 MLP policy, linear draft, k=4); chains = {rec['sizes']['chain_rows']} chains of "
        f"{rec['sizes']['chain_n']} outcomes (target: one 384x384 matmul per call, k=4).",
        "",
        "## Throughput (Dask LocalCluster, process workers, 1 thread each, 2 shards per worker)",
        "",
        "| workers | RL rollouts/s | chains/s |",
        "|---|---|---|",
    ]
    for r in rec["throughput"]:
        lines.append(f"| {r['workers']} | {r['rl_rollouts_per_s']:.2f} | {r['chains_per_s']:.2f} |")
    t = {r["workers"]: r for r in rec["throughput"]}
    if 1 in t and 2 in t:
        lines += ["", f"Speedup with 2 workers: RL {t[1]['rl_seconds'] / t[2]['rl_seconds']:.2f}x, chains "
                      f"{t[1]['chain_seconds'] / t[2]['chain_seconds']:.2f}x (goal >= 1.7x)."]
    lines += ["", "## Engine overhead per shard (empty shards)", "", "| engine | ms per shard |", "|---|---|"]
    lines += [f"| {r['engine']} | {1e3 * r['seconds_per_shard']:.2f} |" for r in rec["overhead"]]
    k = rec["recovery"]
    lines += ["", "## Recovery from a killed worker (Dask, SIGKILL 30% into the run)", "",
              f"Undisturbed {k['undisturbed_seconds']:.2f} s, with the kill {k['killed_seconds']:.2f} s: "
              f"{k['recovery_seconds']:.2f} s to recover (re-running the lost shard); result identical: "
              f"{k['result_identical']}.", "",
              "## Cost of per-row streams on one process", "", "| path | RL seconds | chain seconds |", "|---|---|---|"]
    lines += [f"| {r['path']} | {r['rl_seconds']:.2f} | {r['chain_seconds']:.2f} |" for r in rec["stream_cost"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs")
    args = ap.parse_args(argv)
    sizes = ({"rl_rows": 8, "rl_steps": 30, "chain_rows": 8, "chain_n": 40, "kill_rows": 8, "kill_n": 60,
              "kill_work": 2, "shards_overhead": 8} if args.quick else
             {"rl_rows": 64, "rl_steps": 300, "chain_rows": 64, "chain_n": 2000, "kill_rows": 32, "kill_n": 1500,
              "kill_work": 2, "shards_overhead": 64})
    rec = {"sizes": sizes, "machine": machine()}
    rec["throughput"] = throughput(sizes)
    rec["overhead"] = overhead(sizes["shards_overhead"])
    rec["recovery"] = recovery(sizes)
    rec["stream_cost"] = stream_cost(sizes)
    rec["machine"] = {**machine(), **{"load_average_at_start": rec["machine"]["load_average_at_start"]}}
    stem = "distributed_quick" if args.quick else "distributed"
    write(stem, rec, markdown(rec))
    print(markdown(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
