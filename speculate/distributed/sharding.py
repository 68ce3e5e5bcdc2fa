"""Seed-stable sharding: one random stream per row, shards of whole streams, results merged in order.

A distributed run gives every row (a chain, a rollout, a simulation, a prompt) its own random
stream, derived from ONE seed by a counter-based scheme: stream ``i`` is
``SeedSequence(seed, spawn_key=(STREAM_KEY, i))``, computed in O(1) for any ``i`` (numpy's
``SeedSequence.spawn`` gives the same family under another key). A row's samples depend only on
the seed and its own index, never on which rows share its shard or worker, so the same seed gives
the same samples in one process, on 2 workers or on 200, in any shard layout.

``rows_per_stream=b`` (default 1) lets ``b`` consecutive rows share one stream and one batched
round loop (one target call per round for the ``b`` rows): faster on one worker, and the results
are then the same for every shard layout made of whole streams (shards are always cut so) with
that same ``b``.

>>> import numpy as np
>>> from speculate.distributed import row_streams, shard_ranges
>>> a = [np.random.default_rng(s).random() for s in row_streams(7, 4)]
>>> b = [np.random.default_rng(s).random() for s in row_streams(7, 2, start=2)]
>>> a[2:] == b                        # stream i does not depend on which streams are made with it
True
>>> shard_ranges(7, 3)                # contiguous, balanced
[(0, 2), (2, 4), (4, 7)]
>>> map_shards(_double, {"x": list(range(5))}, merge=lambda parts, t: sum(parts, []), rng=0, shards=2)
[0, 2, 4, 6, 8]
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import add_note
from .executors import in_process, n_workers, resolve, resolve_executor

__all__ = ["STREAM_KEY", "map_shards", "root_seed", "row_streams", "shard_ranges"]

#: the first word of every row stream's spawn key (keeps these streams apart from the children that
#: the single-process paths spawn from the same seed)
STREAM_KEY = 0x5EED5


def root_seed(rng: int | np.random.Generator | np.random.SeedSequence | None) -> int | list[int]:
    """The entropy every row stream is derived from: an int seed as it is, a SeedSequence's own
    entropy, 128 bits drawn from a Generator, fresh OS entropy for None."""
    if isinstance(rng, (bool, np.bool_)):
        raise TypeError("rng must be an int seed, a numpy Generator, a SeedSequence or None, got bool")
    if isinstance(rng, (int, np.integer)):
        if rng < 0:
            raise ValueError(f"rng seed must be a non-negative integer, got {rng}")
        return int(rng)
    if isinstance(rng, np.random.SeedSequence):
        if rng.spawn_key:
            return [*np.asarray(rng.generate_state(4), dtype=np.uint64).tolist()]
        return rng.entropy
    if isinstance(rng, np.random.Generator):
        return [int(x) for x in rng.integers(0, 2**32, size=4, dtype=np.uint64)]
    if rng is None:
        return np.random.SeedSequence().entropy
    raise TypeError(f"rng must be an int seed, a numpy Generator, a SeedSequence or None, got {type(rng).__name__}")


def row_streams(seed: Any, n: int, start: int = 0) -> list[np.random.SeedSequence]:
    """The SeedSequences of streams ``start .. start + n - 1`` derived from ``seed`` (see :func:`root_seed`)."""
    entropy = seed if isinstance(seed, list) else root_seed(seed)
    return [np.random.SeedSequence(entropy, spawn_key=(STREAM_KEY, i)) for i in range(start, start + n)]


def shard_ranges(n_units: int, shards: int) -> list[tuple[int, int]]:
    """``min(shards, n_units)`` contiguous ``(start, stop)`` ranges covering ``0 .. n_units``, sizes within one."""
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"shards must be an int >= 1, got {shards!r}")
    s = max(1, min(int(shards), n_units))
    cuts = [n_units * i // s for i in range(s + 1)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _run_shard(block_fn: Callable, columns: dict, fixed: dict, streams: list, rows_per_stream: int,
               shard: int, first_row: int) -> list:
    """On a worker: one batched run per stream of this shard, in order (the notes name the shard and row)."""
    fixed = {k: resolve(v) for k, v in fixed.items()}  # per-worker factories are built here, once per process
    n = len(next(iter(columns.values())))
    out = []
    for j, ss in enumerate(streams):
        a, b = j * rows_per_stream, min(n, (j + 1) * rows_per_stream)
        block = {k: v[a:b] for k, v in columns.items()}
        try:
            out.append(block_fn(rng=np.random.default_rng(ss), **fixed, **block))
        except BaseException as err:
            rows = f"row {first_row + a}" if b - a == 1 else f"rows {first_row + a}..{first_row + b - 1}"
            add_note(err, f"speculate.distributed: raised in shard {shard} at {rows} "
                          f"(stream {first_row // rows_per_stream + j})")
            raise
    return out


def map_shards(
    block_fn: Callable[..., Any],
    columns: Mapping[str, Any],
    *,
    merge: Callable[[list, float], Any],
    fixed: Mapping[str, Any] | None = None,
    rng: Any = None,
    executor: Any = None,
    shards: int | None = None,
    rows_per_stream: int = 1,
) -> Any:
    """Run ``block_fn`` over the rows of ``columns``, one call per stream, spread over shards.

    ``columns``: per-row inputs, each a sequence (list, array) of the same length B; a call gets
    ``rows_per_stream`` consecutive rows of each (as slices), ``rng=`` the stream's Generator and
    ``fixed`` (the same for every row; :class:`~speculate.distributed.PerWorker` values are built
    once per worker process). ``executor``: None (run the shards here, in order), any
    ``concurrent.futures.Executor`` (a Dask ``Client.get_executor()``, a ``ProcessPoolExecutor``),
    a Dask ``Client``, ``"ray"`` or a :class:`~speculate.distributed.RayExecutor`. ``shards``:
    how many tasks (default: one per worker, at most one per stream). ``merge(parts, seconds)``
    gets the per-stream results in row order and the wall time of the whole run.

    Each shard crosses the network twice: its inputs once, its results once; nothing per round.
    An exception inside a shard propagates with notes naming the shard and the row.
    """
    t0 = time.perf_counter()
    if isinstance(rows_per_stream, bool) or not isinstance(rows_per_stream, (int, np.integer)) or rows_per_stream < 1:
        raise ValueError(f"rows_per_stream must be an int >= 1, got {rows_per_stream!r}")
    cols = dict(columns)
    if not cols:
        raise ValueError("map_shards needs at least one per-row column")
    lengths = {k: len(v) for k, v in cols.items()}
    B = next(iter(lengths.values()))
    if len(set(lengths.values())) != 1:
        raise ValueError(f"per-row inputs have different lengths: {lengths}")
    if B == 0:
        return merge([], time.perf_counter() - t0)
    fixed = dict(fixed or {})
    n_streams = -(-B // rows_per_stream)
    streams = row_streams(root_seed(rng), n_streams)
    ex = resolve_executor(executor)
    if shards is None:
        shards = 1 if ex is None else n_workers(ex)
    tasks = []
    for s, (a, b) in enumerate(shard_ranges(n_streams, shards)):
        ra, rb = a * rows_per_stream, min(B, b * rows_per_stream)
        part = {k: v[ra:rb] for k, v in cols.items()}
        tasks.append((s, ra, rb, (block_fn, part, fixed, streams[a:b], rows_per_stream, s, ra)))
    results: list = []
    if ex is None:
        for _, _, _, args in tasks:
            results.extend(in_process(_run_shard, *args))
        return merge(results, time.perf_counter() - t0)
    futures = [(s, ra, rb, ex.submit(_run_shard, *args)) for s, ra, rb, args in tasks]
    try:
        for s, ra, rb, fut in futures:
            try:
                results.extend(fut.result())
            except BaseException as err:
                add_note(err, f"speculate.distributed: shard {s} of {len(futures)} (rows {ra}..{rb - 1}) failed")
                raise
    finally:
        for *_, fut in futures:
            fut.cancel()
    return merge(results, time.perf_counter() - t0)


def _double(rng: np.random.Generator, x: list) -> list:  # for the module's example
    return [2 * v for v in x]
