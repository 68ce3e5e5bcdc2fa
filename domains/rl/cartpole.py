"""A CartPole-v1 policy pair built from scratch, offline: what the benchmark and the demo roll out.

1. :func:`search_linear_controller`: random search (Mania et al. 2018, "simple random search")
   over linear controllers ``a = [w . s > 0]``; a few hundred episodes find one that balances for
   the whole 500 steps.
2. :class:`SoftLinearPolicy`: the stochastic teacher ``pi(right | s) = sigmoid(w . s / temperature)``.
3. :func:`behaviour_clone`: fits any torch policy (e.g. a 10M-parameter MLP) to the teacher's action
   distributions on states the teacher visits (cross-entropy with soft labels), so the big policy
   stays stochastic.
4. :func:`speculate.domains.rl.distill_policy` then distils a small draft from the big policy.

>>> w, log = search_linear_controller(rng=0, iterations=30)
>>> log[-1]["return"]
500.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["BIG_HIDDEN", "CARTPOLE_SCALE", "DRAFT_HIDDEN", "SoftLinearPolicy", "behaviour_clone", "cartpole_mlp",
           "search_linear_controller"]

# Typical magnitudes of CartPole's (x, x_dot, theta, theta_dot): observations are divided by them.
CARTPOLE_SCALE = (1.0, 1.0, 0.1, 1.0)
BIG_HIDDEN = (4096, 2048, 1024)  # the expensive policy of the RL benchmark and demo (10.5M parameters)
DRAFT_HIDDEN = (64, 64)  # its draft (4.6k parameters)


def cartpole_mlp(kind: str) -> Any:
    """An untrained CartPole MLP policy of the RL benchmark's and demo's architectures: ``kind`` is
    ``"big"`` (the expensive policy) or ``"draft"``."""
    from .models import MLPPolicy

    if kind not in ("big", "draft"):
        raise ValueError(f"cartpole_mlp: kind must be 'big' or 'draft', got {kind!r}")
    return MLPPolicy(4, 2, hidden=BIG_HIDDEN if kind == "big" else DRAFT_HIDDEN, obs_scale=CARTPOLE_SCALE)


def _episode_return(env: Any, w: np.ndarray, seed: int, max_steps: int = 500) -> float:
    obs, _ = env.reset(seed=seed)
    total = 0.0
    for _ in range(max_steps):
        obs, r, term, trunc, _ = env.step(int(obs @ w > 0))
        total += r
        if term or trunc:
            break
    return total


def search_linear_controller(
    rng: int | np.random.Generator | None = 0, iterations: int = 100, directions: int = 8, step: float = 0.05,
    noise: float = 0.1, episodes: int = 3,
) -> tuple[np.ndarray, list[dict]]:
    """Basic random search for a deterministic linear CartPole controller; returns (w, log).

    Each iteration perturbs ``w`` in ``directions`` random directions (both signs), scores each by
    the mean return over ``episodes`` episodes, and steps along the return-weighted directions.
    Stops early once ``w`` scores 500 (the maximum) on ``episodes`` fresh seeds. ``w`` is returned
    normalised to unit length (the controller only depends on its direction). ``rng``: an int seed
    (or a Generator or None, from which one is drawn) for the directions and the episodes' resets.
    """
    import gymnasium as gym

    from .seeding import int_seed

    seed = int_seed(rng)
    env = gym.make("CartPole-v1")
    gen = np.random.default_rng(seed)
    w = gen.normal(size=4) * 0.1
    log: list[dict] = []
    ep = 0

    def score(v: np.ndarray) -> float:
        nonlocal ep
        ep += episodes
        return float(np.mean([_episode_return(env, v, seed=10_000 * seed + ep + i) for i in range(episodes)]))

    for it in range(iterations):
        deltas = gen.normal(size=(directions, 4))
        plus = np.array([score(w + noise * d) for d in deltas])
        minus = np.array([score(w - noise * d) for d in deltas])
        sd = np.concatenate([plus, minus]).std() + 1e-8
        w = w + step / (directions * sd) * ((plus - minus)[:, None] * deltas).sum(axis=0)
        current = score(w)
        log.append({"iteration": it, "return": current, "episodes": ep})
        if current >= 500.0:
            break
    env.close()
    return w / np.linalg.norm(w), log


class SoftLinearPolicy:
    """Stochastic teacher: logits [N, 2] = (w . s / temperature) * [-1/2, 1/2] for CartPole observations."""

    def __init__(self, w: Sequence[float], temperature: float) -> None:
        self.w = np.asarray(w, dtype=np.float64)
        self.temperature = float(temperature)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        z = np.asarray(obs, dtype=np.float64) @ self.w / self.temperature  # [N]
        return np.stack([-0.5 * z, 0.5 * z], axis=1)  # logits [N, 2]


def behaviour_clone(
    teacher: Any,
    model: Any,
    *,
    episodes: int = 40,
    steps: int = 400,
    batch_size: int = 256,
    lr: float = 3e-4,
    state_noise: float = 0.05,
    rng: int | np.random.Generator | None = 0,
    log_every: int = 50,
) -> list[dict]:
    """Fit torch ``model`` (observations -> logits) to ``teacher``'s action distributions, in place.

    Training states: ``episodes`` CartPole-v1 rollouts of the teacher (its own sampled actions),
    each state also jittered by ``state_noise`` times the CartPole scale (to cover the neighbourhood
    of the teacher's trajectories). Loss: cross-entropy of the model's softmax against the teacher's
    probabilities. Returns a log of (step, loss). The model is left in eval mode. ``rng``: an int
    seed (or a Generator or None, from which one is drawn) for the rollouts, the jitter and torch's
    batch sampling.
    """
    import gymnasium as gym
    import torch

    from .api import rollouts
    from .policies import action_distributions
    from .seeding import int_seed

    seed = int_seed(rng)
    space = gym.make("CartPole-v1").action_space
    runs = rollouts([lambda: gym.make("CartPole-v1")] * episodes, teacher, max_steps=500, rng=seed)
    states = np.concatenate([t.observations[: len(t)] for t in runs]).astype(np.float32)  # [M, 4]
    noise = np.random.default_rng(seed).standard_normal(states.shape)
    jitter = states + state_noise * np.asarray(CARTPOLE_SCALE, np.float32) * noise
    x_np = np.concatenate([states, jitter.astype(np.float32)])  # [2M, 4]
    probs = action_distributions(teacher, x_np, space).probs  # [2M, 2]
    x = torch.as_tensor(x_np)
    p = torch.as_tensor(probs, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    log = []
    for it in range(steps):
        idx = torch.randint(0, len(x), (batch_size,), generator=gen)
        logq = torch.log_softmax(model(x[idx]), dim=-1)  # [B, 2]
        loss = -(p[idx] * logq).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % log_every == 0 or it == steps - 1:
            log.append({"step": it, "cross_entropy": loss.item(), "states": len(x)})
    model.eval()
    return log
