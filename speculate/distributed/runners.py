"""The sharded runs of the public APIs: what a domain's ``executor=`` / ``shards=`` hook delegates to.

Each runner cuts its rows into streams and shards (:func:`~speculate.distributed.map_shards`),
calls the domain's own single-process function on every stream's rows with that stream's
Generator, and merges the parts in row order (the stats by summing, :meth:`speculate.Stats.merge`).
The domains are imported lazily, only when a domain delegates here (``speculate`` itself never
imports a domain).

>>> import numpy as np, speculate as sp
>>> P = np.array([[0.9, 0.1], [0.2, 0.8]])
>>> out = chains_sharded(_two_state_target, _two_state_draft, _next_state, [0, 1, 0], 20, lookahead=3,
...                      rng=5, shards=2)
>>> same = chains_sharded(_two_state_target, _two_state_draft, _next_state, [0, 1, 0], 20, lookahead=3,
...                       rng=5, shards=3)
>>> out.samples == same.samples, [len(s) for s in out.samples], out.stats.rounds == same.stats.rounds
(True, [20, 20, 20], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..stats import Stats
from .sharding import map_shards

__all__ = ["chains_sharded", "generate_sharded", "rollouts_sharded", "simulate_sharded"]


# ----------------------------------------------------------------------------------------------
# chains


def _chains_block(rng, states, n, target, draft, step, **kw):
    from ..chain import chains

    return chains(target, draft, step, list(states), list(n), rng=rng, **kw)


def _chains_merge(parts: list, seconds: float):
    from ..chain import Trajectories

    return Trajectories([s for p in parts for s in p.samples], [s for p in parts for s in p.states],
                        Stats.merge(p.stats for p in parts))


def chains_sharded(target, draft, step, states, n, *, executor=None, shards=None, rows_per_stream=1, rng=None,
                   **kw) -> Any:
    """:func:`speculate.chains` with one random stream per chain (see :mod:`speculate.distributed`)."""
    states = list(states)
    ns = [n] * len(states) if isinstance(n, (int, np.integer)) else list(n)
    if len(ns) != len(states):
        raise ValueError(f"chains: n has {len(ns)} entries for {len(states)} chains")
    return map_shards(_chains_block, {"states": states, "n": ns}, merge=_chains_merge,
                      fixed={"target": target, "draft": draft, "step": step, **kw},
                      rng=rng, executor=executor, shards=shards, rows_per_stream=rows_per_stream)


# ----------------------------------------------------------------------------------------------
# RL rollouts


def _rollouts_block(rng, envs, policy, draft, **kw):
    from speculate.domains.rl import speculative_rollouts

    return speculative_rollouts(list(envs), policy if callable(policy) else list(policy),
                                draft if callable(draft) else list(draft), rng=rng, **kw)


def _rollouts_merge(parts: list, seconds: float):
    from speculate.domains.rl.api import Rollouts

    stats = Stats.merge(p.stats for p in parts)
    episodes = [e for p in parts for e in p.episodes]
    for e in episodes:
        e.stats = stats
    return Rollouts(episodes, stats)


def rollouts_sharded(envs, policy, draft, *, executor=None, shards=None, rows_per_stream=1, rng=0, **kw) -> Any:
    """``speculative_rollouts`` with one random stream per environment (reset seed, actions, uniforms)."""
    import gymnasium as gym

    if isinstance(envs, gym.vector.SyncVectorEnv):
        envs = list(envs.envs)
    if isinstance(envs, gym.Env):
        envs = [envs]
    envs = list(envs)
    if executor is not None and any(isinstance(e, gym.Env) for e in envs):
        raise TypeError("speculative_rollouts(executor=...): give env constructors (picklable callables such as "
                        "functools.partial(gymnasium.make, 'CartPole-v1')), not live environments: each worker "
                        "builds its own")
    cols: dict[str, Any] = {"envs": envs}
    fixed: dict[str, Any] = dict(kw)
    for name, value in (("policy", policy), ("draft", draft)):
        if not callable(value) and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != len(envs):
                raise ValueError(f"{name}: give one callable, or a sequence of {len(envs)} (one per environment)")
            cols[name] = list(value)
        else:
            fixed[name] = value
    return map_shards(_rollouts_block, cols, merge=_rollouts_merge, fixed=fixed, rng=rng, executor=executor,
                      shards=shards, rows_per_stream=rows_per_stream)


# ----------------------------------------------------------------------------------------------
# physics


def _simulate_block(rng, x0, model, n_steps, **kw):
    from speculate.domains.physics import speculative_simulate

    return speculative_simulate(model, np.asarray(x0), n_steps, rng=rng, **kw)


def _simulate_merge(parts: list, seconds: float):
    from speculate.domains.physics import Simulation, SimulationStats

    stats = SimulationStats.merge(p.stats for p in parts)
    stats.wall_time = seconds
    return Simulation(positions=np.concatenate([p.positions for p in parts]), steps=parts[0].steps.copy(),
                      final=np.concatenate([p.final for p in parts]), stats=stats)


def simulate_sharded(model, x0, n_steps, lookahead=8, rng=0, *, executor=None, shards=None, rows_per_stream=1,
                     **kw) -> Any:
    """``speculative_simulate`` with one random stream per replica (x0 ``[B, N, d]``; ``[N, d]`` is one replica)."""
    from speculate.domains.physics import Simulation

    X = np.asarray(x0)
    single = X.ndim == 2
    out = map_shards(_simulate_block, {"x0": X[None] if single else X}, merge=_simulate_merge,
                     fixed={"model": model, "n_steps": n_steps, "lookahead": lookahead, **kw}, rng=rng,
                     executor=executor, shards=shards, rows_per_stream=rows_per_stream)
    if single:
        return Simulation(positions=out.positions[0], steps=out.steps, final=out.final[0], stats=out.stats)
    return out


# ----------------------------------------------------------------------------------------------
# text


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


# the module example's chain (module level: picklable by reference)
_P = np.array([[0.9, 0.1], [0.2, 0.8]])
_Q = np.array([[0.8, 0.2], [0.3, 0.7]])


def _two_state_target(states):
    from ..distributions import Categorical

    return Categorical(probs=_P[np.array(states)])


def _two_state_draft(s):
    from ..distributions import Categorical

    return Categorical(probs=_Q[s])


def _next_state(s, x):
    return x
