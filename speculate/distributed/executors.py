"""The engines a distributed run can use, and values built once per worker.

- any ``concurrent.futures.Executor``: a Dask ``Client.get_executor()`` (a Dask ``Client`` itself
  is accepted and turned into one), a ``ProcessPoolExecutor``, a ``ThreadPoolExecutor``;
- Ray: ``executor="ray"`` or :class:`RayExecutor` (a ``concurrent.futures.Executor`` over Ray
  remote tasks; Ray ships none of its own, ray-project/ray#29456). Ray is initialised on first use
  when it is not already (``ray.init()`` with its defaults); tasks are retried ``max_retries``
  times when their worker dies;
- :class:`PerWorker`: a model, policy or environment built from a picklable factory once per worker
  process (a key travels with the shard, not the object).

Fault tolerance is the engine's: Dask re-runs a task whose worker died (up to the scheduler's
``allowed-failures``), Ray re-runs it up to ``max_retries`` times. Shards are pure functions of
their inputs and seeds, so a re-run shard returns exactly what the lost one would have. A
``ProcessPoolExecutor`` does not retry: a killed process breaks the pool
(``BrokenProcessPool``).

>>> from concurrent.futures import ThreadPoolExecutor
>>> big = PerWorker(list, range(3))             # built at most once per process, on first use
>>> resolve(big) is resolve(big), resolve(big)
(True, [0, 1, 2])
>>> with ThreadPoolExecutor(2) as ex:
...     n_workers(ex)
2
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["PerWorker", "RayExecutor", "in_process", "n_workers", "resolve", "resolve_executor"]

_BUILT: dict[str, Any] = {}  # PerWorker key -> the value built in this process


class PerWorker:
    """A value built by ``factory(*args, **kwargs)`` at most once per process, where it is used.

    Pickling a ``PerWorker`` sends the factory and its arguments (and a key), never the value, so a
    model or an environment is loaded once per worker however many shards that worker runs.
    The factory must be picklable by the engine (a module-level function or class; Dask and Ray
    also pickle lambdas and closures with cloudpickle, a ``ProcessPoolExecutor`` does not).
    """

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(factory):
            raise TypeError(f"PerWorker needs a callable factory, got {type(factory).__name__}")
        self.factory, self.args, self.kwargs = factory, args, kwargs
        self.key = uuid.uuid4().hex

    def get(self) -> Any:
        """The value in this process, built on the first call."""
        if self.key not in _BUILT:
            _BUILT[self.key] = self.factory(*self.args, **self.kwargs)
        return _BUILT[self.key]

    def __repr__(self) -> str:
        return f"PerWorker({getattr(self.factory, '__qualname__', self.factory)!r})"


def resolve(value: Any) -> Any:
    """``value.get()`` for a :class:`PerWorker` (also inside a list or tuple), ``value`` otherwise."""
    if isinstance(value, PerWorker):
        return value.get()
    if isinstance(value, (list, tuple)) and any(isinstance(v, PerWorker) for v in value):
        return type(value)(resolve(v) for v in value)
    return value


def in_process(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a shard here (``executor=None``): nothing is pickled."""
    return fn(*args)


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


class RayExecutor(cf.Executor):
    """``concurrent.futures.Executor`` over Ray remote tasks.

    ``max_retries``: how many times Ray re-runs a task whose worker process died (Ray's own
    retries; ``retry_exceptions=False``: a user's exception is not retried). ``options``: any
    ``ray.remote`` option (``num_cpus=``, ``num_gpus=``, ``resources=``, ``runtime_env=`` ...).
    ``submit`` returns the ``concurrent.futures.Future`` of the task's ``ObjectRef``.
    """

    def __init__(self, *, max_retries: int = 3, init: bool = True, **options: Any) -> None:
        import ray

        if init and not ray.is_initialized():
            ray.init()
        self.options = {"num_cpus": 1, **options, "max_retries": int(max_retries), "retry_exceptions": False}
        self._remote = ray.remote(**self.options)(_call)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        return self._remote.remote(fn, args, kwargs).future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to release: the Ray runtime stays up (call ``ray.shutdown()`` yourself)."""

    def workers(self) -> int:
        """CPUs of the Ray cluster divided by the CPUs one task asks for (at least 1)."""
        import ray

        cpus = float(ray.cluster_resources().get("CPU", 1))
        per = float(self.options.get("num_cpus") or 1)
        return max(1, int(cpus // per))


def resolve_executor(executor: Any) -> Any:
    """None, or an object with ``submit(fn, *args) -> Future``: ``"ray"`` becomes a :class:`RayExecutor`,
    a Dask ``Client`` its ``get_executor()``."""
    if executor is None:
        return None
    if isinstance(executor, str):
        if executor == "ray":
            return RayExecutor()
        raise ValueError(f"executor must be None, 'ray', a concurrent.futures.Executor or a Dask Client, "
                         f"got {executor!r}")
    if type(executor).__name__ == "Client" and hasattr(executor, "get_executor"):  # distributed.Client
        return executor.get_executor(pure=False)
    if not callable(getattr(executor, "submit", None)):
        raise TypeError("executor must be None, 'ray', a concurrent.futures.Executor (Dask Client.get_executor(), "
                        f"ProcessPoolExecutor, ...) or a Dask Client; got {type(executor).__name__}")
    return executor


def n_workers(executor: Any) -> int:
    """How many tasks ``executor`` runs at once (the default number of shards); the CPU count if unknown."""
    if isinstance(executor, RayExecutor):
        return executor.workers()
    if hasattr(executor, "_max_workers"):  # ProcessPoolExecutor, ThreadPoolExecutor
        return max(1, int(executor._max_workers))
    client = getattr(executor, "_client", None)  # Dask ClientExecutor
    if client is not None and hasattr(client, "nthreads"):
        return max(1, sum(client.nthreads().values()))
    return os.cpu_count() or 1
