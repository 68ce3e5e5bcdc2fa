"""`speculate demo engine`: the engine on slow toy pipelines, measured next to theory.

1. One-step speculation, Y ~ f(X); Z = g(Y): f and g each sleep (a slow model and a slow
   consumer); f_star is a cheap approximation. g runs on the guess while f runs.
2. A chain: a Markov process whose target costs a fixed time per call (any batch size, like a
   memory-bound model) and whose draft is cheap; k drafts are verified per target call.
"""

from __future__ import annotations

import time

import numpy as np

from . import theory
from .chain import batched, chain
from .distributions import Categorical
from .engine import speculate

WEATHER = ["sun", "cloud", "rain", "storm"]
P_NEXT = np.array(
    [[0.70, 0.20, 0.08, 0.02], [0.30, 0.40, 0.25, 0.05], [0.15, 0.35, 0.40, 0.10], [0.10, 0.30, 0.40, 0.20]]
)
Q_NEXT = np.array(
    [[0.65, 0.25, 0.08, 0.02], [0.30, 0.45, 0.20, 0.05], [0.20, 0.30, 0.40, 0.10], [0.10, 0.30, 0.45, 0.15]]
)


def _engine_part(runs: int, t_f: float, t_g: float) -> dict:
    def f(today):  # the slow, exact forecast
        time.sleep(t_f)
        return Categorical(probs=P_NEXT[today])

    def f_star(today):  # a cheap approximation
        return Categorical(probs=Q_NEXT[today])

    def g(tomorrow):  # the slow consumer of the forecast
        time.sleep(t_g)
        return f"plan for {WEATHER[tomorrow]}"

    rng = np.random.default_rng(0)
    speculate(lambda x: f_star(x), f_star, lambda y: y, 0, rng=rng)  # warm up: load the compiled kernels
    t0 = time.perf_counter()
    for i in range(runs):
        y = f(i % 4).sample(rng)
        g(y)
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = [speculate(f, f_star, g, i % 4, rng=rng) for i in range(runs)]
    t_spec = time.perf_counter() - t0
    alpha = float(np.mean([theory.acceptance_rate(P_NEXT[i % 4], Q_NEXT[i % 4]) for i in range(runs)]))
    return {
        "accepted": float(np.mean([r.accepted for r in res])),
        "alpha": alpha,
        "speedup": t_seq / t_spec,
        "theory": theory.engine_speedup(alpha, t_f, t_g),
    }


def _chain_part(n: int, k: int, t_target: float) -> dict:
    def target(states):  # one call scores any number of states, like a batched model
        time.sleep(t_target)
        return Categorical(probs=P_NEXT[np.asarray(states)], validate=False)

    @batched
    def draft(states):
        return Categorical(probs=Q_NEXT[np.asarray(states)], validate=False)

    def step(state, outcome):
        return int(outcome)

    rng = np.random.default_rng(1)
    chain(lambda states: draft(states), draft, step, 0, 3, lookahead=2, rng=rng)  # warm up the kernels
    t0 = time.perf_counter()
    s = 0
    for _ in range(n):
        s = int(target([s]).sample(rng)[0])
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    traj = chain(target, draft, step, 0, n, lookahead=k, rng=rng)
    t_spec = time.perf_counter() - t0
    st = traj.stats
    return {
        "alpha": st.alpha,
        "tokens_per_call": st.tokens_per_call,
        "expected_tokens": theory.expected_tokens(st.alpha, k),
        "c": st.cost_ratio,
        "speedup": t_plain / t_spec,
        "theory": theory.speedup(st.alpha, k, st.cost_ratio),
        "histogram": st.accepted_per_position.tolist(),
    }


def demo(argv: list[str] | None = None) -> int:
    quick = bool(argv and "--quick" in argv)
    print("speculate demo engine: exact speculative sampling on slow toy pipelines\n")
    e = _engine_part(runs=10 if quick else 30, t_f=0.03, t_g=0.03)
    print("1) One step: tomorrow ~ forecast(today) [30 ms]; plan = g(tomorrow) [30 ms]")
    print(f"   guess kept        {e['accepted']:.2f}   (theory: sum min(p, q) = {e['alpha']:.2f})")
    print(f"   wall-time speedup {e['speedup']:.2f}x  (theory: {e['theory']:.2f}x)\n")
    k = 4
    c = _chain_part(n=100 if quick else 300, k=k, t_target=0.005)
    print(f"2) A chain of {100 if quick else 300} steps; target call 5 ms (any batch); cheap draft; k = {k}")
    print(
        f"   alpha {c['alpha']:.3f}; outcomes per target call {c['tokens_per_call']:.2f} "
        f"(theory {c['expected_tokens']:.2f})"
    )
    print(f"   accepted-length histogram {c['histogram']}")
    print(f"   wall-time speedup {c['speedup']:.2f}x  (theory at measured c = {c['c']:.3f}: {c['theory']:.2f}x)")
    print("\nThe samples are distributed exactly as the slow pipeline's (proofs/01, proofs/05).")
    return 0
