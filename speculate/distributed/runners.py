"""The text domain's sharded run, until it moves into the text domain: ``generate_sharded``.

``SpeculativeGenerator.generate(executor=..., shards=...)`` delegates here: the prompts are cut into
streams and shards (:func:`~speculate.distributed.map_shards`), every stream's prompts are generated
on a worker with that stream's Generator, and the parts are merged in prompt order (the stats by
summing, :meth:`speculate.Stats.merge`). The text domain is imported lazily, only when it delegates
here. The other public APIs own their sharded runs (``speculate.chain.chains_sharded``,
``speculate.domains.rl.api.rollouts_sharded``, ``speculate.domains.physics.api.simulate_sharded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..stats import Stats
from .sharding import map_shards

__all__ = ["generate_sharded"]


def _generate_block(rng, prompts, generator, **kw):
    return generator.generate([list(p) for p in prompts], rng=rng, **kw)


def _generate_merge(parts: list, seconds: float):
    from speculate.domains.text import GenerationOutput

    return GenerationOutput(sequences=[s for p in parts for s in p.sequences],
                            prompt_lengths=[n for p in parts for n in p.prompt_lengths],
                            stats=Stats.merge(p.stats for p in parts),
                            prefill_time=sum(p.prefill_time for p in parts), wall_time=seconds)


def generate_sharded(generator, prompts: Sequence[Sequence[int]], *, executor=None, shards=None,
                     rows_per_stream=1, rng=0, **kw) -> Any:
    """``SpeculativeGenerator.generate`` on token-id prompts with one random stream per prompt.

    ``generator``: a ``SpeculativeGenerator`` (pickled with each shard) or a
    :class:`~speculate.distributed.PerWorker` that builds one (loaded once per worker).
    """
    prompts = [[int(t) for t in p] for p in prompts]
    return map_shards(_generate_block, {"prompts": prompts}, merge=_generate_merge,
                      fixed={"generator": generator, **kw}, rng=rng, executor=executor, shards=shards,
                      rows_per_stream=rows_per_stream)

