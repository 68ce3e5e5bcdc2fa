"""Train the CartPole-v1 policy pair of the RL benchmark, offline and reproducibly (one CPU thread).

1. random search finds a linear controller w that balances the pole for 500 steps;
2. the stochastic teacher pi(right | s) = sigmoid(w . s / 0.01) is behaviour-cloned into an MLP of
   10.5M parameters (hidden 4096-2048-1024, tanh), the expensive policy;
3. a draft MLP (hidden 64-64, 4.6k parameters) is distilled from the big policy with
   ``speculate.domains.rl.distill_policy`` (acceptance reported before and after);
4. episode returns of the teacher and of the big policy (sampled actions) are measured.

The weights go to benchmarks/rl/cache/ (git-ignored: the big policy is 42 MB); the training record
to benchmarks/results/rl_training.{json,md}. About 10 minutes on one core.

    .venv/bin/python benchmarks/rl/train_cartpole.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from speculate.domains.rl import distill_policy, rollouts
from speculate.domains.rl.cartpole import (
    BIG_HIDDEN,
    DRAFT_HIDDEN,
    SoftLinearPolicy,
    behaviour_clone,
    cartpole_mlp,
    search_linear_controller,
)
from speculate.domains.rl.models import MLPPolicy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: report.py
from report import describe, machine, write  # noqa: E402

CACHE = HERE / "cache"
TEMPERATURE = 0.01
SEED = 0


def make_env() -> gym.Env:
    return gym.make("CartPole-v1")


def mean_return(policy, episodes: int, seed: int) -> tuple[float, float]:
    out = rollouts([make_env] * episodes, policy, max_steps=500, rng=seed)
    r = np.array([t.total_reward for t in out])
    return float(r.mean()), float(r.std())


def load_pair() -> tuple[MLPPolicy, MLPPolicy]:
    """The trained (big, draft) pair from the cache; raises FileNotFoundError if not trained yet."""
    big, draft = cartpole_mlp("big"), cartpole_mlp("draft")
    big.load_state_dict(torch.load(CACHE / "cartpole_big.pt", weights_only=True))
    draft.load_state_dict(torch.load(CACHE / "cartpole_draft.pt", weights_only=True))
    return big.eval(), draft.eval()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: --help
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    env = machine()
    t0 = time.time()
    w, search_log = search_linear_controller(rng=SEED)
    teacher = SoftLinearPolicy(w, TEMPERATURE)
    record: dict = {
        "command": ".venv/bin/python " + " ".join(sys.argv) if argv is None else "train_cartpole.main()",
        "linear_controller": {"w": w.tolist(), "search": search_log},
        "teacher": {"temperature": TEMPERATURE},
        "machine": env,
    }
    record["teacher"]["return_mean"], record["teacher"]["return_std"] = mean_return(teacher, 20, seed=1)
    print(f"teacher (sigmoid(w.s/{TEMPERATURE})): return {record['teacher']['return_mean']:.1f}", flush=True)

    big = cartpole_mlp("big")
    n_params = sum(p.numel() for p in big.parameters())
    t1 = time.time()
    bc_log = behaviour_clone(teacher, big, episodes=40, steps=600, lr=3e-4, rng=SEED)
    record["big"] = {"hidden": list(BIG_HIDDEN), "parameters": n_params, "bc_log": bc_log,
                     "bc_seconds": round(time.time() - t1, 1)}
    print(f"big policy: {n_params / 1e6:.1f}M parameters, final cross-entropy {bc_log[-1]['cross_entropy']:.4f}",
          flush=True)
    record["big"]["return_mean"], record["big"]["return_std"] = mean_return(big, 10, seed=2)
    print(f"big policy return {record['big']['return_mean']:.1f}", flush=True)

    draft = cartpole_mlp("draft")
    rep = distill_policy(big, draft, make_env, episodes=20, max_steps=500, steps=3000, lr=3e-3, rng=SEED)
    record["draft"] = {"hidden": list(DRAFT_HIDDEN), "parameters": sum(p.numel() for p in draft.parameters()),
                       "acceptance_before": rep.acceptance_before, "acceptance_after": rep.acceptance_after,
                       "train_states": rep.train_states, "heldout_states": rep.heldout_states,
                       "loss": rep.loss, "history": rep.history}
    print(f"draft: acceptance {rep.acceptance_before:.3f} -> {rep.acceptance_after:.3f}", flush=True)
    record["draft"]["return_mean"], record["draft"]["return_std"] = mean_return(draft, 20, seed=3)
    record["seconds"] = round(time.time() - t0, 1)

    CACHE.mkdir(exist_ok=True)
    torch.save(big.state_dict(), CACHE / "cartpole_big.pt")
    torch.save(draft.state_dict(), CACHE / "cartpole_draft.pt")
    write("rl_training", record, markdown(record))
    print(markdown(record))
    return 0


def markdown(r: dict) -> str:
    return "\n".join([
        "# RL benchmark policies: CartPole-v1 (training record)",
        "",
        f"Command: `{r['command']}` (one CPU thread, seed {SEED}; {r['seconds']} s).",
        "",
        f"Machine: {describe(r['machine'])}.",
        "",
        "| policy | how | parameters | episode return (mean ± sd) |",
        "|---|---|---|---|",
        f"| linear controller | random search, {r['linear_controller']['search'][-1]['episodes']} episodes "
        f"| 4 | {r['linear_controller']['search'][-1]['return']:.0f} (deterministic) |",
        f"| teacher | sigmoid(w . s / {r['teacher']['temperature']}) | 4 | "
        f"{r['teacher']['return_mean']:.1f} ± {r['teacher']['return_std']:.1f} (20 episodes) |",
        f"| expensive policy | behaviour cloning of the teacher, MLP {r['big']['hidden']} | "
        f"{r['big']['parameters']:,} | {r['big']['return_mean']:.1f} ± {r['big']['return_std']:.1f} (10 episodes) |",
        f"| draft | distill_policy from the expensive policy, MLP {r['draft']['hidden']} | "
        f"{r['draft']['parameters']:,} | {r['draft']['return_mean']:.1f} ± {r['draft']['return_std']:.1f} "
        "(20 episodes) |",
        "",
        f"Behaviour cloning: final cross-entropy {r['big']['bc_log'][-1]['cross_entropy']:.4f} "
        f"({r['big']['bc_log'][-1]['states']} states, {r['big']['bc_seconds']} s).",
        f"Distillation: acceptance 1 - TV on held-out states of the expensive policy "
        f"{r['draft']['acceptance_before']:.3f} before, {r['draft']['acceptance_after']:.3f} after.",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
