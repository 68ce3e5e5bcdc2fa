"""Exact save/restore of a gymnasium environment mid-episode: state, RNG and wrapper state.

Speculative rollouts step an environment ahead with the draft policy and must roll it back to the
last kept state, bit for bit. Gymnasium has no official clone/restore, so this module keeps a
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

from __future__ import annotations

import collections
import copy
import enum
import random
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "EnvSnapshotter",
    "SnapshotError",
    "register_snapshot",
    "snapshotter",
]


class SnapshotError(TypeError):
    """The environment (or one of its wrappers) cannot be saved and restored exactly."""


# ----------------------------------------------------------------------------------------------
# copying helpers


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, np.generic, enum.Enum)


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, np.float64, np.int64, np.bool_})


def _copy_value(v: Any) -> Any:
    """A copy of ``v`` that later mutation of the environment cannot reach (cheap for the usual types)."""
    t = type(v)
    if t in _SCALARS or isinstance(v, _IMMUTABLE):
        return v
    if t is np.ndarray and v.dtype != object:
        return v.copy()
    if t is tuple:
        return tuple([_copy_value(x) for x in v])
    if t is list:
        return [_copy_value(x) for x in v]
    if t is dict:
        return {k: _copy_value(x) for k, x in v.items()}
    return copy.deepcopy(v)


def _save_rng(gen: np.random.Generator | None) -> Any:
    return None if gen is None else gen.bit_generator.state


def _restore_rng(obj: Any, attr: str, state: Any) -> None:
    gen = getattr(obj, attr, None)
    if state is None:
        setattr(obj, attr, None)
        return
    if gen is None or type(gen.bit_generator).__name__ != state["bit_generator"]:
        gen = np.random.Generator(getattr(np.random, state["bit_generator"])())
        setattr(obj, attr, gen)
    gen.bit_generator.state = state


# ----------------------------------------------------------------------------------------------
# the plain-data check of the generic fallback


_BY_REFERENCE = (type, types.ModuleType, types.BuiltinFunctionType)
_DATA_LEAVES = (np.random.Generator, np.random.BitGenerator, np.random.RandomState, random.Random)
_PICKLE_HOOKS = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__deepcopy__", "__copy__")


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set for classes created by a class statement


def _compiled_class(cls: type) -> str | None:
    """The first class in ``cls``'s MRO implemented in C (whose state deepcopy cannot see), if any."""
    for klass in cls.__mro__:
        if klass is object or klass is typing.Generic:
            continue
        if not klass.__flags__ & _HEAPTYPE or "pybind11" in type(klass).__module__:
            return f"{klass.__module__}.{klass.__qualname__}"
    return None


def _custom_pickling(cls: type) -> str | None:
    for name in _PICKLE_HOOKS:
        for klass in cls.__mro__:
            if klass is object:
                break
            if name in vars(klass):
                return f"{klass.__name__}.{name}"
    return None


def _plain_data_problem(value: Any, path: str, seen: set[int]) -> str | None:
    """None if ``copy.deepcopy(value)`` is provably an exact, independent copy; else why not."""
    if isinstance(value, _IMMUTABLE) or isinstance(value, _BY_REFERENCE):
        return None
    if id(value) in seen:
        return None
    seen.add(id(value))
    if isinstance(value, _DATA_LEAVES):
        return None
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            for i, x in enumerate(value.flat):
                if (why := _plain_data_problem(x, f"{path}.flat[{i}]", seen)) is not None:
                    return why
        return None
    if isinstance(value, types.FunctionType):
        if value.__closure__:
            return f"{path} is a closure ({value.__qualname__}), whose captured state cannot be copied"
        return None
    if type(value) in (list, tuple, set, frozenset, collections.deque):
        for i, x in enumerate(value):
            if (why := _plain_data_problem(x, f"{path}[{i}]", seen)) is not None:
                return why
        return None
    if type(value) in (dict, collections.OrderedDict, collections.defaultdict):
        factory = getattr(value, "default_factory", None)
        if factory is not None and (why := _plain_data_problem(factory, f"{path}.default_factory", seen)):
            return why
        for k, x in value.items():
            if (why := _plain_data_problem(k, f"{path} key {k!r}", seen)) is not None:
                return why
            if (why := _plain_data_problem(x, f"{path}[{k!r}]", seen)) is not None:
                return why
        return None
    cls = type(value)
    if not hasattr(value, "__dict__") or cls.__module__ == "builtins":
        return f"{path} is a {cls.__module__}.{cls.__qualname__}, not plain Python data"
    if (compiled := _compiled_class(cls)) is not None:
        return f"{path} is a {cls.__qualname__}, built on {compiled} (implemented in C)"
    if hasattr(cls, "__slots__"):
        return f"{path} is a {cls.__qualname__} with __slots__"
    if (hook := _custom_pickling(cls)) is not None:
        return f"{path} is a {cls.__qualname__}, which defines {hook} (its copy may not be exact)"
    for k, x in vars(value).items():
        if (why := _plain_data_problem(x, f"{path}.{k}", seen)) is not None:
            return why
    return None


# Attributes that configure an environment layer and do not change while it steps.
_ENV_CONFIG = frozenset(
    {"spec", "metadata", "render_mode", "action_space", "observation_space", "reward_range",
     "_np_random", "_np_random_seed"}
)
_WRAPPER_CONFIG = frozenset(
    {"env", "_action_space", "_observation_space", "_metadata", "_cached_spec", "_reward_range",
     "_saved_kwargs"}
)


def _data_keys(obj: Any) -> list[str]:
    skip = _WRAPPER_CONFIG if _is_wrapper(obj) else _ENV_CONFIG
    return [k for k in vars(obj) if k not in skip]


def _data_save(obj: Any, keys: list[str] | None = None) -> dict[str, Any]:
    keys = _data_keys(obj) if keys is None else keys
    d = vars(obj)
    return copy.deepcopy({k: d[k] for k in keys if k in d})


def _data_restore(obj: Any, state: dict[str, Any], keys: list[str] | None = None) -> None:
    d = vars(obj)
    for k in _data_keys(obj) if keys is None else keys:
        if k not in state and k in d:
            delattr(obj, k)
    for k, v in copy.deepcopy(state).items():
        setattr(obj, k, v)


def _data_fallback_problem(obj: Any) -> str | None:
    seen: set[int] = {id(obj)}
    for k in _data_keys(obj):
        if (why := _plain_data_problem(vars(obj)[k], k, seen)) is not None:
            return why
    return None


# ----------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class _Entry:
    save: Callable[[Any], Any]
    restore: Callable[[Any, Any], None]
    subclasses: bool
    name: str


_REGISTRY: dict[type, _Entry] = {}


def register_snapshot(
    env_type: type,
    save: Callable[[Any], Any],
    restore: Callable[[Any, Any], None],
    *,
    subclasses: bool = False,
) -> None:
    """Teach the snapshot machinery to save and restore one layer type exactly.

    ``env_type`` is the class of an unwrapped environment or of a wrapper. ``save(layer)`` returns an
    object holding everything that the layer's ``step`` reads and writes (it must not share mutable
    objects with the layer: copy arrays and lists); ``restore(layer, state)`` puts it back and may be
    called several times with the same state. For an unwrapped environment, ``np_random`` (the
    ``_np_random`` attribute of ``gymnasium.Env``) is saved and restored for you; a layer that draws
    randomness from another generator must save and restore that generator's state too.

    ``subclasses=True`` applies the entry to subclasses too; only do so when subclasses add no state.

    >>> import numpy as np, gymnasium as gym
    >>> from speculate.domains.rl import register_snapshot
    >>> class Counter(gym.Env):
    ...     observation_space = gym.spaces.Discrete(100)
    ...     action_space = gym.spaces.Discrete(2)
    ...     def reset(self, *, seed=None, options=None):
    ...         super().reset(seed=seed)
    ...         self.n = 0
    ...         return self.n, {}
    ...     def step(self, a):
    ...         self.n += int(a) + int(self.np_random.integers(2))
    ...         return self.n, 1.0, self.n >= 99, False, {}
    >>> register_snapshot(Counter, lambda env: env.n, lambda env, n: setattr(env, "n", n))
    """
    if not isinstance(env_type, type):
        raise TypeError(f"register_snapshot expects a class, got {env_type!r}")
    if not (callable(save) and callable(restore)):
        raise TypeError("register_snapshot needs callables save(env) and restore(env, state)")
    name = f"{env_type.__module__}.{env_type.__qualname__}"
    _REGISTRY[env_type] = _Entry(save, restore, subclasses, name)


def _lookup(cls: type) -> _Entry | None:
    entry = _REGISTRY.get(cls)
    if entry is not None:
        return entry
    for klass in cls.__mro__[1:]:
        entry = _REGISTRY.get(klass)
        if entry is not None and entry.subclasses:
            return entry
    return None


def _attrs(*names: str) -> tuple[Callable[[Any], Any], Callable[[Any, Any], None]]:
    """save/restore of a fixed list of attributes (absent ones stay absent)."""
    missing = object()

    def save(obj: Any) -> list:
        d = obj.__dict__
        return [_copy_value(d[n]) if n in d else missing for n in names]

    def restore(obj: Any, state: list) -> None:
        d = obj.__dict__
        for n, v in zip(names, state, strict=True):
            if v is missing:
                d.pop(n, None)
            else:
                d[n] = _copy_value(v)

    save.stateless = restore.stateless = not names  # type: ignore[attr-defined]
    return save, restore


def _register_builtins() -> None:
    from gymnasium import wrappers as W
    from gymnasium.envs.classic_control import (
        acrobot,
        cartpole,
        continuous_mountain_car,
        mountain_car,
        pendulum,
    )
    from gymnasium.envs.toy_text import blackjack, cliffwalking, frozen_lake, taxi

    # Unwrapped environments: the attributes their step() and reset() write (read off the gymnasium
    # 1.x sources; np_random is handled by the snapshotter itself).
    envs = {
        cartpole.CartPoleEnv: ("state", "steps_beyond_terminated"),
        acrobot.AcrobotEnv: ("state",),
        mountain_car.MountainCarEnv: ("state",),
        continuous_mountain_car.Continuous_MountainCarEnv: ("state",),
        pendulum.PendulumEnv: ("state", "last_u"),
        frozen_lake.FrozenLakeEnv: ("s", "lastaction"),
        taxi.TaxiEnv: ("s", "lastaction", "fickle_step", "taxi_orientation"),
        cliffwalking.CliffWalkingEnv: ("s", "lastaction"),
        blackjack.BlackjackEnv: ("player", "dealer", "dealer_top_card_suit", "dealer_top_card_value_str"),
    }
    for cls, names in envs.items():
        register_snapshot(cls, *_attrs(*names))

    # Wrappers that keep state between steps, with the attributes their methods write.
    stateful = {
        "TimeLimit": ("_elapsed_steps",),
        "OrderEnforcing": ("_has_reset",),
        "PassiveEnvChecker": ("checked_reset", "checked_step", "checked_render", "close_called",
                              "checked_data_reuse", "_previous_data"),
        "RecordEpisodeStatistics": ("episode_returns", "episode_lengths", "episode_start_time",
                                    "episode_count", "_stats_key", "time_queue", "return_queue",
                                    "length_queue"),
        "TimeAwareObservation": ("timesteps",),
        "FrameStackObservation": ("obs_queue", "padding_value"),
        "DelayObservation": ("observation_queue",),
        "StickyAction": ("is_sticky_actions", "last_action", "num_repeats", "repeats_taken"),
        "NormalizeObservation": ("obs_rms", "_update_running_mean"),
        "NormalizeReward": ("discounted_reward", "return_rms", "_update_running_mean"),
        "MaxAndSkipObservation": ("_obs_buffer",),
        "Autoreset": ("autoreset",),
    }
    for name, names in stateful.items():
        cls = getattr(W, name, None)
        if cls is not None:
            register_snapshot(cls, *_attrs(*names))
    # Wrappers whose methods write no instance state (checked on the gymnasium 1.x sources).
    stateless = (
        "AddWhiteNoise", "ClipAction", "ClipReward", "DiscretizeAction", "DiscretizeObservation",
        "DtypeObservation", "FilterObservation", "FlattenObservation", "GrayscaleObservation",
        "ObstructView", "RepeatAction", "RescaleAction", "RescaleObservation", "ReshapeObservation",
        "ResizeObservation", "TransformAction", "TransformObservation", "TransformReward",
        "AddRenderObservation",
    )
    for name in stateless:
        cls = getattr(W, name, None)
        if cls is not None:
            register_snapshot(cls, *_attrs())


_register_builtins()


# ----------------------------------------------------------------------------------------------
# MuJoCo


# MujocoEnv attributes handled apart: the model (constant), the data (copied with mj_copyData) and
# the renderer. Everything else is copied as data: some envs write to init_qpos in reset_model.
_MUJOCO_OWN = frozenset({"model", "data", "mujoco_renderer"})


def _mujoco_env_class() -> type | None:
    try:
        import mujoco  # noqa: F401
        from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    except Exception:  # mujoco not installed (or broken): no MuJoCo support, nothing to register
        return None
    return MujocoEnv


class _MujocoLayer:
    """MjData buffers reused across snapshots (allocating an MjData costs ~0.5 ms, copying ~5 us)."""

    def __init__(self, env: Any) -> None:
        import mujoco

        self.mujoco = mujoco
        self.env = env
        self.pool: list[Any] = []
        self.keys = [k for k in _data_keys(env) if k not in _MUJOCO_OWN]
        seen: set[int] = {id(env)}
        for k in self.keys:
            if (why := _plain_data_problem(vars(env)[k], k, seen)) is not None:
                raise SnapshotError(
                    f"cannot snapshot {_describe(env)}: besides its MjData, {why}; "
                    "register_snapshot(type(env).__mro__[0], save, restore) for it"
                )

    def save(self) -> tuple[Any, dict[str, Any]]:
        m, d = self.env.model, self.env.data
        buf = self.pool.pop() if self.pool else self.mujoco.MjData(m)
        self.mujoco.mj_copyData(buf, m, d)
        d_env = vars(self.env)
        extra = {k: _copy_value(d_env[k]) for k in self.keys if k in d_env}
        return buf, extra

    def restore(self, state: tuple[Any, dict[str, Any]]) -> None:
        buf, extra = state
        self.mujoco.mj_copyData(self.env.data, self.env.model, buf)
        for k, v in extra.items():
            setattr(self.env, k, _copy_value(v))

    def release(self, state: tuple[Any, dict[str, Any]]) -> None:
        self.pool.append(state[0])


# ----------------------------------------------------------------------------------------------
# the snapshotter of one environment


def _is_wrapper(obj: Any) -> bool:
    import gymnasium as gym

    return isinstance(obj, gym.Wrapper)


def _describe(env: Any) -> str:
    spec = getattr(env, "spec", None)
    sid = getattr(spec, "id", None)
    cls = type(env)
    name = f"{cls.__module__}.{cls.__qualname__}"
    return f"{name} ({sid})" if sid else name


class _Layer:
    """How one layer of the wrapper stack is saved and restored."""

    def __init__(self, obj: Any, top: Any) -> None:
        self.obj = obj
        self.kind = "registered"
        self.entry = _lookup(type(obj))
        self.mujoco: _MujocoLayer | None = None
        if self.entry is not None:
            return
        mj = _mujoco_env_class()
        if mj is not None and isinstance(obj, mj):
            self.kind = "mujoco"
            self.mujoco = _MujocoLayer(obj)
            return
        if type(obj).__module__.startswith("gymnasium.envs.box2d"):
            raise SnapshotError(
                f"cannot snapshot {_describe(top)}: {_describe(obj)} is a Box2D environment, whose "
                "world lives in C++ objects (and whose deepcopy silently builds a fresh env); "
                "register_snapshot(...) with an exact save/restore for it"
            )
        why = _data_fallback_problem(obj)
        if why is not None:
            raise SnapshotError(
                f"cannot snapshot {_describe(top)}: layer {_describe(obj)} has no registered snapshot "
                f"and is not plain data ({why}); "
                f"register_snapshot({type(obj).__qualname__}, save, restore) to support it"
            )
        self.kind = "data"

    def save(self) -> Any:
        if self.entry is not None:
            return self.entry.save(self.obj)
        if self.mujoco is not None:
            return self.mujoco.save()
        return _data_save(self.obj)

    def restore(self, state: Any) -> None:
        if self.entry is not None:
            self.entry.restore(self.obj, state)
        elif self.mujoco is not None:
            self.mujoco.restore(state)
        else:
            _data_restore(self.obj, state)

    def release(self, state: Any) -> None:
        if self.mujoco is not None:
            self.mujoco.release(state)


class EnvSnapshotter:
    """Saves and restores one environment (its whole wrapper stack) exactly. Build with :func:`snapshotter`.

    ``save()`` returns an opaque snapshot; ``restore(s)`` puts the environment back in that state
    (any number of times); ``release(s)`` hands its buffers back for reuse (optional).
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        layers: list[Any] = []
        obj = env
        while True:
            layers.append(obj)
            if not _is_wrapper(obj):
                break
            obj = obj.env
        self.unwrapped = obj
        self.layers = [_Layer(x, env) for x in layers]
        # the layers that hold state (stateless wrappers are skipped), with their bound functions
        live = [x for x in self.layers if not getattr(getattr(x.entry, "save", None), "stateless", False)]
        self._live = live
        self._savers = [x.save for x in live]
        self._restorers = [x.restore for x in live]
        self._rng_attr = "_np_random" if hasattr(obj, "_np_random") else None
        self.kinds = {type(x.obj).__name__: x.kind for x in self.layers}

    def save(self) -> tuple:
        rng_state = None
        if self._rng_attr is not None:
            gen = getattr(self.unwrapped, self._rng_attr, None)
            if gen is None:
                raise SnapshotError(
                    f"cannot snapshot {_describe(self.env)} before reset(): its np_random is not set"
                )
            rng_state = (_save_rng(gen), getattr(self.unwrapped, "_np_random_seed", None))
        return rng_state, [save() for save in self._savers]

    def restore(self, snap: tuple) -> None:
        rng_state, states = snap
        for restore, state in zip(self._restorers, states, strict=True):
            restore(state)
        if rng_state is not None:
            _restore_rng(self.unwrapped, self._rng_attr, rng_state[0])
            self.unwrapped._np_random_seed = rng_state[1]

    def release(self, snap: tuple) -> None:
        for layer, state in zip(self._live, snap[1], strict=True):
            if layer.mujoco is not None:
                layer.mujoco.release(state)


def snapshotter(env: Any) -> EnvSnapshotter:
    """The :class:`EnvSnapshotter` of ``env``; raises :class:`SnapshotError` naming what is unsupported."""
    import gymnasium as gym

    if isinstance(env, gym.vector.VectorEnv):
        raise SnapshotError(
            f"{type(env).__qualname__} is a vector environment: snapshot its sub-environments "
            "(pass the env or env_fns to speculative_rollouts)"
        )
    return EnvSnapshotter(env)
