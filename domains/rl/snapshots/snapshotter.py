"""The snapshotter of one environment: its wrapper stack as layers, each saved and restored exactly.

Each layer is saved by its registered saver (:mod:`.registry`), by ``mujoco.mj_copyData`` into
pooled ``MjData`` buffers for a ``MujocoEnv``, or by deep copy when it is plain data
(:mod:`.plain_data`); the unwrapped environment's ``np_random`` is always saved with it.

>>> import gymnasium as gym
>>> env = gym.make("CartPole-v1")
>>> _ = env.reset(seed=0)
>>> snap = snapshotter(env)
>>> sorted(snap.kinds.items())[:2]
[('CartPoleEnv', 'registered'), ('OrderEnforcing', 'registered')]
>>> s = snap.save()
>>> before = env.step(0)[0]
>>> snap.restore(s)
>>> bool((env.step(0)[0] == before).all())
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .plain_data import (
    copy_value,
    data_fallback_problem,
    data_keys,
    data_restore,
    data_save,
    is_wrapper,
    plain_data_problem,
)
from .registry import SnapshotError, lookup

__all__ = ["EnvSnapshotter", "snapshotter"]


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
        self.keys = [k for k in data_keys(env) if k not in _MUJOCO_OWN]
        seen: set[int] = {id(env)}
        for k in self.keys:
            if (why := plain_data_problem(vars(env)[k], k, seen)) is not None:
                raise SnapshotError(
                    f"cannot snapshot {_describe(env)}: besides its MjData, {why}; "
                    "register_snapshot(type(env).__mro__[0], save, restore) for it"
                )

    def save(self) -> tuple[Any, dict[str, Any]]:
        m, d = self.env.model, self.env.data
        buf = self.pool.pop() if self.pool else self.mujoco.MjData(m)
        self.mujoco.mj_copyData(buf, m, d)
        d_env = vars(self.env)
        extra = {k: copy_value(d_env[k]) for k in self.keys if k in d_env}
        return buf, extra

    def restore(self, state: tuple[Any, dict[str, Any]]) -> None:
        buf, extra = state
        self.mujoco.mj_copyData(self.env.data, self.env.model, buf)
        for k, v in extra.items():
            setattr(self.env, k, copy_value(v))

    def release(self, state: tuple[Any, dict[str, Any]]) -> None:
        self.pool.append(state[0])


# ----------------------------------------------------------------------------------------------
# the snapshotter of one environment


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
        self.entry = lookup(type(obj))
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
        why = data_fallback_problem(obj)
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
        return data_save(self.obj)

    def restore(self, state: Any) -> None:
        if self.entry is not None:
            self.entry.restore(self.obj, state)
        elif self.mujoco is not None:
            self.mujoco.restore(state)
        else:
            data_restore(self.obj, state)

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
            if not is_wrapper(obj):
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
