"""Snapshots: save/restore mid-episode is bit-identical to the uninterrupted environment.

``check_snapshot`` steps an env, saves it, steps on, restores, steps the same actions again, and
also restores the snapshot into a second env reset with another seed; the step results and the
full state of every layer (all attributes, RNG states, MuJoCo MjData arrays) must equal those of a
third env that ran uninterrupted. These are exact (deterministic) checks.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from speculate.domains.rl import SnapshotError, check_snapshot, register_snapshot, snapshotter

BUILTIN = [
    ("CartPole-v1", {}),
    ("Acrobot-v1", {}),
    ("MountainCar-v0", {}),
    ("MountainCarContinuous-v0", {}),
    ("Pendulum-v1", {}),
    ("FrozenLake-v1", {"is_slippery": True}),
    ("FrozenLake8x8-v1", {"is_slippery": True}),
    ("Taxi-v4", {"is_rainy": True, "fickle_passenger": True}),
    ("CliffWalking-v1", {"is_slippery": True}),
    ("Blackjack-v1", {}),
]
MUJOCO = ["HalfCheetah-v5", "Hopper-v5", "Ant-v5", "Reacher-v5", "Pusher-v5", "InvertedDoublePendulum-v5"]


@pytest.mark.parametrize(("env_id", "kwargs"), BUILTIN, ids=[b[0] for b in BUILTIN])
@pytest.mark.parametrize("steps_before", [0, 3, 17])
def test_builtin_snapshot_is_bit_identical(env_id: str, kwargs: dict, steps_before: int) -> None:
    for seed in range(3):
        check_snapshot(lambda: gym.make(env_id, **kwargs), rng=seed, steps_before=steps_before, steps_after=40)
    assert "data" not in snapshotter(_reset(gym.make(env_id, **kwargs))).kinds.values()  # registered savers


@pytest.mark.parametrize("env_id", MUJOCO)
def test_mujoco_snapshot_is_bit_identical(env_id: str, tmp_path, monkeypatch) -> None:
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT to the working directory
    for seed in range(2):
        check_snapshot(lambda: gym.make(env_id), rng=seed, steps_before=4, steps_after=30)
    assert snapshotter(_reset(gym.make(env_id))).kinds[type(gym.make(env_id).unwrapped).__name__] == "mujoco"


def test_mujoco_deepcopy_is_a_fresh_env_but_snapshot_is_not(tmp_path, monkeypatch) -> None:
    """Why MuJoCo needs mj_copyData: deepcopy silently rebuilds the env from its constructor args."""
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)
    env = gym.make("HalfCheetah-v5")
    env.reset(seed=0)
    for _ in range(5):
        env.step(np.full(6, 0.5, np.float32))
    qpos = env.unwrapped.data.qpos.copy()
    assert not np.array_equal(copy.deepcopy(env).unwrapped.data.qpos, qpos)
    snap = snapshotter(env)
    s = snap.save()
    env.step(np.zeros(6, np.float32))
    snap.restore(s)
    assert np.array_equal(env.unwrapped.data.qpos, qpos)


STATEFUL_WRAPPERS = {
    "RecordEpisodeStatistics": lambda e: gym.wrappers.RecordEpisodeStatistics(e),
    "NormalizeObservation": lambda e: gym.wrappers.NormalizeObservation(e),
    "NormalizeReward": lambda e: gym.wrappers.NormalizeReward(e),
    "FrameStackObservation": lambda e: gym.wrappers.FrameStackObservation(e, 3),
    "TimeAwareObservation": lambda e: gym.wrappers.TimeAwareObservation(e),
    "DelayObservation": lambda e: gym.wrappers.DelayObservation(e, 2),
    "ClipAction+RescaleAction": lambda e: gym.wrappers.ClipAction(
        gym.wrappers.RescaleAction(e, np.float32(-1), np.float32(1))
    ),
}


@pytest.mark.parametrize("name", list(STATEFUL_WRAPPERS))
def test_wrapper_state_is_restored(name: str) -> None:
    base = "Pendulum-v1" if "Action" in name else "CartPole-v1"
    wrap = STATEFUL_WRAPPERS[name]
    if name == "RecordEpisodeStatistics":  # its wall-clock start time differs between instances
        env = wrap(gym.make(base))
        env.reset(seed=0)
        snap = snapshotter(env)
        s = snap.save()
        lengths = [env.step(env.action_space.sample())[-1] for _ in range(5)]
        snap.restore(s)
        assert env.episode_lengths == 0 and env.episode_returns == 0.0 and len(lengths) == 5
        return
    check_snapshot(lambda: wrap(gym.make(base)), rng=1, steps_before=5, steps_after=30)


class GridWorld(gym.Env):
    """A pure-Python env (plain data state): the generic fallback snapshots it."""

    observation_space = gym.spaces.Discrete(25)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = [0, 0]
        self.visits = {(0, 0): 1}
        self.history = []
        return 0, {}

    def step(self, a):
        move = [(0, 1), (1, 0), (0, -1), (-1, 0)][a if self.np_random.random() < 0.8 else self.np_random.integers(4)]
        self.pos = [min(4, max(0, self.pos[0] + move[0])), min(4, max(0, self.pos[1] + move[1]))]
        key = tuple(self.pos)
        self.visits[key] = self.visits.get(key, 0) + 1
        self.history.append(np.array(self.pos))
        obs = 5 * self.pos[0] + self.pos[1]
        return obs, float(self.visits[key] == 1), obs == 24, False, {"visits": len(self.visits)}


def test_generic_fallback_snapshots_plain_data_envs() -> None:
    check_snapshot(lambda: gym.wrappers.TimeLimit(GridWorld(), 50), rng=0, steps_before=6, steps_after=40)
    assert snapshotter(_reset(GridWorld())).kinds["GridWorld"] == "data"


class HoldsAClosure(GridWorld):
    def reset(self, *, seed=None, options=None):
        out = super().reset(seed=seed)
        counter = [0]

        def tick():
            counter[0] += 1
            return counter[0]

        self.tick = tick
        return out


class HoldsACObject(GridWorld):
    def reset(self, *, seed=None, options=None):
        import ctypes

        out = super().reset(seed=seed)
        self.buffer = ctypes.create_string_buffer(8)
        return out


@pytest.mark.parametrize(("cls", "what"), [(HoldsAClosure, "closure"), (HoldsACObject, "buffer")])
def test_unsupported_env_gets_a_clear_error(cls: type, what: str) -> None:
    env = gym.wrappers.TimeLimit(cls(), 10)
    env.reset(seed=0)
    with pytest.raises(SnapshotError, match=rf"{cls.__qualname__}.*{what}.*register_snapshot"):
        snapshotter(env)


def test_register_snapshot_and_check_catches_an_incomplete_saver() -> None:
    class Counter(GridWorld):
        pass

    # a saver that forgets the visit counts: check_snapshot must notice
    register_snapshot(Counter, lambda e: list(e.pos), lambda e, s: setattr(e, "pos", list(s)))
    with pytest.raises(AssertionError, match=r"differ|vs"):
        check_snapshot(lambda: Counter(), rng=0, steps_before=3, steps_after=20)
    # the complete saver passes
    fields = ("pos", "visits", "history")
    register_snapshot(
        Counter,
        lambda e: copy.deepcopy([getattr(e, f) for f in fields]),
        lambda e, s: [setattr(e, f, v) for f, v in zip(fields, copy.deepcopy(s), strict=True)],
    )
    check_snapshot(lambda: Counter(), rng=0, steps_before=3, steps_after=20)
    assert snapshotter(_reset(Counter())).kinds["Counter"] == "registered"


def test_snapshot_needs_a_reset_env_and_a_single_env() -> None:
    with pytest.raises(SnapshotError, match="before reset"):
        snapshotter(gym.make("CartPole-v1")).save()
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with pytest.raises(SnapshotError, match="vector environment"):
        snapshotter(vec)


def test_restore_is_repeatable_and_release_recycles() -> None:
    env = gym.make("FrozenLake-v1", is_slippery=True)
    env.reset(seed=5)
    snap = snapshotter(env)
    s = snap.save()
    runs = []
    for _ in range(3):
        snap.restore(s)
        runs.append([env.step(2)[0] for _ in range(6)])
    assert runs[0] == runs[1] == runs[2]
    snap.release(s)  # a no-op for attribute savers; must not break a later save/restore
    s2 = snap.save()
    snap.restore(s2)


def _reset(env):
    env.reset(seed=0)
    return env
