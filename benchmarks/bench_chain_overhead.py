"""Python overhead of chain() per round, against a plain loop that makes the same target and draft calls.

The target costs 1 ms per call (time.sleep, as a memory-bound model on an accelerator leaves the CPU
idle) whatever the number of states; the draft is a cheap table lookup. chain() runs n = 2000 steps
with k = 4; the baseline loop then makes exactly the same number of target calls (each on k + 1
states) and draft calls, with no engine logic. Overhead = chain time / baseline time - 1. Goal < 10%.

Run:  .venv/bin/python benchmarks/bench_chain_overhead.py   (writes benchmarks/results/chain_overhead.{json,md})
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from report import describe, machine, write

import speculate as sp

V, N, K, T_TARGET, REPEATS = 50, 2000, 4, 1e-3, 5
rng0 = np.random.default_rng(0)
P = rng0.dirichlet(np.ones(V) * 0.3, V)
Q = 0.85 * P + 0.15 * rng0.dirichlet(np.ones(V), V)


def target(states):
    time.sleep(T_TARGET)
    return sp.Categorical(probs=P[np.asarray(states)], validate=False)


@sp.batched
def draft(states):
    return sp.Categorical(probs=Q[np.asarray(states)], validate=False)


def step(state, x):
    return int(x)


def main() -> None:
    sp.chain(target, draft, step, 0, 20, lookahead=K, rng=1)  # warm up the kernels
    rng = np.random.default_rng(3)
    t_chain = t_base = t_plain = float("inf")
    for rep in range(REPEATS):  # interleaved, best of REPEATS: robust to a noisy machine
        t0 = time.perf_counter()
        traj = sp.chain(target, draft, step, 0, N, lookahead=K, rng=2)
        t_chain = min(t_chain, time.perf_counter() - t0)
        st = traj.stats
        states = [0] * (K + 1)
        t0 = time.perf_counter()
        for _ in range(st.target_calls):
            target(states).sample(rng)
        for _ in range(st.draft_calls):
            draft([0]).sample(rng)
        t_base = min(t_base, time.perf_counter() - t0)
        if rep == 0:
            t0 = time.perf_counter()
            s = 0
            for _ in range(N):  # plain sequential sampling of the target, for the speedup
                s = int(target([s]).sample(rng)[0])
            t_plain = time.perf_counter() - t0
    rounds = st.rounds
    env = machine()
    res = {
        "command": env["command"],
        "n": N,
        "k": K,
        "target_cost_s": T_TARGET,
        "rounds": rounds,
        "target_calls": st.target_calls,
        "draft_calls": st.draft_calls,
        "chain_s": t_chain,
        "same_calls_loop_s": t_base,
        "overhead_fraction": t_chain / t_base - 1,
        "overhead_per_round_us": (t_chain - t_base) / rounds * 1e6,
        "plain_sequential_s": t_plain,
        "speedup_vs_plain": t_plain / t_chain,
        "tokens_per_call": st.tokens_per_call,
        "alpha": st.alpha,
        "machine": env,
    }
    pct, per_round = 100 * res["overhead_fraction"], res["overhead_per_round_us"]
    md = f"""# chain() overhead per round

Command: `{res["command"]}` on {describe(env)}.
Target 1 ms per call (any number of states), cheap table draft, V = {V}, n = {N}, k = {K}.

| | value |
|---|---|
| rounds (target calls) | {rounds} |
| draft calls | {st.draft_calls} |
| chain() wall time | {t_chain:.3f} s |
| plain loop making the same target and draft calls | {t_base:.3f} s |
| **engine overhead** (goal < 10%) | **{pct:.1f}%**, {per_round:.0f} us/round |
| plain sequential target sampling (n calls) | {t_plain:.3f} s |
| speedup of chain() over plain sampling | {res["speedup_vs_plain"]:.2f}x |
| alpha, outcomes per target call | {st.alpha:.3f}, {st.tokens_per_call:.2f} |
"""
    write("chain_overhead", res, md)
    print(md)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help, and unknown ones fail
    main()
