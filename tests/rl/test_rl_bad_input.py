"""Bad input gets a clear exception naming the problem, before any sample is produced."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from speculate.domains.rl import SnapshotError, TabularPolicy, speculative_rollout, speculative_rollouts
from speculate.domains.rl.models import GaussianMLPPolicy, MLPPolicy

UNIFORM = TabularPolicy(np.full((16, 4), 0.25))


def frozen():
    return gym.make("FrozenLake-v1")


def too_few(obs):
    """Returns one distribution fewer than asked."""
    return np.zeros((len(obs) - 1, 4)) if len(obs) > 1 else np.zeros((2, 4))


def normal_for_discrete(obs):
    return np.zeros((len(obs), 4)), np.ones((len(obs), 4))


def wrong_actions(obs):
    return np.zeros((len(obs), 3))


def nan_logits(obs):
    return np.full((len(obs), 4), np.nan)


@pytest.mark.parametrize(
    ("policy", "error", "match"),
    [
        (too_few, ValueError, r"too_few returned distributions of batch shape .* one per observation"),
        (normal_for_discrete, TypeError, r"normal_for_discrete returned a tuple .*needs a Categorical"),
        (wrong_actions, ValueError, r"gives 3 action probabilities; the space has 4"),
        (nan_logits, ValueError, r"NaN"),
    ],
)
@pytest.mark.parametrize("role", ["policy", "draft"])
def test_bad_policy_output(policy, error, match, role) -> None:
    args = (policy, UNIFORM) if role == "policy" else (UNIFORM, policy)
    with pytest.raises(error, match=match):
        speculative_rollout(frozen(), *args, max_steps=5, lookahead=2)


def categorical_for_box(obs):
    return np.zeros((len(obs), 2))


def test_bad_policy_output_for_box_actions() -> None:
    good = GaussianMLPPolicy(3, 1, hidden=(8,), std=0.5).eval()
    with pytest.raises(TypeError, match=r"Box action space needs a speculate.Normal"):
        speculative_rollout(gym.make("Pendulum-v1"), categorical_for_box, good, max_steps=3)
    with pytest.raises(ValueError, match=r"actions of shape \(2,\); the space has \(1,\)"):
        speculative_rollout(gym.make("Pendulum-v1"), GaussianMLPPolicy(3, 2, std=0.5).eval(), good, max_steps=3)
    with pytest.raises(ValueError, match=r"std that is not > 0"):
        speculative_rollout(gym.make("Pendulum-v1"), lambda o: (np.zeros((len(o), 1)), np.zeros((len(o), 1))),
                            good, max_steps=3)
    with pytest.raises(ValueError, match=r"verify='block' needs Discrete actions"):
        speculative_rollout(gym.make("Pendulum-v1"), good, good, max_steps=3, verify="block")


def test_env_that_cannot_be_snapshotted() -> None:
    class Opaque(gym.Env):
        observation_space = gym.spaces.Discrete(16)
        action_space = gym.spaces.Discrete(4)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.handle = open(__file__)  # an OS resource: not plain data
            return 0, {}

        def step(self, a):
            return 0, 0.0, False, False, {}

    env = Opaque()
    env.reset(seed=0)
    with pytest.raises(SnapshotError, match=r"Opaque.*handle.*register_snapshot"):
        speculative_rollout(env, UNIFORM, UNIFORM, max_steps=3)
    env.handle.close()


def test_unsupported_vector_envs_and_inputs() -> None:
    vec = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
    pol = MLPPolicy(4, 2).eval()
    with pytest.raises(SnapshotError, match=r"CartPoleVectorEnv.*SyncVectorEnv"):
        speculative_rollouts(vec, pol, pol)
    with pytest.raises(TypeError, match="gymnasium Env"):
        speculative_rollouts("CartPole-v1", pol, pol)
    env = frozen()
    with pytest.raises(ValueError, match="appears twice"):
        speculative_rollouts([env, env], UNIFORM, UNIFORM)
    with pytest.raises(ValueError, match="sequence of 2"):
        speculative_rollouts([frozen, frozen], [UNIFORM] * 3, UNIFORM)
    with pytest.raises(ValueError, match="different spaces"):
        speculative_rollouts([frozen, lambda: gym.make("FrozenLake8x8-v1")], UNIFORM, UNIFORM)
    with pytest.raises(ValueError, match="max_steps"):
        speculative_rollout(frozen(), UNIFORM, UNIFORM, max_steps=-1)
    with pytest.raises(ValueError, match="rng"):
        speculative_rollout(frozen(), UNIFORM, UNIFORM, rng=-3)
    with pytest.raises(TypeError, match="rng"):
        speculative_rollout(frozen(), UNIFORM, UNIFORM, rng="0")
    with pytest.raises(ValueError, match="verify"):
        speculative_rollout(frozen(), UNIFORM, UNIFORM, verify="typical")
    with pytest.raises(TypeError, match="Discrete and Box"):
        speculative_rollouts([lambda: gym.wrappers.TimeLimit(_MultiDiscreteEnv(), 5)], UNIFORM, UNIFORM)


class _MultiDiscreteEnv(gym.Env):
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.MultiDiscrete([2, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, a):
        return 0, 0.0, False, False, {}


def test_module_in_training_mode_with_dropout_is_refused() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    with pytest.raises(ValueError, match=r"Dropout in training mode.*\.eval\(\)"):
        speculative_rollout(gym.make("CartPole-v1"), net, MLPPolicy(4, 2).eval(), max_steps=3)
    net.eval()
    assert len(speculative_rollout(gym.make("CartPole-v1"), net, MLPPolicy(4, 2).eval(), max_steps=3)) == 3
