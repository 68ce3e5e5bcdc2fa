"""Exact save/restore of a gymnasium environment mid-episode: state, RNG and wrapper state.

Speculative rollouts step an environment ahead with the draft policy and must roll it back to the
last kept state, bit for bit. Gymnasium has no official clone/restore, so this package keeps a
registry of savers keyed by the type of each layer of the wrapper stack:

- the unwrapped environment: built-in, exact savers for classic control (CartPole, Acrobot,
  MountainCar, MountainCarContinuous, Pendulum), toy text (FrozenLake, Taxi, CliffWalking,
  Blackjack) and, when the ``mujoco`` package is installed, every ``MujocoEnv`` (the simulation
  state is copied with ``mujoco.mj_copyData``; ``copy.deepcopy`` of a MuJoCo or Box2D environment
  silently builds a fresh one, because they pickle by re-running their constructor);
- the environment's ``np_random`` (its bit generator state) is always saved with it;
- wrappers: the stateful gymnasium wrappers (TimeLimit's elapsed steps, OrderEnforcing,
  PassiveEnvChecker, RecordEpisodeStatistics, frame stacks, normalisers, ...) and the stateless ones;
- a generic fallback for any other layer whose instance attributes are plain data (numbers, strings,
  numpy arrays and generators, containers and plain Python objects made of those): their deep copy
  is exact. A layer holding anything else (a C extension object, a closure, an object with a custom
  pickle protocol) gets a :class:`SnapshotError` naming the environment and the attribute, and
  :func:`register_snapshot` is the way to support it.

The generic fallback is exact for environments whose dynamics read only their own attributes and
``np_random`` (the gymnasium contract); an environment that draws from a global RNG (``random``,
``np.random.*`` module functions) is outside it and needs its own saver.

Modules: :mod:`.registry` (the savers by layer type, the built-in ones, :func:`register_snapshot`),
:mod:`.plain_data` (what a deep copy reproduces exactly: the generic fallback), :mod:`.snapshotter`
(:class:`EnvSnapshotter`: a wrapper stack as layers, MuJoCo included), :mod:`.check`
(:func:`check_snapshot`: restored runs must be bit-identical to uninterrupted ones).

>>> import gymnasium as gym
>>> from speculate.domains.rl.snapshots import snapshotter
>>> env = gym.make("FrozenLake-v1")
>>> _ = env.reset(seed=0)
>>> snap = snapshotter(env)
>>> s = snap.save()
>>> first = [env.step(1)[0] for _ in range(5)]
>>> snap.restore(s)
>>> [env.step(1)[0] for _ in range(5)] == first
True
"""

from .check import check_snapshot, env_state
from .registry import SnapshotError, register_snapshot
from .snapshotter import EnvSnapshotter, snapshotter

__all__ = ["EnvSnapshotter", "SnapshotError", "check_snapshot", "env_state", "register_snapshot", "snapshotter"]
