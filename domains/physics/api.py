"""The public functions of the physics domain: plain and speculative simulation, their result.

- :func:`simulate`: plain Euler-Maruyama with the exact force, one force call per step;
- :func:`speculative_simulate`: the same chain, exactly, with fewer sequential force calls (the
  :class:`~speculate.domains.physics.process.LangevinProcess` on the core round loop);
- :class:`Simulation`: the recorded configurations and the :class:`SimulationStats` of a run
  (``speculate.Stats`` plus the counters of a simulation).

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate, speculative_simulate
    >>> model = Langevin(force=DoubleWell(), draft_force=DoubleWell(tilt=0.5), dt=1e-2)
    >>> plain = simulate(model, np.zeros((2, 1, 1)), 20, rng=0)
    >>> fast = speculative_simulate(model, np.zeros((2, 1, 1)), 20, lookahead=4, rng=0)
    >>> plain.positions.shape == fast.positions.shape, plain.stats.calls_per_step, fast.stats.calls_per_step < 1
    (True, 1.0, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from speculate.domains.shared.gaussian_drift import check_cost_ratio, check_lookahead, is_int

from speculate.distributed.sharding import map_shards
from speculate.errors import add_note
from speculate.rng import as_rng
from speculate.rounds import Lookahead, run

from .forces import evaluate_force, nonfinite_error, overflow_error, transition_means
from .langevin import Langevin, Recorder, check_steps, check_x0
from .process import LangevinProcess, SimulationStats

__all__ = ["Simulation", "SimulationStats", "simulate", "simulate_sharded", "speculative_simulate"]


@dataclass
class Simulation:
    """A simulated trajectory.

    positions: [T, N, d] ([B, T, N, d] when x0 had a batch axis), the configurations at ``steps``
    (every ``record_every``-th step, starting with x0 at step 0). final: the last configuration,
    [N, d] or [B, N, d]. Positions are never wrapped into a periodic box (forces apply the
    minimum image themselves), so displacements and diffusion can be read off directly.
    """

    positions: np.ndarray
    steps: np.ndarray
    final: np.ndarray
    stats: SimulationStats


def _simulation(rec: Recorder, final: np.ndarray, stats: SimulationStats, batched: bool) -> Simulation:
    pos = rec.positions if batched else rec.positions[0]
    fin = final if batched else final[0]
    return Simulation(positions=pos, steps=rec.steps.copy(), final=fin, stats=stats)


def _check_lookahead(lookahead: Any, max_lookahead: Any, cost_ratio: Any) -> None:
    """The round loop's arguments, checked before anything is allocated or computed."""
    check_lookahead(lookahead)
    if not is_int(max_lookahead):
        raise TypeError(f"max_lookahead must be an int >= 1, got {max_lookahead!r}")
    if max_lookahead < 1:
        raise ValueError(f"max_lookahead must be an int >= 1, got {max_lookahead}")
    check_cost_ratio(cost_ratio)


def simulate(
    model: Langevin,
    x0: Any,
    n_steps: int,
    rng: int | np.random.Generator | None = 0,
    *,
    record_every: int = 1,
) -> Simulation:
    """Plain Euler-Maruyama with the exact force: one force call per step for all replicas.

    Args:
        model: the Langevin model (its draft force is not used here).
        x0: initial configuration [N, d], or [B, N, d] for B independent replicas.
        n_steps: number of steps. rng: int seed, numpy Generator, or None (unpredictable).
        record_every: keep every record_every-th configuration in ``positions``.

    Raises ValueError naming the step when the force is not finite or has the wrong shape, or when
    the mean x + dt F / gamma overflows (beyond ``forces.MEAN_LIMIT``); an exception raised inside
    (the force's own, KeyboardInterrupt) carries a note naming the step.

    Example:
        >>> import numpy as np
        >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
        >>> sim = simulate(Langevin(force=DoubleWell(), dt=1e-2), np.zeros((4, 1, 1)), 10)
        >>> sim.positions.shape, sim.final.shape
        ((4, 11, 1, 1), (4, 1, 1))
    """
    if not isinstance(model, Langevin):
        raise TypeError(f"model must be a Langevin, got {type(model).__name__}")
    check_steps(n_steps, record_every)
    X, batched = check_x0(x0)
    rng = as_rng(rng)
    rec = Recorder(X, n_steps, record_every)
    stats = SimulationStats()
    scale = model.noise_scale
    t_start = time.perf_counter()
    t = 0
    try:
        for t in range(n_steps):
            t0 = time.perf_counter()
            F, finite = evaluate_force(model.force, X, who="force", steps=t)
            stats.target_time += time.perf_counter() - t0
            if not finite.all():
                b = int(np.argmin(finite))
                raise nonfinite_error("force", F, b, t, b if batched else None)
            M, ok = transition_means(model, X, F)
            if not ok.all():
                b = int(np.argmin(ok))
                raise overflow_error(M, b, t, b if batched else None)
            X = M + scale * rng.standard_normal(X.shape)  # [B, N, d]
            if (t + 1) % record_every == 0:
                rec.positions[:, (t + 1) // record_every] = X
    except BaseException as err:  # KeyboardInterrupt too: say where it stopped, then let it go
        add_note(err, f"speculate.domains.physics.simulate: raised in step {t} of {n_steps} "
                      f"(the force call on all {X.shape[0]} rows)")
        raise
    B = X.shape[0]
    stats.steps = stats.rounds = stats.target_calls = n_steps  # a round without drafts per step
    stats.row_rounds = stats.emitted = n_steps * B
    stats.accepted_per_position[0] = n_steps * B
    if n_steps:
        stats.lookahead_counts[0] = n_steps
    stats.target_configurations = n_steps * B
    stats.wall_time = time.perf_counter() - t_start
    return _simulation(rec, X, stats, batched)


def _simulate_block(rng, x0, model, n_steps, **kw):
    return speculative_simulate(model, np.asarray(x0), n_steps, rng=rng, **kw)


def _simulate_merge(parts: list, seconds: float) -> Simulation:
    stats = SimulationStats.merge(p.stats for p in parts)
    stats.wall_time = seconds
    return Simulation(positions=np.concatenate([p.positions for p in parts]), steps=parts[0].steps.copy(),
                      final=np.concatenate([p.final for p in parts]), stats=stats)


def simulate_sharded(model, x0, n_steps, lookahead=8, rng=0, *, executor=None, shards=None, rows_per_stream=1,
                     **kw) -> Simulation:
    """:func:`speculative_simulate` with one random stream per replica (x0 ``[B, N, d]``; ``[N, d]`` is
    one replica): what ``speculative_simulate(executor=..., shards=...)`` runs. Each stream's replicas
    run :func:`speculative_simulate` on a worker (``speculate.distributed.map_shards``); the
    trajectories are merged in replica order, the stats summed."""
    X = np.asarray(x0)
    single = X.ndim == 2
    out = map_shards(_simulate_block, {"x0": X[None] if single else X}, merge=_simulate_merge,
                     fixed={"model": model, "n_steps": n_steps, "lookahead": lookahead, **kw}, rng=rng,
                     executor=executor, shards=shards, rows_per_stream=rows_per_stream)
    if single:
        return Simulation(positions=out.positions[0], steps=out.steps, final=out.final[0], stats=out.stats)
    return out


def speculative_simulate(
    model: Langevin,
    x0: Any,
    n_steps: int,
    lookahead: int | str = 8,
    rng: int | np.random.Generator | None = 0,
    *,
    record_every: int = 1,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    executor: Any = None,
    shards: int | None = None,
    rows_per_stream: int = 1,
) -> Simulation:
    """Simulate the Euler-Maruyama chain of ``model`` exactly, drafting ``lookahead`` steps ahead.

    The returned simulation has the same law as ``simulate(model, x0, n_steps)`` (exact for the
    discretised chain), with ``stats.target_calls`` sequential calls of the exact force instead of
    n_steps; each call scores up to B (lookahead+1) configurations.

    Args:
        model: Langevin(force, draft_force, dt, kT, gamma).
        x0: initial configuration [N, d], or [B, N, d] for B replicas advanced together.
        n_steps: steps per replica. lookahead: drafted steps per round, or "auto" (chosen online
            from the measured acceptance and costs, up to ``max_lookahead``; 0 runs plain steps; what
            it measured is kept in ``model.controls`` and continued by the model's next run of the
            same batch width, so many short runs measure once).
        rng: int seed, numpy Generator, or None (unpredictable). record_every: keep every
            record_every-th configuration.
        cost_ratio: with lookahead="auto", a fixed draft/target cost ratio c instead of the
            measured one (the run then depends on the seed alone, not on timings).
        executor, shards, rows_per_stream: (``executor`` or ``shards`` given) the seed-stable sharded
            run of :mod:`speculate.distributed`: every replica its own random stream, the same
            trajectories for any executor and shard count; ``stats`` summed over the shards.

    Raises ValueError naming the step when the exact force is not finite, or the mean
    x + dt F / gamma overflows, at a configuration the chain reaches (the same step as
    ``simulate``; at a drafted configuration that is never reached it is harmless: the draft is
    cut there), and ValueError / TypeError when a force returns the wrong shape or something that
    is not real numbers, or when an argument is bad (before any work). An exception raised inside
    (a force's own, KeyboardInterrupt) carries the round loop's note naming the phase and round.

    Example:
        >>> import numpy as np
        >>> from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate
        >>> model = Langevin(force=DoubleWell(), draft_force=DoubleWell(tilt=3.0), dt=1e-2)
        >>> sim = speculative_simulate(model, np.zeros((3, 1, 1)), 50, lookahead=4, rng=1)
        >>> sim.positions.shape, 0.5 < sim.stats.acceptance_rate < 1
        ((3, 51, 1, 1), True)
    """
    if executor is not None or shards is not None:
        return simulate_sharded(model, x0, n_steps, lookahead, rng, executor=executor, shards=shards,
                                rows_per_stream=rows_per_stream, record_every=record_every,
                                max_lookahead=max_lookahead, cost_ratio=cost_ratio)
    if not isinstance(model, Langevin):
        raise TypeError(f"model must be a Langevin, got {type(model).__name__}")
    check_steps(n_steps, record_every)
    _check_lookahead(lookahead, max_lookahead, cost_ratio)
    X, batched = check_x0(x0)
    rec = Recorder(X, n_steps, record_every)
    stats = SimulationStats(steps=n_steps)
    process = LangevinProcess(model, X, rec, stats, keep_outcomes=False)  # the recorder keeps them
    t0 = time.perf_counter()
    control = Lookahead.kept(model.controls, lookahead, max_lookahead, cost_ratio, X.shape[0])
    run(process, X.shape[0], n_steps, lookahead=lookahead, verify="token", rng=rng,
        max_lookahead=max_lookahead, cost_ratio=cost_ratio, keep_samples=False, stats=stats, control=control)
    stats.wall_time = time.perf_counter() - t0
    return _simulation(rec, process.X, stats, batched)
