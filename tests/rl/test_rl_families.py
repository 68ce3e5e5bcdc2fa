"""Speculative rollouts run on every built-in environment family (smoke + consistency), with
deterministic policies reproducing plain rollouts exactly where actions are discrete."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from speculate.domains.rl import rollouts, speculative_rollouts

DISCRETE = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "FrozenLake-v1", "Taxi-v4", "CliffWalking-v1",
            "Blackjack-v1"]
BOX = ["MountainCarContinuous-v0", "Pendulum-v1", "HalfCheetah-v5", "Hopper-v5"]


def _flat(obs) -> np.ndarray:
    """Any batched observation (array [N], [N, d], or a tuple of arrays) as float features [N, d]."""
    if isinstance(obs, tuple):
        return np.stack([np.asarray(o, np.float64) for o in obs], axis=1)
    a = np.asarray(obs, np.float64)
    return a[:, None] if a.ndim == 1 else a.reshape(len(a), -1)


class HashPolicy:
    """An arbitrary function of the observation: logits [N, A] = sin(x W); ``onehot`` puts a margin
    of 60 on the argmax (a deterministic policy up to probability e^-60)."""

    def __init__(self, n_actions: int, seed: int, onehot: bool) -> None:
        self.n, self.seed, self.onehot = n_actions, seed, onehot

    def __call__(self, obs):
        x = _flat(obs)
        z = np.sin(x @ np.random.default_rng(self.seed).normal(size=(x.shape[1], self.n)))  # [N, A]
        return 60.0 * np.eye(self.n)[z.argmax(axis=1)] if self.onehot else z


class Gaussian:
    """mean = gain * tanh(x W) [N, act_dim], a fixed std."""

    def __init__(self, act_dim: int, seed: int, std: float, gain: float = 1.0) -> None:
        self.dim, self.seed, self.std, self.gain = act_dim, seed, std, gain

    def __call__(self, obs):
        x = _flat(obs)
        w = np.random.default_rng(self.seed).normal(size=(x.shape[1], self.dim)) * 0.3
        mean = self.gain * np.tanh(x @ w)
        return mean, np.full_like(mean, self.std)


@pytest.mark.parametrize("env_id", DISCRETE)
def test_discrete_families(env_id: str) -> None:
    make = lambda: gym.make(env_id)  # noqa: E731
    n = make().action_space.n
    target = HashPolicy(n, seed=1, onehot=True)
    draft = HashPolicy(n, seed=2, onehot=False)
    envs = [make() for _ in range(3)]
    spec = speculative_rollouts(envs, target, draft, max_steps=40, lookahead=3, rng=3)
    plain = rollouts(envs, target, max_steps=40, rng=3)
    for a, b in zip(spec, plain, strict=True):
        assert len(a) == len(b) and a.terminated == b.terminated and a.truncated == b.truncated
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(np.asarray(a.rewards), np.asarray(b.rewards))


@pytest.mark.parametrize("env_id", BOX)
def test_box_families(env_id: str, tmp_path, monkeypatch) -> None:
    if "Cheetah" in env_id or "Hopper" in env_id:
        pytest.importorskip("mujoco")
        monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT to the working directory
    make = lambda: gym.make(env_id)  # noqa: E731
    dim = make().action_space.shape[0]
    out = speculative_rollouts([make() for _ in range(2)], Gaussian(dim, 1, 0.3), Gaussian(dim, 1, 0.3, gain=0.8),
                               max_steps=25, lookahead=3, rng=0)
    for t in out:
        assert t.actions.shape == (len(t), dim) and t.observations.shape[0] == len(t) + 1
        assert np.all(np.isfinite(t.observations)) and (t.terminated or t.truncated)
    assert 0 < out.stats.accepted <= out.stats.proposed
