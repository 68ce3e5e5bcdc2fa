"""Helpers shared by the RL tests: deterministic reference policies and an episode comparison."""

from __future__ import annotations

import numpy as np


class ArgmaxOf:
    """A deterministic (one-hot) policy: the argmax (first maximum) of another policy's probabilities."""

    def __init__(self, policy, n_actions: int) -> None:
        self.policy, self.n = policy, n_actions

    def __call__(self, obs):
        out = self.policy(obs)
        probs = out.probs if hasattr(out, "probs") else out
        return np.eye(self.n)[np.argmax(probs, axis=-1)] * 60.0 - 30.0  # logits [N, A]: one-hot softmax


class CartPoleLinear:
    """logits [N, 2] = (w . obs) * [-1, 1] / temperature: a good CartPole controller when w is right."""

    def __init__(self, w, temperature: float = 0.2) -> None:
        self.w, self.t = np.asarray(w, np.float64), temperature

    def __call__(self, obs):
        z = obs @ self.w / self.t
        return np.stack([-z, z], axis=1)


def same_episodes(a, b) -> None:
    """Assert two sets of episodes are identical, step by step (flags and infos included)."""
    assert len(a) == len(b)
    for ta, tb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ta.observations, tb.observations)
        np.testing.assert_array_equal(ta.actions, tb.actions)
        np.testing.assert_array_equal(ta.rewards, tb.rewards)
        assert (ta.terminated, ta.truncated) == (tb.terminated, tb.truncated)
        assert ta.infos == tb.infos
