"""The registry of exact savers, keyed by layer type, and the built-in ones.

Built in: the unwrapped classic-control and toy-text environments (the attributes their ``step``
and ``reset`` write) and the gymnasium wrappers, stateful (with the attributes they write) and
stateless. :func:`register_snapshot` adds an entry for any other layer type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .plain_data import copy_value

__all__ = ["SnapshotError", "lookup", "register_snapshot"]


class SnapshotError(TypeError):
    """The environment (or one of its wrappers) cannot be saved and restored exactly."""


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


def lookup(cls: type) -> _Entry | None:
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
        return [copy_value(d[n]) if n in d else missing for n in names]

    def restore(obj: Any, state: list) -> None:
        d = obj.__dict__
        for n, v in zip(names, state, strict=True):
            if v is missing:
                d.pop(n, None)
            else:
                d[n] = copy_value(v)

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
