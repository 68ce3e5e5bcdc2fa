"""`speculate demo rl`: speculative rollouts of CartPole-v1 with an expensive policy, on CPU.

A short version of benchmarks/rl/bench_rollouts.py. In a source checkout where the benchmark's
10.5M-parameter policy has been trained (benchmarks/rl/cache/), it rolls that one out; otherwise it
builds a pair of the same architectures from scratch in about 20 s (shorter training than the
benchmark's): a linear controller found by random search, a stochastic teacher behaviour-cloned
into a 10.5M-parameter MLP (the expensive policy), and a 4.6k-parameter draft distilled from it.
Then it times plain and speculative episodes (alternating, same seeds) and prints steps/s, alpha,
tokens per call and the theoretical speedup.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / "benchmarks" / "rl" / "cache"


def _pair(use_cache: bool, quick: bool):
    import gymnasium as gym
    import torch

    from .cartpole import SoftLinearPolicy, behaviour_clone, cartpole_mlp, search_linear_controller
    from .distill import distill_policy

    big_file, draft_file = CACHE / "cartpole_big.pt", CACHE / "cartpole_draft.pt"
    if use_cache and big_file.exists() and draft_file.exists():
        big, draft = cartpole_mlp("big"), cartpole_mlp("draft")
        big.load_state_dict(torch.load(big_file, weights_only=True))
        draft.load_state_dict(torch.load(draft_file, weights_only=True))
        print(f"using the benchmark's trained policies from {CACHE}")
        return big.eval(), draft.eval()
    t = time.perf_counter()
    torch.manual_seed(0)
    w, log = search_linear_controller(rng=0)
    print(f"random search: a linear controller with return {log[-1]['return']:.0f} after "
          f"{log[-1]['episodes']} episodes")
    teacher = SoftLinearPolicy(w, 0.01)
    big = cartpole_mlp("big")  # the benchmark's architecture, trained for less long
    behaviour_clone(teacher, big, episodes=10, steps=40 if quick else 100, lr=1e-3, rng=0)
    draft = cartpole_mlp("draft")
    rep = distill_policy(big, draft, lambda: gym.make("CartPole-v1"), episodes=6, steps=600 if quick else 1500,
                         lr=3e-3, rng=0)
    n = sum(p.numel() for p in big.parameters())
    print(f"expensive policy: MLP with {n / 1e6:.1f}M parameters, behaviour-cloned from sigmoid(w.s/0.01); "
          f"draft: {sum(p.numel() for p in draft.parameters()):,} parameters, distilled "
          f"(acceptance {rep.acceptance_before:.3f} -> {rep.acceptance_after:.3f}); {time.perf_counter() - t:.0f} s")
    return big, draft


def demo(argv: list[str] | None = None) -> int:
    """Run the RL demo; returns 0."""
    ap = argparse.ArgumentParser(prog="speculate demo rl", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer training steps and episodes")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per configuration (default 2, quick 1)")
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--verify", choices=("block", "token"), default="block")
    ap.add_argument("--no-cache", action="store_true", help="train a small pair even if the benchmark's exists")
    args = ap.parse_args(argv)

    import gymnasium as gym
    import torch

    from speculate import theory

    from .api import rollouts, speculative_rollouts

    threads = torch.get_num_threads()
    try:
        print("speculate demo rl: exact speculative rollouts of CartPole-v1 (one CPU thread)")
        big, draft = _pair(not args.no_cache, args.quick)  # trains with every thread
        torch.set_num_threads(1)  # times with one
        episodes = args.episodes or (1 if args.quick else 2)
        times = {"plain": 0.0, "spec": 0.0}
        steps = {"plain": 0, "spec": 0}
        stats = []
        for ep in range(episodes):
            envs = [gym.make("CartPole-v1")]
            t = time.perf_counter()
            steps["plain"] += rollouts(envs, big, max_steps=500, rng=ep).steps
            times["plain"] += time.perf_counter() - t
            t = time.perf_counter()
            out = speculative_rollouts(envs, big, draft, max_steps=500, lookahead=args.lookahead,
                                       verify=args.verify, rng=ep)
            times["spec"] += time.perf_counter() - t
            steps["spec"] += out.steps
            stats.append(out.stats)
        plain_sps = steps["plain"] / times["plain"]
        spec_sps = steps["spec"] / times["spec"]
        acc = sum(s.accepted for s in stats)
        rej = sum(s.rejections for s in stats)
        alpha = acc / max(1, acc + rej)
        rows = sum(s.row_rounds for s in stats)
        c = (sum(s.draft_time for s in stats) / sum(s.draft_calls for s in stats)) * plain_sps
        th = theory.speedup(min(alpha, 1.0), args.lookahead, c)
        print(f"plain rollouts:       {plain_sps:8.1f} steps/s  ({steps['plain']} steps)")
        print(f"speculative ({args.verify}, k={args.lookahead}): {spec_sps:8.1f} steps/s  ({steps['spec']} steps)")
        print(f"speedup {spec_sps / plain_sps:.2f}x   alpha {alpha:.3f}   tokens per target call "
              f"{(acc + rows) / rows:.2f}   c {c:.4f}   theory {th:.2f}x (assumes scoring k+1 states costs "
              "one plain step; on one CPU thread it costs more, see benchmarks/results/rl_rollouts.md)")
        print("The trajectories are distributed exactly as plain rollouts of the expensive policy "
              "(tests/rl: chi-square against exact laws on slippery FrozenLake).")
    finally:
        torch.set_num_threads(threads)
    return 0
