"""Bad input gets a clear exception naming the problem, before any sample is produced."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from speculate.domains.rl import SnapshotError, TabularPolicy, rollouts, speculative_rollout, speculative_rollouts
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


# ----------------------------------------------------------------------------------------------
# regression tests for what the fuzz tests (test_rl_fuzz.py) found


class CountingEnv(gym.Env):
    """FrozenLake-sized toy env that counts its resets and steps in a class attribute."""

    observation_space = gym.spaces.Discrete(16)
    action_space = gym.spaces.Discrete(4)
    calls: ClassVar[list] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        CountingEnv.calls.append("reset")
        self.s = 0
        return 0, {}

    def step(self, a):
        CountingEnv.calls.append("step")
        assert self.action_space.contains(a), f"action {a!r} outside the space"
        self.s = (self.s + int(a) + int(self.np_random.integers(2))) % 16
        return self.s, 0.0, False, False, {}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lookahead": np.array([2, 3])}, TypeError, "lookahead must be a non-negative int or 'auto'"),
        ({"lookahead": None}, TypeError, "lookahead"),
        ({"lookahead": "fast"}, ValueError, "lookahead"),
        ({"max_lookahead": 2.5}, TypeError, "max_lookahead must be an int"),
        ({"max_lookahead": "8"}, TypeError, "max_lookahead"),
        ({"max_lookahead": 0}, ValueError, "max_lookahead must be >= 1"),
        ({"cost_ratio": "0.1"}, TypeError, "cost_ratio must be a number"),
        ({"cost_ratio": True}, TypeError, "cost_ratio"),
        ({"cost_ratio": float("nan")}, ValueError, "cost_ratio must be finite"),
        ({"verify": None}, TypeError, "verify must be"),
        ({"max_steps": 2**70}, ValueError, "max_steps must be at most"),
    ],
)
def test_bad_arguments_raise_before_any_reset(kwargs, error, match) -> None:
    """Fuzz finding: these were accepted (max_lookahead=2.5, cost_ratio=True), raised an unclear error
    (an array lookahead: "truth value ... ambiguous"; cost_ratio="0.1": "'<=' not supported"), or
    raised only after every environment had been reset."""
    CountingEnv.calls.clear()
    with pytest.raises(error, match=match):
        speculative_rollouts([CountingEnv(), CountingEnv()], UNIFORM, UNIFORM, **kwargs)
    assert CountingEnv.calls == []


def unnormalised(obs):
    import speculate

    return speculate.Categorical(probs=np.full((len(obs), 4), 0.4), validate=False)


def negative(obs):
    import speculate

    return speculate.Categorical(probs=np.tile([-0.2, 0.6, 0.3, 0.3], (len(obs), 1)), validate=False)


def complex_logits(obs):
    return np.zeros((len(obs), 4), dtype=complex) + 1j


def string_logits(obs):
    return np.zeros((len(obs), 4)).astype(str)


@pytest.mark.parametrize(
    ("policy", "error", "match"),
    [
        (unnormalised, ValueError, r"unnormalised returned invalid action probabilities: .*sum to 1.6"),
        (negative, ValueError, r"negative returned invalid action probabilities: .*negative"),
        (complex_logits, TypeError, r"complex_logits returned ndarray logits of dtype complex128"),
        (string_logits, TypeError, r"string_logits returned ndarray logits of dtype <U"),
    ],
)
@pytest.mark.parametrize("role", ["policy", "draft"])
def test_probabilities_are_checked_not_trusted(policy, error, match, role) -> None:
    """Fuzz finding: a Categorical built with validate=False went to the verifier unchecked (negative
    or unnormalised probabilities gave wrong samples silently); complex logits lost their imaginary
    part silently; string logits raised an error that did not name the policy."""
    args = (policy, UNIFORM) if role == "policy" else (UNIFORM, policy)
    with pytest.raises(error, match=match):
        speculative_rollout(frozen(), *args, max_steps=5, lookahead=2)


def test_nested_list_logits_are_logits() -> None:
    out = speculative_rollout(frozen(), lambda o: [[0.0, 1.0, 0.0, 0.0]] * len(o), UNIFORM, max_steps=4, rng=0)
    assert len(out) >= 1


def _box_env(dtype):
    class BoxEnv(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2), {}

        def step(self, a):
            assert np.all(np.isfinite(a)), f"env received a non-finite action {a}"
            return np.clip(self.np_random.normal(size=2), -1, 1), 0.0, False, False, {}

    return BoxEnv()


def test_actions_that_overflow_the_action_dtype_are_refused() -> None:
    """Fuzz finding: a mean of 1e39 for a float32 action space gave inf actions to the environment."""
    huge = lambda o: (np.full((len(o), 1), 1e39), np.full((len(o), 1), 1e30))  # noqa: E731
    fine = lambda o: (np.zeros((len(o), 1)), np.ones((len(o), 1)))  # noqa: E731
    with pytest.raises(ValueError, match=r"policy \S*<lambda> of environment 0: a sampled action .* float32"):
        speculative_rollout(_box_env(np.float32), huge, fine, max_steps=3, lookahead=0)
    with pytest.raises(ValueError, match=r"draft policy \S*<lambda> of environment 0: .*overflows to inf"):
        speculative_rollout(_box_env(np.float32), fine, huge, max_steps=3, lookahead=2)
    with pytest.raises(ValueError, match=r"policy \S*<lambda> of environment 0: a sampled action"):
        rollouts(_box_env(np.float32), huge, max_steps=3)
    assert len(speculative_rollout(_box_env(np.float64), huge, huge, max_steps=3)) == 3  # float64 holds 1e39


def test_std_below_float64_resolution_is_refused() -> None:
    """Fuzz finding: a std far below the float64 spacing at the mean (std 0.5 at a mean of 1e30) made
    every sample round to the mean, and verification with unequal stds then searched for a residual
    in vain (ResidualSamplingError after 100,000 tries, about a second per call)."""
    coarse = lambda o: (np.full((len(o), 1), 1e30), np.full((len(o), 1), 0.5))  # noqa: E731
    with pytest.raises(ValueError, match=r"std of 0.5 at a mean of 1e\+30 .*float64 steps"):
        speculative_rollout(_box_env(np.float64), coarse, coarse, max_steps=3)


def test_discrete_actions_with_a_start() -> None:
    """Fuzz finding: Discrete(n, start=s) received actions 0..n-1 instead of s..s+n-1. The policy
    scores the n actions in order; the environment gets start + index, and so do the episodes."""

    class Shifted(CountingEnv):
        action_space = gym.spaces.Discrete(4, start=-2)

        def step(self, a):
            assert self.action_space.contains(a), f"action {a!r} outside the space"
            self.s = (self.s + int(a) + 2 + int(self.np_random.integers(2))) % 16
            return self.s, 0.0, False, False, {}
    pi = TabularPolicy(np.random.default_rng(0).dirichlet(np.ones(4), size=16))
    spec = speculative_rollouts([Shifted() for _ in range(3)], pi, UNIFORM, max_steps=20, lookahead=3, rng=1)
    assert all(np.all((t.actions >= -2) & (t.actions <= 1)) for t in spec)
    greedy = speculative_rollouts([Shifted() for _ in range(3)], pi, UNIFORM, max_steps=20, verify="greedy", rng=1)
    assert all(np.all(t.actions == pi.probs[t.observations[:-1]].argmax(axis=1) - 2) for t in greedy)
    assert all(np.all((t.actions >= -2) & (t.actions <= 1)) for t in rollouts([Shifted()], pi, max_steps=20))
