"""Wall-clock steps/s of plain vs speculative rollouts of CartPole-v1 with a 10.5M-parameter policy.

Plain rollouts call the expensive policy once per step. Speculative rollouts draft k steps with a
4.6k-parameter draft on a snapshot of the env, score the k+1 states in one call of the expensive
policy, keep a prefix (block or token verification) and restore the env. Everything runs on one CPU
thread. Plain and speculative episodes alternate, seed by seed, so that machine noise hits both
alike; every number below comes from this one run.

Reported per configuration: steps/s and the speedup over plain; alpha (accepted / (accepted +
rejections)) and tokens per target call; c = time per draft step (draft policy + env step +
snapshot) / time per plain step; the theoretical speedup of Leviathan et al.
``speculate.theory.speedup(alpha, k, c) = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``, which assumes
that scoring k+1 states costs one plain step; and b = time per speculative round outside the draft
(the batched target call, verification, restore and the committed step) / time per plain step,
with the refined prediction (1 - alpha^(k+1)) / ((1 - alpha)(k c + b)).

    .venv/bin/python benchmarks/rl/bench_rollouts.py            # ~3 minutes; trains the pair first if needed
    .venv/bin/python benchmarks/rl/bench_rollouts.py --quick    # fewer episodes
    .venv/bin/python benchmarks/rl/bench_rollouts.py --device cuda   # expensive policy on a GPU
                                                                  # (writes rl_rollouts_cuda.*)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from speculate.domains.rl import rollouts, speculative_rollouts

from speculate import theory

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: report.py
sys.path.insert(0, str(HERE))
import train_cartpole  # noqa: E402
from report import describe, machine, write  # noqa: E402

CONFIGS = [("block", 4), ("block", 8), ("block", 16), ("token", 8), ("block", "auto")]


def make_env() -> gym.Env:
    return gym.make("CartPole-v1")


def batch_cost(policy, ks: list[int], repeats: int = 20) -> dict:
    """Median time of one policy call on 1 and on k+1 CartPole observations (interleaved), the
    result copied back to the CPU as the rollouts do."""
    rng = np.random.default_rng(0)
    sizes = [1] + [k + 1 for k in ks]
    times: dict[int, list[float]] = {s: [] for s in sizes}
    device = next(policy.parameters()).device
    with torch.inference_mode():
        for _ in range(repeats):
            for s in sizes:
                x = torch.as_tensor(rng.normal(size=(s, 4)) * 0.1, dtype=torch.float32)
                t = time.perf_counter()
                policy(x.to(device)).cpu()
                times[s].append(time.perf_counter() - t)
    med = {s: float(np.median(v)) for s, v in times.items()}
    return {"seconds_batch1": med[1], **{f"ratio_batch{s}": med[s] / med[1] for s in sizes[1:]}}


def run(episodes: int, n_envs: int, big, draft) -> dict:
    names = ["plain"] + [f"{v} k={k}" for v, k in CONFIGS]
    tot = {n: {"seconds": 0.0, "steps": 0} for n in names}
    stats: dict[str, list] = {n: [] for n in names[1:]}
    for ep in range(episodes):
        seed = 1000 + ep
        envs = [make_env() for _ in range(n_envs)]
        t = time.perf_counter()
        out = rollouts(envs, big, max_steps=500, rng=seed)
        tot["plain"]["seconds"] += time.perf_counter() - t
        tot["plain"]["steps"] += out.steps
        for (verify, k), name in zip(CONFIGS, names[1:], strict=True):
            t = time.perf_counter()
            out = speculative_rollouts(envs, big, draft, max_steps=500, lookahead=k, verify=verify, rng=seed)
            tot[name]["seconds"] += time.perf_counter() - t
            tot[name]["steps"] += out.steps
            stats[name].append(out.stats)
        print(f"episode {ep}: " + ", ".join(f"{n} {tot[n]['steps'] / tot[n]['seconds']:.1f} steps/s" for n in names),
              flush=True)
    plain_sps = tot["plain"]["steps"] / tot["plain"]["seconds"]
    rows = [{"config": "plain", "steps": tot["plain"]["steps"], "seconds": tot["plain"]["seconds"],
             "steps_per_s": plain_sps, "speedup": 1.0}]
    for (verify, k), name in zip(CONFIGS, names[1:], strict=True):
        ss = stats[name]
        acc = sum(s.accepted for s in ss)
        rej = sum(s.rejections for s in ss)
        row_rounds = sum(s.row_rounds for s in ss)
        rounds = sum(s.rounds for s in ss)
        draft_calls = sum(s.draft_calls for s in ss)
        draft_time = sum(s.draft_time for s in ss)
        other_time = sum(s.target_time + s.verify_time + s.commit_time for s in ss)
        alpha = acc / (acc + rej)
        k_mean = draft_calls / rounds  # lookahead per round (fixed k, or the mean under "auto")
        plain_step = n_envs / plain_sps  # seconds per plain step (one call for the n_envs in lockstep)
        c = (draft_time / draft_calls) / plain_step
        b = (other_time / rounds) / plain_step
        sps = tot[name]["steps"] / tot[name]["seconds"]
        e_tok = theory.expected_tokens(alpha, round(k_mean)) if k != "auto" else (acc + row_rounds) / row_rounds
        th = theory.speedup(alpha, round(k_mean), c) if k != "auto" else e_tok / (k_mean * c + 1)
        refined = e_tok / (k_mean * c + b)
        rows.append({
            "config": name, "verify": verify, "lookahead": k, "mean_lookahead": k_mean,
            "steps": tot[name]["steps"], "seconds": tot[name]["seconds"], "steps_per_s": sps,
            "speedup": sps / plain_sps, "alpha": alpha, "acceptance_rate": acc / sum(s.proposed for s in ss),
            "tokens_per_call": (acc + row_rounds) / row_rounds, "expected_tokens": e_tok,
            "c": c, "b": b, "theory_speedup": th, "refined_speedup": refined,
            "fraction_of_theory": (sps / plain_sps) / th, "fraction_of_refined": (sps / plain_sps) / refined,
        })
    return {"n_envs": n_envs, "episodes": episodes, "rows": rows}


def markdown(rec: dict) -> str:
    lines = [
        f"# Speculative rollouts, CartPole-v1, 10.5M-parameter policy on {rec.get('device', 'cpu')}, one CPU thread",
        "",
        f"Command: `{rec['command']}`; {describe(rec['machine'])}; torch {rec['torch']}.",
        "",
        f"Policies (benchmarks/results/rl_training.md): expensive MLP {rec['big_parameters']:,} parameters, "
        f"draft MLP {rec['draft_parameters']:,} parameters. One policy call on 1 state: "
        f"{rec['batch_cost']['seconds_batch1'] * 1e3:.2f} ms; on k+1 states, relative to 1: "
        + ", ".join(f"{k.split('batch')[1]} states {v:.2f}x" for k, v in rec["batch_cost"].items()
                    if k.startswith("ratio"))
        + ".",
        "",
    ]
    for part in rec["runs"]:
        lines += [
            f"## {part['n_envs']} environment{'s' if part['n_envs'] > 1 else ''}, {part['episodes']} episodes "
            "per configuration (500 steps max)",
            "",
            "| config | steps/s | speedup | alpha | tokens/call | c | theory | measured/theory | b | refined | "
            "measured/refined |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in part["rows"]:
            if r["config"] == "plain":
                lines.append(f"| plain | {r['steps_per_s']:.1f} | 1.00 | | | | | | | | |")
                continue
            lines.append(
                f"| {r['config']} | {r['steps_per_s']:.1f} | **{r['speedup']:.2f}** | {r['alpha']:.3f} | "
                f"{r['tokens_per_call']:.2f} | {r['c']:.4f} | {r['theory_speedup']:.2f} | "
                f"{r['fraction_of_theory']:.2f} | {r['b']:.2f} | {r['refined_speedup']:.2f} | "
                f"{r['fraction_of_refined']:.2f} |"
            )
        lines.append("")
    lines += [
        "theory = speculate.theory.speedup(alpha, k, c) (k = the mean lookahead for 'auto'), which "
        "assumes that scoring k+1 states costs one plain step; b measures what a round costs besides "
        "the drafts, in plain steps (the batched call of the expensive policy, verification, restoring "
        "the env and the committed step); refined = expected tokens / (k c + b). On this CPU the "
        "expensive MLP is compute-bound for more than one state, so b > 1 and the speedup stays below "
        "the plain formula; see the batch-cost ratios above.",
        "",
    ]
    return "\n".join(lines)


def plot(rec: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    part = rec["runs"][0]
    rows = [r for r in part["rows"] if r["config"] != "plain"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(rows))
    ax.bar(x - 0.27, [r["speedup"] for r in rows], 0.27, label="measured")
    ax.bar(x, [r["refined_speedup"] for r in rows], 0.27, label="refined prediction (k c + b)")
    ax.bar(x + 0.27, [r["theory_speedup"] for r in rows], 0.27, label="theory (k c + 1)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, [r["config"] for r in rows])
    ax.set_ylabel("speedup over plain rollouts")
    ax.set_title("CartPole-v1, 10.5M-parameter policy, 1 environment, 1 CPU thread")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 episodes per configuration instead of 6")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 8], help="numbers of environments to run")
    ap.add_argument("--device", default="cpu", help="device of the expensive policy (the draft stays on the CPU)")
    ap.add_argument("--out", default=None, help="results name (default rl_rollouts, rl_rollouts_<device> off the "
                                                "CPU); a path writes there (benchmarks/gpu/check.py's steps)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        big, draft = train_cartpole.load_pair()
    except FileNotFoundError:
        print("no trained policies in benchmarks/rl/cache: training them (about 10 minutes)", flush=True)
        train_cartpole.main([])
        big, draft = train_cartpole.load_pair()
    big = big.to(args.device)
    stem = args.out or ("rl_rollouts" if args.device == "cpu" else f"rl_rollouts_{torch.device(args.device).type}")
    env = machine(args.device)
    rec = {
        "device": args.device,
        "command": env["command"],
        "machine": env,
        "torch": torch.__version__,
        "big_parameters": sum(p.numel() for p in big.parameters()),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "batch_cost": batch_cost(big, sorted({k for _, k in CONFIGS if k != "auto"})),
        "runs": [],
    }
    episodes = 2 if args.quick else 6
    for n in args.envs:
        rec["runs"].append(run(episodes if n == 1 else max(1, episodes // 2), n, big, draft))
    write(stem, rec, markdown(rec), figure=plot(rec), dpi=120)
    print(markdown(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
