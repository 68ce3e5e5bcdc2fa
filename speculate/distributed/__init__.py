"""Beyond one machine: chains, rollouts, simulations and batch generation on Dask and Ray.

``speculate.chains``, ``speculative_rollouts``, ``speculative_simulate`` and
``SpeculativeGenerator.generate`` take ``executor=`` (any ``concurrent.futures.Executor``: a Dask
``Client.get_executor()``, a ``ProcessPoolExecutor``; a Dask ``Client``; ``"ray"`` or a
:class:`RayExecutor`), ``shards=`` and ``rows_per_stream=``. Given any of ``executor`` / ``shards``,
the rows are split into shards, each shard runs the batched round loop on a worker, and the results
and the stats (summed) are merged in row order. Every row draws from its own random stream derived
from the one seed (:func:`row_streams`), so the samples do not depend on the engine, the number of
workers or the shard layout. No scheduler of our own: the engine schedules, and re-runs a shard
whose worker died (Dask on worker loss, Ray with ``max_retries``).

>>> import numpy as np, speculate as sp
>>> from concurrent.futures import ThreadPoolExecutor
>>> P = np.array([[0.9, 0.1], [0.2, 0.8]])
>>> target = lambda states: sp.Categorical(probs=P[np.array(states)])
>>> draft = lambda s: sp.Categorical(probs=[[0.8, 0.2], [0.3, 0.7]][s])
>>> here = sp.chains(target, draft, lambda s, x: x, [0] * 6, 30, rng=1, shards=1)   # one process
>>> with ThreadPoolExecutor(2) as ex:
...     there = sp.chains(target, draft, lambda s, x: x, [0] * 6, 30, rng=1, executor=ex, shards=3)
>>> here.samples == there.samples, here.stats.accepted == there.stats.accepted
(True, True)

With Dask (``pip install "speculate[distributed]"``)::

    from dask.distributed import Client, LocalCluster
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    out = speculative_rollouts(env_fns, PerWorker(load_policy), PerWorker(load_draft), rng=0,
                               executor=client.get_executor())

With Ray: ``ray.init()``, then ``executor="ray"`` (or ``RayExecutor(max_retries=3, num_gpus=1)``);
for a dataset of prompts, ``ds.map_batches(speculate.domains.text.SpeculativeTextBatches, ...)``.

This package is the generic machinery (:mod:`.sharding`, :mod:`.executors`); each public API owns its
sharded run on top of :func:`map_shards`: ``speculate.chain.chains_sharded``,
``speculate.domains.rl.api.rollouts_sharded``, ``speculate.domains.physics.api.simulate_sharded``,
``speculate.domains.text.generate_sharded`` (and the text domain's ``SpeculativeTextBatches``). This
package names no domain.
"""

from .executors import PerWorker, RayExecutor, n_workers, resolve_executor
from .sharding import STREAM_KEY, map_shards, root_seed, row_streams, shard_ranges

__all__ = [
    "STREAM_KEY",
    "PerWorker",
    "RayExecutor",
    "map_shards",
    "n_workers",
    "resolve_executor",
    "root_seed",
    "row_streams",
    "shard_ranges",
]

