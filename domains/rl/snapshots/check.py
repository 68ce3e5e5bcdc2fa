"""Check that an environment's snapshot is exact: restored runs are bit-identical to uninterrupted ones.

Use it on your own environment after :func:`speculate.domains.rl.register_snapshot`:

>>> import gymnasium as gym
>>> from speculate.domains.rl import check_snapshot
>>> check_snapshot(lambda: gym.make("CartPole-v1"), rng=3)
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from ..seeding import int_seed
from .snapshotter import snapshotter

__all__ = ["check_snapshot", "env_state"]


# Sparse-Jacobian index arrays: unused (uninitialised arena memory) when the model's Jacobian is
# dense, so they differ even between two fresh, identically stepped environments.
_SPARSE_INDEX = {f"efc_{j}_{n}" for j in ("J", "JT") for n in ("rownnz", "rowadr", "rowsuper", "colind")}


def _mjdata_state(data: Any, sparse: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in dir(data):
        if name.startswith("_") or (not sparse and name in _SPARSE_INDEX):
            continue
        try:
            v = getattr(data, name)
        except Exception:
            continue
        if isinstance(v, np.ndarray) or isinstance(v, (int, float)):
            out[name] = np.array(v, copy=True)
    return out


def env_state(env: Any) -> list[dict[str, Any]]:
    """Everything an environment stack holds, layer by layer, in comparable form.

    Each layer's instance attributes (minus the wrapped ``env``), numpy generators as their bit
    generator state, MuJoCo ``MjData`` as all of its arrays (the ``MjModel`` and renderers are
    skipped: they do not change while stepping).
    """
    import gymnasium as gym

    layers = []
    obj = env
    while True:
        d = {}
        for k, v in vars(obj).items():
            if k in ("env", "model", "mujoco_renderer"):
                continue
            if type(v).__name__ == "MjData":
                import mujoco

                d[k] = _mjdata_state(v, bool(mujoco.mj_isSparse(obj.model)))
            else:
                d[k] = v
        layers.append(d)
        if not isinstance(obj, gym.Wrapper):
            break
        obj = obj.env
    return layers


def _diff(a: Any, b: Any, path: str) -> str | None:
    """None when ``a`` and ``b`` are identical (bitwise for arrays), else where they differ."""
    if isinstance(a, np.random.Generator) or isinstance(b, np.random.Generator):
        if not (isinstance(a, np.random.Generator) and isinstance(b, np.random.Generator)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        return _diff(a.bit_generator.state, b.bit_generator.state, path + ".bit_generator.state")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a.flat, b.flat, strict=True)):
                if (d := _diff(x, y, f"{path}.flat[{i}]")) is not None:
                    return d
            return None
        if a.tobytes() != b.tobytes():
            return f"{path}: arrays differ ({a!r} vs {b!r})"
        return None
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if type(a) in (dict, list, tuple):  # fast path for large constant tables (e.g. Taxi's P)
        try:
            if a is b or bool(a == b):
                return None
        except Exception:  # arrays inside: compare element by element below
            pass
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            if (d := _diff(a[k], b[k], f"{path}[{k!r}]")) is not None:
                return d
        return None
    if isinstance(a, (list, tuple, collections.deque)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (d := _diff(x, y, f"{path}[{i}]")) is not None:
                return d
        return None
    if isinstance(a, float) and np.isnan(a) and np.isnan(b):
        return None
    if hasattr(a, "__dict__") and not isinstance(a, type) and type(a).__eq__ is object.__eq__:
        return _diff(vars(a), vars(b), path)
    try:
        same = bool(a == b)
    except Exception as e:  # an object that cannot be compared
        return f"{path}: cannot compare {type(a).__name__} ({e})"
    return None if same else f"{path}: {a!r} vs {b!r}"


def _run(env: Any, actions: list[Any], *, reset: bool = False) -> list[tuple]:
    """Step through ``actions``; at an episode's end stop, or with ``reset`` start the next one."""
    out: list[tuple] = []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append((obs, r, term, trunc, info))
        if term or trunc:
            if not reset:
                break
            out.append(env.reset())
    return out


def check_snapshot(
    make_env: Callable[[], Any],
    *,
    rng: int | np.random.Generator | None = 0,
    steps_before: int = 5,
    steps_after: int = 20,
) -> None:
    """Raise AssertionError unless save/restore of ``make_env()``'s environments is exact.

    Three environments are made. ``A`` and ``B`` are reset with the seed ``rng`` (an int drawn from
    it when it is a Generator or None) and stepped with the same random actions for
    ``steps_before`` steps (starting new episodes as old ones end); ``A`` is saved, stepped
    ``steps_after`` more steps, restored and stepped again; ``C`` (reset with another seed, so
    every bit of state differs) has ``A``'s snapshot restored into it and is stepped too; ``B``
    runs on uninterrupted. The step results and the complete state of every layer
    (``env_state``) must be identical across all four runs.
    """
    seed = int_seed(rng)
    a_env, b_env, c_env = make_env(), make_env(), make_env()
    a_env.reset(seed=seed)
    b_env.reset(seed=seed)
    c_env.reset(seed=seed + 7919)
    space = copy.deepcopy(a_env.action_space)  # a private copy: never touch the env's space RNG
    space.seed(seed)
    actions = [space.sample() for _ in range(steps_before + steps_after)]
    pre_a = _run(a_env, actions[:steps_before], reset=True)
    pre_b = _run(b_env, actions[:steps_before], reset=True)
    if (d := _diff(pre_a, pre_b, "steps before the snapshot")) is not None:
        raise AssertionError(f"two environments reset with the same seed differ: {d}")
    snap_a = snapshotter(a_env)
    snap = snap_a.save()
    post = _run(a_env, actions[steps_before:])
    state = env_state(a_env)
    runs = {"uninterrupted": (_run(b_env, actions[steps_before:]), env_state(b_env))}
    snap_a.restore(snap)
    runs["restored in place"] = (_run(a_env, actions[steps_before:]), env_state(a_env))
    snapshotter(c_env).restore(snap)
    runs["restored into another instance"] = (_run(c_env, actions[steps_before:]), env_state(c_env))
    for name, (steps, st) in runs.items():
        if (d := _diff(post, steps, "step results")) is not None:
            raise AssertionError(f"{name}: {d}")
        if (d := _diff(state, st, "environment state")) is not None:
            raise AssertionError(f"{name}: {d}")
