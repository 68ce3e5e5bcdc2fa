"""Bookkeeping of speculative rollouts, checked exactly (no statistics).

With a deterministic target policy the trajectory is a function of the environment's seed only:
restoring snapshots with their RNG makes every committed step read the environment's random stream
where a plain rollout would, so speculative rollouts must reproduce plain rollouts bit for bit, under
every rule, whatever the draft proposes. This pins down the commit logic: observations, rewards,
infos and flags in the right places, episodes that terminate or are truncated (TimeLimit, or
``max_steps``) inside a drafted block, ragged rows, restored RNGs.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rl_helpers import ArgmaxOf, CartPoleLinear, same_episodes
from speculate.domains.rl import TabularPolicy, rollout, rollouts, speculative_rollout, speculative_rollouts


@pytest.mark.parametrize("verify", ["token", "block", "greedy"])
def test_deterministic_policy_reproduces_plain_rollouts_on_slippery_frozenlake(verify: str) -> None:
    rng = np.random.default_rng(0)
    base = TabularPolicy(rng.dirichlet(np.ones(4), size=16))
    target = ArgmaxOf(base, 4)
    draft = TabularPolicy(rng.dirichlet(np.ones(4), size=16))  # disagrees often
    envs = [gym.make("FrozenLake-v1", is_slippery=True) for _ in range(40)]
    spec = speculative_rollouts(envs, target, draft, max_steps=30, lookahead=3, verify=verify, rng=5)
    plain = rollouts(envs, target, max_steps=30, rng=5)
    same_episodes(spec, plain)
    assert spec.stats.rejections > 0  # the draft was wrong sometimes: restores happened
    assert any(t.terminated for t in spec) and any(len(t) > 3 for t in spec)


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("lookahead", [1, 4, 9])
def test_episode_ends_inside_a_drafted_block(verify: str, lookahead: int) -> None:
    """CartPole: termination (a bad controller) and TimeLimit truncation (max_episode_steps=13) both
    fall inside drafted blocks; max_steps=500 is never reached."""
    target = ArgmaxOf(CartPoleLinear([0.0, 0.0, 1.0, 0.3]), 2)
    draft = CartPoleLinear([0.1, 0.2, 1.0, 0.1], temperature=0.5)
    bad = ArgmaxOf(CartPoleLinear([0.0, 0.0, -1.0, -0.3]), 2)  # pushes the pole over
    for pol, make in [(target, lambda: gym.make("CartPole-v1", max_episode_steps=13)),
                      (bad, lambda: gym.make("CartPole-v1"))]:
        envs = [make() for _ in range(8)]
        spec = speculative_rollouts(envs, pol, draft, max_steps=500, lookahead=lookahead, verify=verify, rng=1)
        same_episodes(spec, rollouts(envs, pol, max_steps=500, rng=1))
        assert all(t.terminated or t.truncated for t in spec)
    assert all(t.truncated and len(t) == 13 for t in speculative_rollouts(
        [gym.make("CartPole-v1", max_episode_steps=13)], target, draft, lookahead=lookahead, verify=verify))


def test_max_steps_inside_a_block_and_zero_steps() -> None:
    target = ArgmaxOf(CartPoleLinear([0.0, 0.0, 1.0, 0.3]), 2)
    draft = CartPoleLinear([0.0, 0.0, 1.0, 0.3], temperature=0.3)
    for max_steps in (0, 1, 2, 7, 10):
        t = speculative_rollout(gym.make("CartPole-v1"), target, draft, max_steps=max_steps, lookahead=4, rng=2)
        assert len(t) == max_steps and len(t.observations) == max_steps + 1
        assert t.truncated and not t.terminated  # max_steps reached first, max_steps=0 included
        plain = rollout(gym.make("CartPole-v1"), target, max_steps=max_steps, rng=2)
        assert (plain.terminated, plain.truncated) == (t.terminated, t.truncated)  # the same law, flags too
        assert t.observations.shape == (max_steps + 1, 4) and t.actions.dtype == np.int64


def test_same_seed_same_trajectories_and_inputs_agree() -> None:
    rng = np.random.default_rng(1)
    P, Q = rng.dirichlet(np.ones(4), size=16), rng.dirichlet(np.ones(4), size=16)
    fns = [lambda: gym.make("FrozenLake-v1", is_slippery=True)] * 5
    a = speculative_rollouts(fns, TabularPolicy(P), TabularPolicy(Q), max_steps=20, rng=9)
    b = speculative_rollouts([f() for f in fns], TabularPolicy(P), TabularPolicy(Q), max_steps=20, rng=9)
    c = speculative_rollouts(gym.vector.SyncVectorEnv(fns), TabularPolicy(P), TabularPolicy(Q), max_steps=20, rng=9)
    same_episodes(a, b)
    same_episodes(a, c)
    d = speculative_rollouts(fns, TabularPolicy(P), TabularPolicy(Q), max_steps=20, rng=10)
    assert any(len(x) != len(y) or not np.array_equal(x.actions, y.actions) for x, y in zip(a, d, strict=True))


def test_auto_lookahead_with_a_fixed_cost_ratio_is_reproducible() -> None:
    """lookahead="auto" with cost_ratio= chooses k from the seed alone: two runs with the same rng give
    the same episodes (and the same sequence of lookaheads), for an int seed and for a Generator."""
    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.ones(4), size=16)
    Q = 0.7 * P + 0.3 * rng.dirichlet(np.ones(4), size=16)
    fns = [lambda: gym.make("FrozenLake-v1", is_slippery=True)] * 6

    def go(r):
        return speculative_rollouts(fns, TabularPolicy(P), TabularPolicy(Q), max_steps=60, lookahead="auto",
                                    cost_ratio=0.1, rng=r)

    for make_rng in (lambda: 3, lambda: np.random.default_rng(3)):
        a, b = go(make_rng()), go(make_rng())
        same_episodes(a, b)
        assert a.stats.lookahead_counts == b.stats.lookahead_counts
        assert a.stats.rejections > 0 and len(a.stats.lookahead_counts) > 1  # k did adapt


def test_generator_rng_gives_plain_and_speculative_the_same_reset_seeds() -> None:
    """rng=Generator: the reset seeds are drawn from it first, the same way in both functions, so a
    deterministic policy reproduces plain rollouts bit for bit, as with an int seed."""
    rng = np.random.default_rng(0)
    target = ArgmaxOf(TabularPolicy(rng.dirichlet(np.ones(4), size=16)), 4)
    draft = TabularPolicy(rng.dirichlet(np.ones(4), size=16))
    envs = [gym.make("FrozenLake-v1", is_slippery=True) for _ in range(10)]
    spec = speculative_rollouts(envs, target, draft, max_steps=30, lookahead=3, rng=np.random.default_rng(8))
    same_episodes(spec, rollouts(envs, target, max_steps=30, rng=np.random.default_rng(8)))
    other = rollouts(envs, target, max_steps=30, rng=np.random.default_rng(9))
    assert any(len(x) != len(y) or not np.array_equal(x.observations, y.observations)
               for x, y in zip(spec, other, strict=True))


def test_draft_equal_to_policy_keeps_everything() -> None:
    rng = np.random.default_rng(2)
    pi = TabularPolicy(rng.dirichlet(np.ones(4), size=64))
    out = speculative_rollouts([gym.make("FrozenLake-v1", map_name="8x8", is_slippery=False) for _ in range(3)],
                               pi, pi, max_steps=40, lookahead=4, verify="block", rng=0)
    s = out.stats
    assert s.acceptance_rate == 1.0 and s.rejections == 0
    assert s.target_calls < out.steps  # several steps per target call


def test_stats_and_ragged_rows() -> None:
    """Rows finish at different rounds; every row's trajectory is internally consistent."""
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.ones(4), size=16)
    Q = 0.6 * P + 0.4 * rng.dirichlet(np.ones(4), size=16)
    out = speculative_rollouts([gym.make("FrozenLake-v1", is_slippery=True) for _ in range(30)],
                               TabularPolicy(P), TabularPolicy(Q), max_steps=50, lookahead="auto", cost_ratio=0.05,
                               rng=4)
    assert len({len(t) for t in out}) > 3
    for t in out:
        assert len(t.rewards) == len(t.actions) == len(t.infos) == len(t.observations) - 1
        assert t.terminated != t.truncated
        assert all("prob" in info for info in t.infos)
    assert out.stats.proposed >= out.stats.accepted > 0


class BufferEnv(gym.Env):
    """Returns the same observation array every step, overwritten in place (allowed by gymnasium,
    flagged by its checker): drafted observations must be copied before the policy scores them."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.buf = np.zeros(1)
        return self.buf, {}

    def step(self, a):
        self.buf[0] = np.clip(self.buf[0] + (0.3 if a else -0.3) + self.np_random.normal(0, 0.5), -10, 10)
        return self.buf, 0.0, False, False, {}


def test_env_that_reuses_its_observation_buffer() -> None:
    target = lambda obs: np.where(obs[:, :1] > 0, [[30.0, -30.0]], [[-30.0, 30.0]])  # noqa: E731
    draft = lambda obs: np.zeros((len(obs), 2))  # noqa: E731
    envs = [gym.wrappers.TimeLimit(BufferEnv(), 100) for _ in range(4)]
    for verify in ("token", "block"):
        spec = speculative_rollouts(envs, target, draft, max_steps=30, lookahead=4, verify=verify, rng=0)
        same_episodes(spec, rollouts(envs, target, max_steps=30, rng=0))
        assert len({float(x) for x in spec[0].observations[:, 0]}) > 10  # not all one aliased value


def test_every_function_taking_lookahead_states_the_reproducibility_rule() -> None:
    """Every public RL function that takes ``lookahead`` (so ``"auto"``) also takes ``cost_ratio``
    and says in its docstring that only a fixed ``cost_ratio`` makes "auto" seeded runs reproducible."""
    import importlib
    import inspect
    import pkgutil

    import speculate.domains.rl as rl

    found = set()
    for info in pkgutil.walk_packages(rl.__path__, "speculate.domains.rl."):
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", []):
            fn = getattr(mod, name)
            if inspect.isfunction(fn) and "lookahead" in inspect.signature(fn).parameters:
                found.add(name)
                assert "cost_ratio" in inspect.signature(fn).parameters, f"{info.name}.{name} has no cost_ratio"
                doc = inspect.getdoc(fn)
                assert "cost_ratio" in doc and "reproducib" in doc, f"{info.name}.{name} does not state the rule"
    assert {"speculative_rollouts", "speculative_rollout", "sample_keys", "sample_mixed"} <= found
