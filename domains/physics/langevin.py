"""The overdamped Langevin model, its Euler-Maruyama chain, and plain (sequential) simulation.

One Euler-Maruyama step of overdamped Langevin (Brownian) dynamics is the Gaussian transition

    x' ~ Normal(x + dt F(x) / gamma, scale = sqrt(2 kT dt / gamma))   (coordinates independent)

``simulate`` samples this chain step by step with the exact force: one force call per step (all
replicas of a batch in that one call). ``speculative_simulate`` (in ``speculative.py``) samples the
SAME chain, exactly, with fewer sequential force calls. Both are exact for the discretised chain,
not for the continuous-time SDE: the Euler-Maruyama chain has an O(dt) bias of its own, which
speculation neither adds to nor removes.

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> model = Langevin(force=DoubleWell(), dt=1e-2)
    >>> traj = simulate(model, np.zeros((1, 1)), n_steps=100, seed=0)
    >>> traj.positions.shape, traj.stats.target_calls
    ((101, 1, 1), 100)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ForceFn = Callable[[np.ndarray], Any]
"""force(X[B, N, d]) -> forces [B, N, d] (NumPy array or torch tensor), one call for the batch."""


@dataclass(frozen=True)
class FrozenCorrection:
    """A cheap force plus a frozen correction: ``draft(x) + F(x_ref) - draft(x_ref)``.

    ``x_ref`` is the last configuration whose exact force is known (scored by the previous round),
    so the correction costs no extra call of the exact force. This is the multiple-time-step
    (RESPA) idea as a draft: the cheap short-range part moves with the particles, the expensive
    long-range remainder is frozen for the k drafted steps. Build it with ``frozen_correction``.
    """

    draft: ForceFn


def frozen_correction(draft: ForceFn) -> FrozenCorrection:
    """Draft with ``draft(x) + F(x_ref) - draft(x_ref)``, x_ref the last verified configuration.

    Example:
        >>> from speculate.domains.physics import DoubleWell, Langevin, frozen_correction
        >>> model = Langevin(force=DoubleWell(), draft_force=frozen_correction(DoubleWell(2.0)))
        >>> type(model.draft_force).__name__
        'FrozenCorrection'
    """
    if not callable(draft):
        raise TypeError(f"frozen_correction: draft must be callable, got {type(draft).__name__}")
    return FrozenCorrection(draft)


DraftSpec = ForceFn | str | FrozenCorrection


@dataclass(frozen=True)
class Langevin:
    """Overdamped Langevin dynamics discretised with Euler-Maruyama.

    Args:
        force: the exact (expensive) force, ``force(X[B, N, d]) -> [B, N, d]``; it must be a
            deterministic function of each configuration (the same configuration gives the same
            force whatever else is in the batch).
        draft_force: the cheap force used to draft steps ahead: a function with the same
            signature, ``"frozen"`` (the exact force of the last verified configuration, held
            constant over the drafted steps: no training, no extra call), or
            ``frozen_correction(cheap)``. Only ``speculative_simulate`` uses it.
        dt: time step (> 0). kT: temperature in energy units (> 0). gamma: friction (> 0).

    Example:
        >>> from speculate.domains.physics import DoubleWell, Langevin
        >>> Langevin(force=DoubleWell(), dt=0.02, kT=0.5).noise_scale
        0.1414213562373095
    """

    force: ForceFn
    draft_force: DraftSpec = "frozen"
    dt: float = 1e-3
    kT: float = 1.0
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if not callable(self.force):
            raise TypeError(f"Langevin: force must be callable, got {type(self.force).__name__}")
        d = self.draft_force
        if not (callable(d) or isinstance(d, FrozenCorrection) or d == "frozen"):
            raise ValueError(
                "Langevin: draft_force must be a callable, 'frozen' or frozen_correction(f), "
                f"got {d!r}"
            )
        for name in ("dt", "kT", "gamma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"Langevin: {name} must be a real number, got {type(v).__name__}")
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"Langevin: {name} must be finite and > 0, got {v}")

    @property
    def noise_scale(self) -> float:
        """Standard deviation of every coordinate of one step: sqrt(2 kT dt / gamma)."""
        return math.sqrt(2.0 * self.kT * self.dt / self.gamma)

    def mean(self, X: np.ndarray, F: np.ndarray) -> np.ndarray:
        """Mean of the next configuration: X + dt F / gamma (shapes broadcast)."""
        return X + (self.dt / self.gamma) * F

    def delta(self, F_draft: np.ndarray, F: np.ndarray) -> np.ndarray:
        """Distance between draft and target means in noise units, per configuration.

        delta = sqrt(dt / (2 gamma kT)) |F_draft - F| over all N*d coordinates; reflection
        coupling keeps the draft with probability 2 Phi(-delta / 2).
        """
        diff = np.asarray(F_draft, np.float64) - np.asarray(F, np.float64)
        nrm = np.sqrt(np.sum(diff.reshape(*diff.shape[:-2], -1) ** 2, axis=-1))
        return math.sqrt(self.dt / (2.0 * self.gamma * self.kT)) * nrm


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):             # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def evaluate_force(
    fn: ForceFn, X: np.ndarray, *, who: str, steps: np.ndarray | int, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Call ``fn(X[B, N, d])`` once; check its shape; return (forces [B, N, d], finite [B]).

    ``steps[b]`` is the step of the chain that configuration b belongs to and ``rows[b]`` its row:
    both only name the problem in error messages. Finiteness is returned, not raised, because a
    non-finite force at a drafted configuration that is never reached must not stop the run.
    """
    out = fn(X)
    F = _to_numpy(out)
    if F.shape != X.shape:
        raise ValueError(
            f"{who} returned shape {tuple(F.shape)} for configurations of shape {tuple(X.shape)} "
            "(expected the same shape [B, N, d])"
        )
    finite = np.isfinite(F).reshape(F.shape[0], -1).all(axis=1)         # [B]
    return F, finite


def nonfinite_error(who: str, F: np.ndarray, b: int, step: int, row: int | None) -> ValueError:
    """A ValueError naming the step, row and first bad particle of a non-finite force."""
    bad = np.argwhere(~np.isfinite(F[b]))[0]
    where = f"row {row}, " if row is not None else ""
    return ValueError(
        f"{who} is not finite at step {step} ({where}particle {bad[0]}, coordinate {bad[1]}: "
        f"{F[b][tuple(bad)]}); the configuration has left the region where the force is defined"
    )


def check_x0(x0: Any) -> tuple[np.ndarray, bool]:
    """x0 [N, d] or [B, N, d] -> (float64 [B, N, d] copy, batched?)."""
    X = _to_numpy(x0).copy()
    if X.ndim not in (2, 3) or X.size == 0:
        raise ValueError(f"x0 must have shape [N, d] or [B, N, d] (non-empty), got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("x0 contains non-finite values")
    batched = X.ndim == 3
    return (X if batched else X[None]), batched


def check_steps(n_steps: Any, record_every: Any) -> None:
    for name, v, lo in (("n_steps", n_steps, 0), ("record_every", record_every, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


@dataclass
class SimulationStats:
    """Counters of one run.

    ``target_calls`` counts calls of the exact force (each call may hold many configurations);
    ``calls_per_step`` = target_calls / steps is the sequential depth per simulated step;
    ``acceptance_rate`` = accepted / proposed drafted steps; ``accepted_per_position[j]`` counts
    (row, round) pairs that kept exactly j drafts; ``draft_truncations`` counts drafts cut short
    by a non-finite draft force; ``core`` holds speculate.rounds.Stats of a speculative run.
    """

    steps: int = 0
    target_calls: int = 0
    target_configurations: int = 0
    draft_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    target_time: float = 0.0
    draft_time: float = 0.0
    wall_time: float = 0.0
    accepted_per_position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    draft_truncations: int = 0
    lookahead_counts: dict = field(default_factory=dict)
    core: Any = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def calls_per_step(self) -> float:
        return self.target_calls / self.steps if self.steps else float("nan")

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall_time if self.wall_time > 0 else float("nan")


@dataclass
class Trajectory:
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


class Recorder:
    """Keeps every ``record_every``-th configuration of B rows advancing at different speeds."""

    def __init__(self, X0: np.ndarray, n_steps: int, record_every: int):
        B, N, d = X0.shape
        self.every = record_every
        self.T = n_steps // record_every + 1
        self.positions = np.empty((B, self.T, N, d), dtype=np.float64)
        self.positions[:, 0] = X0
        self.steps = np.arange(self.T, dtype=np.int64) * record_every

    def record_block(
        self, rows: np.ndarray, steps: np.ndarray, E: np.ndarray, n: np.ndarray
    ) -> None:
        """E [R, K, N, d]: row rows[i] took configurations E[i, :n[i]] at steps steps[i]+1 ...."""
        j = np.arange(E.shape[1])[None, :]                          # [1, K]
        s = steps[:, None] + 1 + j                                  # [R, K] step of E[i, j]
        keep = (j < n[:, None]) & (s % self.every == 0)
        i, jj = np.nonzero(keep)
        self.positions[rows[i], s[i, jj] // self.every] = E[i, jj]

    def trajectory(self, final: np.ndarray, stats: SimulationStats, batched: bool) -> Trajectory:
        pos = self.positions if batched else self.positions[0]
        fin = final if batched else final[0]
        return Trajectory(positions=pos, steps=self.steps.copy(), final=fin, stats=stats)


def simulate(
    model: Langevin,
    x0: Any,
    n_steps: int,
    seed: int | np.random.Generator | None = 0,
    *,
    record_every: int = 1,
) -> Trajectory:
    """Plain Euler-Maruyama with the exact force: one force call per step for all replicas.

    Args:
        model: the Langevin model (its draft force is not used here).
        x0: initial configuration [N, d], or [B, N, d] for B independent replicas.
        n_steps: number of steps. seed: int seed or numpy Generator.
        record_every: keep every record_every-th configuration in ``positions``.

    Raises ValueError naming the step when the force is not finite or has the wrong shape.

    Example:
        >>> import numpy as np
        >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
        >>> traj = simulate(Langevin(force=DoubleWell(), dt=1e-2), np.zeros((4, 1, 1)), 10)
        >>> traj.positions.shape, traj.final.shape
        ((4, 11, 1, 1), (4, 1, 1))
    """
    if not isinstance(model, Langevin):
        raise TypeError(f"model must be a Langevin, got {type(model).__name__}")
    check_steps(n_steps, record_every)
    X, batched = check_x0(x0)
    rng = np.random.default_rng(seed)
    rec = Recorder(X, n_steps, record_every)
    stats = SimulationStats()
    scale = model.noise_scale
    t_start = time.perf_counter()
    for t in range(n_steps):
        t0 = time.perf_counter()
        F, finite = evaluate_force(model.force, X, who="force", steps=t)
        stats.target_time += time.perf_counter() - t0
        if not finite.all():
            b = int(np.argmin(finite))
            raise nonfinite_error("force", F, b, t, b if batched else None)
        X = model.mean(X, F) + scale * rng.standard_normal(X.shape)       # [B, N, d]
        if (t + 1) % record_every == 0:
            rec.positions[:, (t + 1) // record_every] = X
    stats.steps = n_steps
    stats.target_calls = n_steps
    stats.target_configurations = n_steps * X.shape[0]
    stats.wall_time = time.perf_counter() - t_start
    return rec.trajectory(X, stats, batched)
