"""Exact laws of short trajectories of tabular environments, for testing samplers against them.

For a toy-text environment with a transition table ``env.unwrapped.P`` (FrozenLake, Taxi,
CliffWalking) and a tabular policy, the law of the first ``steps`` steps of an episode,
``(o_0, a_1, o_1, ..., a_t, o_t)`` with ``t = steps`` or the step at which the episode terminated,
is a finite sum over paths; :func:`trajectory_law` computes it (in floating point, from the
environment's own probabilities).

>>> import gymnasium as gym, numpy as np
>>> from speculate.domains.rl.trajectory_law import trajectory_law, trajectory_key
>>> env = gym.make("FrozenLake-v1", is_slippery=True)
>>> law = trajectory_law(env, np.full((16, 4), 0.25), steps=2)
>>> round(float(sum(law.values())), 12)
1.0
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["trajectory_key", "trajectory_law"]


def trajectory_law(env: Any, policy_probs: Any, steps: int) -> dict[tuple, float]:
    """P(o_0, a_1, o_1, ..., a_t, o_t) under ``policy_probs[s, a]`` and ``env.unwrapped.P``."""
    u = env.unwrapped
    if not hasattr(u, "P") or not hasattr(u, "initial_state_distrib"):
        raise TypeError(f"{type(u).__name__} has no transition table P: trajectory_law needs a toy-text env")
    pi = np.asarray(policy_probs, dtype=np.float64)
    law: dict[tuple, float] = {}

    def walk(path: tuple, s: int, prob: float, t: int, ended: bool) -> None:
        if ended or t == steps:
            law[path] = law.get(path, 0.0) + float(prob)
            return
        for a in range(pi.shape[1]):
            pa = pi[s, a]
            if pa == 0.0:
                continue
            for p, s2, _r, term in u.P[s][a]:
                if p > 0.0:
                    walk((*path, a, int(s2)), int(s2), prob * pa * p, t + 1, bool(term))

    for s0 in np.flatnonzero(u.initial_state_distrib):
        walk((int(s0),), int(s0), float(u.initial_state_distrib[s0]), 0, False)
    return law


def trajectory_key(episode: Any, steps: int) -> tuple:
    """The outcome ``(o_0, a_1, o_1, ...)`` of an episode's first ``steps`` steps, as in the law."""
    t = min(steps, len(episode.actions))
    key: list[int] = [int(episode.observations[0])]
    for i in range(t):
        key += [int(episode.actions[i]), int(episode.observations[i + 1])]
    return tuple(key)
