"""Greedy verification (``verify="greedy"``, Discrete actions): the episodes are those of the policy's
argmax action, and the draft proposes its own argmax (first maximum), never a sample.

Exact checks, no statistics: greedy episodes are a deterministic function of the environments' seeds,
so they must equal plain rollouts of the argmax policy bit for bit, whatever the draft; and a draft
whose argmax agrees with the policy's (the same policy, or the same policy sharpened or flattened)
is never rejected. Before the fix the draft sampled its action, so a draft equal to the policy was
kept only about a third of the time (alpha 0.336).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rl_helpers import ArgmaxOf, CartPoleLinear, same_episodes
from speculate.domains.rl import TabularPolicy, rollouts, speculative_rollouts


def _slippery(n: int, map_name: str = "4x4"):
    return [gym.make("FrozenLake-v1", map_name=map_name, is_slippery=True) for _ in range(n)]


@pytest.mark.parametrize("lookahead", [1, 4, 9])
def test_draft_equal_to_the_policy_is_always_kept(lookahead: int) -> None:
    rng = np.random.default_rng(0)
    pi = TabularPolicy(rng.dirichlet(np.ones(4), size=64))  # stochastic: a sampled draft would disagree often
    out = speculative_rollouts(_slippery(12, "8x8"), pi, pi, max_steps=60, lookahead=lookahead,
                               verify="greedy", rng=1)
    s = out.stats
    assert s.rejections == 0 and s.acceptance_rate == 1.0 and s.proposed > 0
    assert s.routes == {"greedy": s.rounds}


def test_draft_with_the_same_argmax_is_always_kept() -> None:
    """Sharpened or flattened copies of the policy (temperature) share its argmax: all kept."""
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(4), size=16)
    for temperature in (0.3, 3.0):
        Q = P ** (1 / temperature)
        Q /= Q.sum(axis=1, keepdims=True)
        out = speculative_rollouts(_slippery(10), TabularPolicy(P), TabularPolicy(Q), max_steps=40, lookahead=5,
                                   verify="greedy", rng=2)
        assert out.stats.rejections == 0 and out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("draft_kind", ["equal", "same argmax", "unrelated"])
def test_greedy_episodes_are_plain_argmax_rollouts(draft_kind: str) -> None:
    """Slippery FrozenLake (the environment is random): speculative greedy episodes equal plain
    rollouts of the argmax policy, whatever the draft proposes."""
    rng = np.random.default_rng(2)
    P = rng.dirichlet(np.ones(4), size=16)
    draft = {"equal": P, "same argmax": 0.5 * P + 0.5 * np.eye(4)[P.argmax(axis=1)],
             "unrelated": rng.dirichlet(np.ones(4), size=16)}[draft_kind]
    envs = _slippery(30)
    spec = speculative_rollouts(envs, TabularPolicy(P), TabularPolicy(draft), max_steps=30, lookahead=3,
                                verify="greedy", rng=5)
    same_episodes(spec, rollouts(envs, ArgmaxOf(TabularPolicy(P), 4), max_steps=30, rng=5))
    assert (spec.stats.rejections > 0) == (draft_kind == "unrelated")
    assert any(t.terminated for t in spec) and any(len(t) > 3 for t in spec)


def test_greedy_cartpole_with_a_stochastic_logits_policy() -> None:
    """A soft CartPole controller (logits): greedy episodes are those of its argmax, with TimeLimit
    truncation inside drafted blocks; a draft at another temperature has the same argmax."""
    target = CartPoleLinear([0.0, 0.0, 1.0, 0.3], temperature=2.0)
    draft = CartPoleLinear([0.0, 0.0, 1.0, 0.3], temperature=0.5)
    envs = [gym.make("CartPole-v1", max_episode_steps=37) for _ in range(6)]
    spec = speculative_rollouts(envs, target, draft, max_steps=100, lookahead=8, verify="greedy", rng=3)
    same_episodes(spec, rollouts(envs, ArgmaxOf(target, 2), max_steps=100, rng=3))
    assert spec.stats.rejections == 0 and all(t.truncated and len(t) == 37 for t in spec)


def test_ties_take_the_first_maximum() -> None:
    """A uniform policy ties everywhere: the argmax is action 0 for the policy and for the draft."""
    uniform = TabularPolicy(np.full((16, 4), 0.25))
    out = speculative_rollouts(_slippery(5), uniform, uniform, max_steps=20, lookahead=4, verify="greedy", rng=0)
    assert all(np.all(t.actions == 0) for t in out) and out.stats.rejections == 0
