"""The kinds of draft of the diffusion domain: how k denoising steps are drafted ahead.

``speculative_sample(draft=...)`` accepts a denoiser, ``"frozen"``, ``"frozen-x0"``,
``frozen_correction(cheap)`` or a :class:`Draft`; :func:`as_draft` (the one place that reads that
argument) turns it into one of three classes:

- :class:`DenoiserDraft` (a denoiser): a smaller denoiser, called once per drafted step on the rows
  that still draft (batched over rows, each at its own time);
- :class:`FrozenDraft` (``"frozen"``): the target's eps at the last state a previous round scored
  and the row moved on from, held constant over the k steps (De Bortoli et al.'s training-free
  draft): no network call at all, the k steps of all rows vectorised. ``"frozen-x0"`` holds the
  target's x_0 prediction instead (its eps then moves with x: eps = (x - sqrt(ab) x0) / sqrt(1 - ab));
- :class:`FrozenCorrection` (``frozen_correction(cheap)``): ``eps_cheap(x, t) + eps(x_ref, t_ref) -
  eps_cheap(x_ref, t_ref)``: the cheap model moves with x, the frozen target-minus-cheap gap
  corrects it.

The three are the kinds of ``speculate.domains.shared.gaussian_drift`` (shared with the physics
domain, where the field is the force instead of eps): what they draft, the memory the frozen kinds
keep per row, the cuts where a draft stops (a non-finite draft output or state), and ``advance``,
which updates that memory after each commit from the round's scored states only (the committed
history: this is what keeps every round exact, proofs/05). This module adds what is the diffusion
domain's own: the :class:`DraftContext` of a round (the sampler's plan: a step's mean ``a x + b
eps`` with ``eps = p x + q out`` from what the denoiser predicts; the draft denoiser's call with the
rows' times and labels), the x_0 form of the frozen draft and the ``draft`` argument.

Example:
    >>> from speculate.domains.diffusion.drafts import as_draft, frozen_correction
    >>> cheap = lambda x, t: 0 * x
    >>> [type(as_draft(d)).__name__ for d in ("frozen", "frozen-x0", cheap, frozen_correction(cheap))]
    ['FrozenDraft', 'FrozenDraft', 'DenoiserDraft', 'FrozenCorrection']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from speculate.domains.shared import gaussian_drift as gd
from speculate.domains.shared.gaussian_drift import Reference

from .denoisers import Denoiser
from .samplers import Plan

__all__ = ["DenoiserDraft", "Draft", "DraftContext", "FrozenCorrection", "FrozenDraft", "Reference", "as_draft",
           "frozen_correction"]


def col(v: np.ndarray, ndim: int) -> np.ndarray:
    """``v`` [...] with ``ndim`` trailing axes of length 1 (to broadcast over an event)."""
    return v.reshape(v.shape + (1,) * ndim)


def _eps(plan: Plan, idx: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    e = x.ndim - 1
    return col(plan.p[idx], e) * x + col(plan.q[idx], e) * out


def step_eps(plan: Plan, idx: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """eps = p x + q out: the denoiser's outputs ``out`` at the states ``x`` [M, *shape] of the steps
    ``idx`` [M] as the noise they predict, without overflow warnings."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _eps(plan, idx, x, out)


def step_means(plan: Plan, idx: np.ndarray, x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, eps) of the steps ``idx`` [M] from the states ``x`` [M, *shape] given the denoiser's
    outputs ``out`` (eps = p x + q out, mean = a x + b eps), without overflow warnings."""
    e = x.ndim - 1
    with np.errstate(over="ignore", invalid="ignore"):  # one context for both (plain sampling: every step)
        eps = _eps(plan, idx, x, out)
        return col(plan.a[idx], e) * x + col(plan.b[idx], e) * eps, eps


class DraftContext(NamedTuple):
    """What a draft needs of one round: the sampler's plan, the plan index of the step that starts at
    each position (int64 [R, k+1]), the rows' class labels ([R] or None) and the draft's own
    denoiser, called with the run's guidance (None for the frozen draft)."""

    plan: Plan
    steps: np.ndarray
    labels: np.ndarray | None
    fn: Denoiser | None

    def cheap_field(self, x: np.ndarray, at: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The draft denoiser's eps at the states ``x`` of the round's rows ``at`` at the plan steps
        ``steps``, and which outputs are finite."""
        out, ok = self.fn(x, self.plan.times[steps], None if self.labels is None else self.labels[at])
        return step_eps(self.plan, steps, x, out), ok

    def mean_coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """The means a x + b eps of the round's drafted steps: the plan's (a, b), [R, k] each."""
        idx = self.steps[:, :-1]
        return self.plan.a[idx], self.plan.b[idx]


class Draft(gd.Draft):
    """A kind of draft (the base of the three classes of this module; see ``gaussian_drift.Draft``
    for ``start`` / ``propose`` / ``advance``). ``denoiser``: the network the draft calls (None when
    it calls none)."""

    denoiser: Any = None


@dataclass(frozen=True)
class DenoiserDraft(gd.CheapDraft, Draft):
    """Draft with a smaller denoiser (the same signature as the target's)."""

    denoiser: Any


@dataclass(frozen=True)
class FrozenDraft(gd.FrozenDraft, Draft):
    """Draft with the target's prediction at the last state scored and moved on from, held constant
    over the k steps: ``space="eps"`` (``draft="frozen"``) holds eps, ``space="x0"``
    (``"frozen-x0"``) the x_0 prediction. No network call; vectorised over rows and steps."""

    space: str = "eps"

    def __post_init__(self) -> None:
        if self.space not in ("eps", "x0"):
            raise ValueError(f"FrozenDraft: space must be 'eps' or 'x0', got {self.space!r}")

    @property
    def reads_state(self) -> bool:  # x0 at the reference, from its state, eps and time
        return self.space == "x0"

    def hold(self, ctx, memory, rows):
        eps = memory.f[rows]
        if self.space == "eps":
            return eps
        ab = col(ctx.plan.alpha_bar[memory.step[rows]], eps.ndim - 1)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return (memory.x[rows] - np.sqrt(1.0 - ab) * eps) / np.sqrt(ab)  # x0 at the reference

    def draft_steps(self, ctx, held, S, loc, noise):
        if self.space == "eps":
            super().draft_steps(ctx, held, S, loc, noise)
            return
        k, e = loc.shape[1], held.ndim - 1
        a, b = (col(c, e) for c in ctx.mean_coefficients())
        ab = col(ctx.plan.alpha_bar[ctx.steps[:, :k]], e)
        x0_part, scale = np.sqrt(ab) * held[:, None], np.sqrt(1.0 - ab)  # once per round
        for j in range(k):
            x = S[:, j]
            eps = (x - x0_part[:, j]) / scale[:, j]  # the eps of the held x0 at x
            np.add(a[:, j] * x, b[:, j] * eps, out=loc[:, j])
            np.add(loc[:, j], noise[:, j], out=S[:, j + 1])


@dataclass(frozen=True)
class FrozenCorrection(gd.FrozenCorrection, Draft):
    """A cheap denoiser plus a frozen correction: ``eps_cheap(x, t) + eps(x_ref, t_ref) -
    eps_cheap(x_ref, t_ref)``, x_ref the state the row's last transition started from (scored by the
    previous round: no extra target call). Build it with :func:`frozen_correction`."""

    denoiser: Any

    def __post_init__(self) -> None:
        if not callable(self.denoiser):
            raise TypeError("frozen_correction: the cheap denoiser must be callable, got "
                            f"{type(self.denoiser).__name__}")


def frozen_correction(denoiser: Any) -> FrozenCorrection:
    """Draft with ``cheap(x, t) + eps(x_ref, t_ref) - cheap(x_ref, t_ref)`` (eps space).

    Example:
        >>> from speculate.domains.diffusion import frozen_correction
        >>> type(frozen_correction(lambda x, t: 0 * x)).__name__
        'FrozenCorrection'
    """
    return FrozenCorrection(denoiser)


def as_draft(spec: Any) -> Draft:
    """The draft object of ``speculative_sample(draft=spec)``: a denoiser, ``"frozen"``, ``"frozen-x0"``,
    or a :class:`Draft` (such as ``frozen_correction(cheap)``), returned as it is."""
    if isinstance(spec, Draft):
        return spec
    if isinstance(spec, str):
        if spec == "frozen":
            return FrozenDraft("eps")
        if spec == "frozen-x0":
            return FrozenDraft("x0")
        raise ValueError(f"draft must be a denoiser, 'frozen', 'frozen-x0' or frozen_correction(cheap), got {spec!r}")
    if callable(spec):
        return DenoiserDraft(spec)
    raise TypeError(f"draft must be a denoiser, 'frozen', 'frozen-x0' or frozen_correction(cheap), got "
                    f"{type(spec).__name__}")
