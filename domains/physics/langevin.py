"""The overdamped Langevin model, its Euler-Maruyama chain, and the helpers both samplers share.

One Euler-Maruyama step of overdamped Langevin (Brownian) dynamics is the Gaussian transition

    x' ~ Normal(x + dt F(x) / gamma, scale = sqrt(2 kT dt / gamma))   (coordinates independent)

``simulate`` (``api.py``) samples this chain step by step with the exact force: one force call per
step (all replicas of a batch in that one call). ``speculative_simulate`` (``api.py``, running the
Process of ``process.py``) samples the SAME chain, exactly, with fewer sequential force calls. Both
are exact for the discretised chain, not for the continuous-time SDE: the Euler-Maruyama chain has
an O(dt) bias of its own, which speculation neither adds to nor removes.

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, simulate
    >>> model = Langevin(force=DoubleWell(), dt=1e-2)
    >>> sim = simulate(model, np.zeros((1, 1)), n_steps=100, rng=0)
    >>> sim.positions.shape, sim.stats.target_calls
    ((101, 1, 1), 100)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .drafts import Draft, as_draft
from .forces import ForceFn, to_numpy

DraftSpec = ForceFn | str | Draft
"""What ``Langevin(draft_force=...)`` accepts: a force function, ``"frozen"`` or ``frozen_correction(f)``."""


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
            ``frozen_correction(cheap)``. Only ``speculative_simulate`` uses it; ``draft`` holds
            it as one of the draft classes of ``drafts.py``.
        dt: time step (> 0). kT: temperature in energy units (> 0). gamma: friction (> 0). Real
            numbers (stored as Python floats); dt / gamma and the noise scale must be positive
            finite floats too (ValueError when they overflow or underflow).

    Example:
        >>> from speculate.domains.physics import DoubleWell, Langevin
        >>> model = Langevin(force=DoubleWell(), dt=0.02, kT=0.5)
        >>> model.noise_scale, type(model.draft).__name__
        (0.1414213562373095, 'FrozenDraft')
    """

    force: ForceFn
    draft_force: DraftSpec = "frozen"
    dt: float = 1e-3
    kT: float = 1.0
    gamma: float = 1.0
    draft: Draft = field(init=False, repr=False, compare=False)  #: draft_force as a draft object
    #: ``lookahead="auto"``'s controls, kept across runs of this model (one per batch width and
    #: max_lookahead): what they measured (acceptance, costs) is the past of the next run
    controls: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not callable(self.force):
            raise TypeError(f"Langevin: force must be callable, got {type(self.force).__name__}")
        object.__setattr__(self, "draft", as_draft(self.draft_force))
        for name in ("dt", "kT", "gamma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"Langevin: {name} must be a real number, got {type(v).__name__}")
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"Langevin: {name} must be finite and > 0, got {v}")
            object.__setattr__(self, name, float(v))  # Python floats: no float16 arithmetic below
        drift, scale = self.dt / self.gamma, self.noise_scale
        for what, v in (("dt / gamma", drift), ("the noise scale sqrt(2 kT dt / gamma)", scale)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(
                    f"Langevin: {what} = {v} for dt={self.dt}, kT={self.kT}, gamma={self.gamma} is not a "
                    "positive finite float64 (it overflows or underflows): rescale the units"
                )

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


def check_x0(x0: Any) -> tuple[np.ndarray, bool]:
    """x0 [N, d] or [B, N, d] of real numbers -> (float64 [B, N, d] copy, batched?)."""
    X = np.array(to_numpy(x0, who="x0"), dtype=np.float64)  # a copy
    if X.ndim not in (2, 3) or X.size == 0:
        raise ValueError(
            f"x0 must have shape [N, d] or [B, N, d] with at least one replica, particle and "
            f"coordinate, got shape {X.shape}"
        )
    if not np.isfinite(X).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(X))[0])
        raise ValueError(f"x0 contains non-finite values (first at index {bad}: {X[bad]})")
    batched = X.ndim == 3
    return (X if batched else X[None]), batched


MAX_STEPS = 2**62
"""The largest n_steps (step counters are int64)."""


def check_steps(n_steps: Any, record_every: Any) -> None:
    for name, v, lo in (("n_steps", n_steps, 0), ("record_every", record_every, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= MAX_STEPS:
            raise ValueError(f"{name} must be an integer in {lo}..2**62, got {v!r}")


class Recorder:
    """Keeps every ``record_every``-th configuration of B rows advancing at different speeds."""

    def __init__(self, X0: np.ndarray, n_steps: int, record_every: int):
        B, N, d = X0.shape
        self.every = int(record_every)
        self.T = int(n_steps) // self.every + 1
        try:
            self.positions = np.empty((B, self.T, N, d), dtype=np.float64)
        except (MemoryError, ValueError):
            gib = 8.0 * B * self.T * N * d / 2**30
            raise ValueError(
                f"the recorded positions [B, T, N, d] = [{B}, {self.T}, {N}, {d}] would need {gib:.3g} GiB: "
                f"record fewer configurations (record_every > {self.every}) or simulate fewer steps"
            ) from None
        self.positions[:, 0] = X0
        self.steps = np.arange(self.T, dtype=np.int64) * record_every

    def due(self, steps: np.ndarray, n: np.ndarray) -> dict[int, np.ndarray]:
        """The steps j of a stretch of ``n[i]`` steps from ``steps[i]`` after which rows are recorded
        (``steps[i] + j + 1`` a multiple of ``every``), each with those rows (indices into ``steps``)."""
        first = (-(steps + 1)) % self.every  # [R] the first j at which each row is recorded
        due: dict[int, list[int]] = {}
        for i in range(len(steps)):
            for j in range(int(first[i]), int(n[i]), self.every):
                due.setdefault(j, []).append(i)
        return {j: np.array(v, np.int64) for j, v in due.items()}

    def record_block(
        self, rows: np.ndarray, steps: np.ndarray, E: np.ndarray, n: np.ndarray
    ) -> None:
        """E [R, K, N, d]: row rows[i] took configurations E[i, :n[i]] at steps steps[i]+1 ...."""
        j = np.arange(E.shape[1])[None, :]                          # [1, K]
        s = steps[:, None] + 1 + j                                  # [R, K] step of E[i, j]
        keep = (j < n[:, None]) & (s % self.every == 0)
        i, jj = np.nonzero(keep)
        self.positions[rows[i], s[i, jj] // self.every] = E[i, jj]
