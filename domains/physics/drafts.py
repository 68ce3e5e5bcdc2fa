"""The kinds of draft of the physics domain: how k Euler-Maruyama steps are drafted ahead.

``Langevin(draft_force=...)`` accepts a force function, ``"frozen"`` or ``frozen_correction(cheap)``;
:func:`as_draft` (the one place that reads that argument) turns it into one of three classes:

- :class:`ForceDraft` (a function): a cheap force (a short cutoff, a coarse or distilled model),
  called once per drafted step on the rows that still draft;
- :class:`FrozenDraft` (``"frozen"``): the exact force at the last configuration a previous round
  scored and the row moved on from, held constant over the k steps: training-free, no force call
  at all, and the k steps of all rows are vectorised;
- :class:`FrozenCorrection` (``frozen_correction(cheap)``): ``cheap(x) + F(x_ref) - cheap(x_ref)``,
  the multiple-time-step (RESPA) idea as a draft.

The three are the kinds of ``speculate.domains.shared.gaussian_drift`` (shared with the diffusion
domain, where the field is the denoiser's eps instead of the force): what they draft, the memory
the frozen kinds keep per row (the reference configuration, its exact force, the cheap force
there), the cuts where the draft force is not finite or a drafted configuration overflows. This
module adds what is the physics domain's own: the :class:`DraftContext` of a round (the model's
mean ``x + dt F / gamma``, the draft force's call and its checks) and the ``draft_force`` argument.

Example:
    >>> from speculate.domains.physics import DoubleWell
    >>> from speculate.domains.physics.drafts import as_draft, frozen_correction
    >>> [type(as_draft(d)).__name__ for d in (DoubleWell(), "frozen", frozen_correction(DoubleWell()))]
    ['ForceDraft', 'FrozenDraft', 'FrozenCorrection']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from speculate.domains.shared import gaussian_drift as gd
from speculate.domains.shared.gaussian_drift import Reference

from .forces import ForceFn, evaluate_force

__all__ = ["Draft", "DraftContext", "ForceDraft", "FrozenCorrection", "FrozenDraft", "Reference", "as_draft",
           "frozen_correction"]


class DraftContext(NamedTuple):
    """What a draft needs of one round: the model (its Euler-Maruyama mean ``X + dt F / gamma``), the
    step of each position (int64 [R, k+1]: the row's step count, for error messages) and the draft's
    cheap force (None for the frozen draft)."""

    model: Any
    steps: np.ndarray
    fn: ForceFn | None

    def cheap_field(self, x: np.ndarray, at: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cheap force at the configurations ``x`` [M, N, d], checked; and which are finite."""
        return evaluate_force(self.fn, x, who="draft_force", steps=steps)  # on its own copy of x

    def mean_coefficients(self) -> tuple[None, float]:
        """The model's mean x + (dt / gamma) F at every step: (None, dt / gamma)."""
        return None, self.model.dt / self.model.gamma


class Draft(gd.Draft):
    """A kind of draft force (the base of the three classes of this module; see
    ``gaussian_drift.Draft`` for ``start`` / ``propose`` / ``advance``). ``force``: the cheap force the
    draft calls (None when it calls none)."""

    force: Any = None


@dataclass(frozen=True)
class ForceDraft(gd.CheapDraft, Draft):
    """Draft with a cheap force function ``force(X[B, N, d]) -> [B, N, d]``."""

    force: ForceFn


@dataclass(frozen=True)
class FrozenDraft(gd.FrozenDraft, Draft):
    """Draft with the exact force of the last configuration scored and moved on from, held
    constant over the k steps (``draft_force="frozen"``): no force call, vectorised steps."""


@dataclass(frozen=True)
class FrozenCorrection(gd.FrozenCorrection, Draft):
    """A cheap force plus a frozen correction: ``draft(x) + F(x_ref) - draft(x_ref)``.

    ``x_ref`` is the last configuration whose exact force is known (scored by the previous round),
    so the correction costs no extra call of the exact force. This is the multiple-time-step
    (RESPA) idea as a draft: the cheap short-range part moves with the particles, the expensive
    long-range remainder is frozen for the k drafted steps. Build it with ``frozen_correction``.
    """

    draft: ForceFn

    def __post_init__(self) -> None:
        if not callable(self.draft):
            raise TypeError(f"frozen_correction: draft must be callable, got {type(self.draft).__name__}")

    @property
    def force(self) -> ForceFn:  # the cheap force the draft calls
        return self.draft


def frozen_correction(draft: ForceFn) -> FrozenCorrection:
    """Draft with ``draft(x) + F(x_ref) - draft(x_ref)``, x_ref the last verified configuration.

    Example:
        >>> from speculate.domains.physics import DoubleWell, Langevin, frozen_correction
        >>> model = Langevin(force=DoubleWell(), draft_force=frozen_correction(DoubleWell(2.0)))
        >>> type(model.draft_force).__name__
        'FrozenCorrection'
    """
    return FrozenCorrection(draft)


def as_draft(spec: Any) -> Draft:
    """The draft object of ``Langevin(draft_force=spec)``: a force function, ``"frozen"``, or a
    :class:`Draft` (such as ``frozen_correction(cheap)``), which is returned as it is."""
    if isinstance(spec, Draft):
        return spec
    if isinstance(spec, str) and spec == "frozen":
        return FrozenDraft()
    if callable(spec):
        return ForceDraft(spec)
    raise ValueError(f"Langevin: draft_force must be a callable, 'frozen' or frozen_correction(f), got {spec!r}")
