"""Plain data: what a deep copy reproduces exactly, and the generic save/restore built on it.

A layer of the wrapper stack with no registered saver is snapshotted by deep copy of its instance
attributes when they are all plain data (numbers, strings, numpy arrays and generators, containers
and plain Python objects made of those); :func:`plain_data_problem` says why a value is not.

>>> import numpy as np
>>> plain_data_problem({"pos": [0, 1], "rng": np.random.default_rng(0)}, "state", set()) is None
True
>>> def counter():
...     n = [0]
...     return lambda: n
>>> plain_data_problem({"tick": counter()}, "state", set())
"state['tick'] is a closure (counter.<locals>.<lambda>), whose captured state cannot be copied"
"""

from __future__ import annotations

import collections
import copy
import enum
import random
import types
import typing
from typing import Any

import numpy as np

__all__ = ["copy_value", "data_fallback_problem", "data_keys", "data_restore", "data_save", "is_wrapper",
           "plain_data_problem"]


# ----------------------------------------------------------------------------------------------
# copying helpers


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, np.generic, enum.Enum)


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, np.float64, np.int64, np.bool_})


def copy_value(v: Any) -> Any:
    """A copy of ``v`` that later mutation of the environment cannot reach (cheap for the usual types)."""
    t = type(v)
    if t in _SCALARS or isinstance(v, _IMMUTABLE):
        return v
    if t is np.ndarray and v.dtype != object:
        return v.copy()
    if t is tuple:
        return tuple([copy_value(x) for x in v])
    if t is list:
        return [copy_value(x) for x in v]
    if t is dict:
        return {k: copy_value(x) for k, x in v.items()}
    return copy.deepcopy(v)


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


def plain_data_problem(value: Any, path: str, seen: set[int]) -> str | None:
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
                if (why := plain_data_problem(x, f"{path}.flat[{i}]", seen)) is not None:
                    return why
        return None
    if isinstance(value, types.FunctionType):
        if value.__closure__:
            return f"{path} is a closure ({value.__qualname__}), whose captured state cannot be copied"
        return None
    if type(value) in (list, tuple, set, frozenset, collections.deque):
        for i, x in enumerate(value):
            if (why := plain_data_problem(x, f"{path}[{i}]", seen)) is not None:
                return why
        return None
    if type(value) in (dict, collections.OrderedDict, collections.defaultdict):
        factory = getattr(value, "default_factory", None)
        if factory is not None and (why := plain_data_problem(factory, f"{path}.default_factory", seen)):
            return why
        for k, x in value.items():
            if (why := plain_data_problem(k, f"{path} key {k!r}", seen)) is not None:
                return why
            if (why := plain_data_problem(x, f"{path}[{k!r}]", seen)) is not None:
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
        if (why := plain_data_problem(x, f"{path}.{k}", seen)) is not None:
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


def data_keys(obj: Any) -> list[str]:
    """The attributes of a layer that its steps may change (its configuration left out)."""
    skip = _WRAPPER_CONFIG if is_wrapper(obj) else _ENV_CONFIG
    return [k for k in vars(obj) if k not in skip]


def data_save(obj: Any, keys: list[str] | None = None) -> dict[str, Any]:
    """A deep copy of the layer's data attributes."""
    keys = data_keys(obj) if keys is None else keys
    d = vars(obj)
    return copy.deepcopy({k: d[k] for k in keys if k in d})


def data_restore(obj: Any, state: dict[str, Any], keys: list[str] | None = None) -> None:
    """Put back what :func:`data_save` returned (attributes added since are removed)."""
    d = vars(obj)
    for k in data_keys(obj) if keys is None else keys:
        if k not in state and k in d:
            delattr(obj, k)
    for k, v in copy.deepcopy(state).items():
        setattr(obj, k, v)


def data_fallback_problem(obj: Any) -> str | None:
    """None if the generic fallback snapshots ``obj`` exactly, else the first attribute that stops it."""
    seen: set[int] = {id(obj)}
    for k in data_keys(obj):
        if (why := plain_data_problem(vars(obj)[k], k, seen)) is not None:
            return why
    return None


def is_wrapper(obj: Any) -> bool:
    """Whether ``obj`` is a gymnasium wrapper (whose ``env`` is the next layer)."""
    import gymnasium as gym

    return isinstance(obj, gym.Wrapper)
