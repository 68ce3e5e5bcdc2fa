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

Every draft fills, for the active rows, the drafted configurations ``S[:, 1:]`` (``S[:, 0]`` is
the committed one), the draft means ``loc`` and the drafted lengths (cut short where the draft
force is not finite or a drafted configuration overflows). What a draft must remember between
rounds lives in a memory object that ``start`` builds and the process keeps (long-lived, one entry
per row): the frozen kinds remember the reference configuration and its exact force (and the
cheap force there). They need one exact force from the past, so in the first round of a row they
draft nothing (length 0) and that round is a plain step whose score call yields the force. What a
draft needs of one round (the cheap forces of the correction) is returned by ``propose`` and
travels in the round's context to ``advance``.

Example:
    >>> from speculate.domains.physics import DoubleWell
    >>> from speculate.domains.physics.drafts import as_draft, frozen_correction
    >>> [type(as_draft(d)).__name__ for d in (DoubleWell(), "frozen", frozen_correction(DoubleWell()))]
    ['ForceDraft', 'FrozenDraft', 'FrozenCorrection']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .forces import ForceFn, evaluate_force

__all__ = ["Draft", "ForceDraft", "FrozenCorrection", "FrozenDraft", "Reference", "as_draft", "frozen_correction"]


class Stepper(Protocol):
    """What a draft needs of the model (``langevin.Langevin`` has it): the step ``dt``, the friction
    ``gamma`` and the Euler-Maruyama mean ``X + dt F / gamma``."""

    dt: float
    gamma: float

    def mean(self, X: np.ndarray, F: np.ndarray) -> np.ndarray: ...


@dataclass
class Reference:
    """What the frozen drafts remember per row (B rows): the exact force ``F`` at the reference
    configuration, the one the row's last transition started from (``known``: a previous round
    has scored it) and, for the frozen correction, that configuration ``X`` and the cheap force
    ``G`` there (``has_G``: computed, and finite)."""

    F: np.ndarray  #: [B, N, d] the exact force at the reference configuration
    known: np.ndarray  #: bool [B]
    X: np.ndarray | None = None  #: [B, N, d] the reference configuration (FrozenCorrection only)
    G: np.ndarray | None = None  #: [B, N, d] the cheap force at X (FrozenCorrection only)
    has_G: np.ndarray | None = None  #: bool [B]


class Draft:
    """A kind of draft force (the base of the three classes of this module).

    ``start(X0)`` builds the per-row memory the process keeps between rounds (None: nothing);
    ``propose(...)`` drafts one round; ``advance(...)`` updates the memory after ``commit``.
    """

    def start(self, X0: np.ndarray) -> Any:
        """The memory of a run from ``X0`` [B, N, d]."""
        return None

    def propose(
        self,
        model: Stepper,
        memory: Any,
        rows: np.ndarray,
        steps: np.ndarray,
        S: np.ndarray,
        loc: np.ndarray,
        noise: np.ndarray,
        lengths: np.ndarray,
    ) -> tuple[Any, int]:
        """Draft ``k = loc.shape[1]`` steps of the rows ``rows`` (at chain steps ``steps``).

        Fills ``S[:, 1:]`` ([R, k+1, N, d], ``S[:, 0]`` given) and ``loc`` ([R, k, N, d], the draft
        means, so that ``S[:, i + 1] = loc[:, i] + noise[:, i]``), and lowers ``lengths`` in place
        where the draft stops. Entries past a row's length are ignored but kept finite. Returns
        (what ``advance`` needs of this round, the number of drafts cut short).
        """
        raise NotImplementedError

    def advance(
        self, memory: Any, rows: np.ndarray, last: np.ndarray, S: np.ndarray, F: np.ndarray, extra: Any,
        lengths: np.ndarray,
    ) -> None:
        """After a round: row ``rows[i]`` made its last transition from ``S[i, last[i]]``, whose exact
        force is ``F[i, last[i]]``; ``extra`` is what ``propose`` returned."""


def _cut_blown(S: np.ndarray, loc: np.ndarray, lengths: np.ndarray, i: int, at: Any = slice(None)) -> int:
    """Rows ``at`` whose drafted s_{i+1} overflowed (a finite but huge draft force): cut at i.

    Returns the number of drafts cut short."""
    Si = S[at, i + 1]
    blown = ~np.isfinite(Si.reshape(Si.shape[0], -1)).all(axis=1)
    if not blown.any():
        return 0
    b = np.arange(S.shape[0])[at][blown]
    cut = b[lengths[b] > i]
    lengths[cut] = i
    loc[b, i] = S[b, i]  # keep every array finite
    S[b, i + 1] = S[b, i]
    return int(cut.size)


def _cheap_steps(
    fn: ForceFn,
    model: Stepper,
    S: np.ndarray,
    loc: np.ndarray,
    noise: np.ndarray,
    lengths: np.ndarray,
    steps: np.ndarray,
    correction: np.ndarray | None = None,
    G: np.ndarray | None = None,
) -> int:
    """k Euler-Maruyama steps with the force ``fn(x) (+ correction)``, one call of ``fn`` per step
    on the rows still drafting (``lengths > i``); ``G[:, i]`` receives ``fn(s_i)``. Returns the
    number of drafts cut short (a non-finite ``fn``, an overflowing configuration)."""
    R, k = loc.shape[:2]
    cuts = 0
    for i in range(k):
        live = lengths > i
        if live.all():
            at: Any = slice(None)
        else:
            idle = ~live
            loc[idle, i] = S[idle, i]  # padding: finite, never read
            S[idle, i + 1] = S[idle, i]
            at = np.flatnonzero(live)
            if at.size == 0:
                continue
        X = S[at, i]
        F, ok = evaluate_force(fn, X, who="draft_force", steps=steps[at] + i)  # on its own copy of X
        if not ok.all():
            F = np.where(ok[:, None, None], F, 0.0)  # never written into: it may be the force's own array
        if G is not None:
            G[at, i] = F
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is cut just below
            if correction is not None:
                F = F + correction[at]
            mean = model.mean(X, F)
            loc[at, i] = mean
            S[at, i + 1] = mean + noise[at, i]
        if not ok.all():
            cut = np.arange(R)[at][~ok]  # the draft stops at s_i
            cuts += int(cut.size)
            lengths[cut] = i
        cuts += _cut_blown(S, loc, lengths, i, at)  # before the next draft call
    return cuts


@dataclass(frozen=True)
class ForceDraft(Draft):
    """Draft with a cheap force function ``force(X[B, N, d]) -> [B, N, d]``."""

    force: ForceFn

    def propose(self, model, memory, rows, steps, S, loc, noise, lengths):
        return None, _cheap_steps(self.force, model, S, loc, noise, lengths, steps)


@dataclass(frozen=True)
class FrozenDraft(Draft):
    """Draft with the exact force of the last configuration scored and moved on from, held
    constant over the k steps (``draft_force="frozen"``): no force call, vectorised steps."""

    def start(self, X0):
        return Reference(F=np.zeros_like(X0), known=np.zeros(X0.shape[0], bool))

    def propose(self, model, memory, rows, steps, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0  # no exact force known yet
        k = loc.shape[1]
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is cut just below
            drift = (model.dt / model.gamma) * memory.F[rows]  # the same drift every step
            for i in range(k):
                np.add(S[:, i], drift, out=loc[:, i])
                np.add(loc[:, i], noise[:, i], out=S[:, i + 1])
        cuts = 0
        if k and not np.isfinite(S).all():
            for i in range(k):
                cuts += _cut_blown(S, loc, lengths, i)
        return None, cuts

    def advance(self, memory, rows, last, S, F, extra, lengths):
        memory.F[rows], memory.known[rows] = F[np.arange(len(rows)), last], True


@dataclass(frozen=True)
class FrozenCorrection(Draft):
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

    def start(self, X0):
        B = X0.shape[0]
        zero = np.zeros_like(X0)
        return Reference(F=zero, known=np.zeros(B, bool), X=X0.copy(), G=zero.copy(), has_G=np.zeros(B, bool))

    def propose(self, model, memory, rows, steps, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0  # no exact force known yet
        fresh = np.flatnonzero((lengths > 0) & ~memory.has_G[rows])
        if fresh.size:  # cheap(X_ref), once per reference, for the rows that draft
            r = rows[fresh]
            g, ok = evaluate_force(self.draft, memory.X[r], who="draft_force", steps=steps[fresh], private=True)
            if not ok.all():
                g = np.where(ok[:, None, None], g, 0.0)
            memory.G[r], memory.has_G[r] = g, ok
            lengths[fresh[~ok]] = 0
        with np.errstate(over="ignore", invalid="ignore"):
            correction = memory.F[rows] - memory.G[rows]  # [R, N, d]
        G = np.zeros_like(S)  # cheap forces at s_0 .. s_{k-1}: the next reference's
        return G, _cheap_steps(self.draft, model, S, loc, noise, lengths, steps, correction, G)

    def advance(self, memory, rows, last, S, F, G, lengths):
        i = np.arange(len(rows))
        memory.X[rows], memory.F[rows], memory.known[rows] = S[i, last], F[i, last], True
        memory.G[rows] = G[i, last]
        memory.has_G[rows] = last < lengths  # the cheap force was computed (and finite) at s_last


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
