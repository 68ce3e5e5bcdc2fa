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
  eps_cheap(x_ref, t_ref)``, the physics domain's frozen correction: the cheap model moves with x,
  the frozen target-minus-cheap gap corrects it.

Every draft fills, for the active rows, the drafted states ``S[:, 1:]`` (``S[:, 0]`` is the
committed one), the draft means ``loc`` (``S[:, j+1] = loc[:, j] + noise[:, j]``) and lowers the
drafted lengths where it stops (a non-finite draft output or state). The frozen kinds need one
target output from the past, so a row's first round drafts nothing (a plain step whose score call
yields it). What a draft remembers between rounds lives in a memory object that ``start`` builds
and the process keeps; ``advance`` updates it after each commit from the round's scored states only
(the committed history: this is what keeps every round exact, proofs/05).

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

from .denoisers import Denoiser
from .samplers import Plan

__all__ = ["DenoiserDraft", "Draft", "DraftContext", "FrozenCorrection", "FrozenDraft", "Reference", "as_draft",
           "frozen_correction"]


class DraftContext(NamedTuple):
    """What a draft needs of one round: the sampler's plan, the plan index of the step that starts at
    each position (int64 [R, k+1]), the rows' class labels ([R] or None) and the draft's own
    denoiser, called with the run's guidance (None for the frozen draft)."""

    plan: Plan
    steps: np.ndarray
    labels: np.ndarray | None
    fn: Denoiser | None


def col(v: np.ndarray, ndim: int) -> np.ndarray:
    """``v`` [...] with ``ndim`` trailing axes of length 1 (to broadcast over an event)."""
    return v.reshape(v.shape + (1,) * ndim)


def step_means(plan: Plan, idx: np.ndarray, x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, eps) of the steps ``idx`` [M] from the states ``x`` [M, *shape] given the denoiser's
    outputs ``out`` (eps = p x + q out, mean = a x + b eps), without overflow warnings."""
    e = x.ndim - 1
    with np.errstate(over="ignore", invalid="ignore"):
        eps = col(plan.p[idx], e) * x + col(plan.q[idx], e) * out
        mean = col(plan.a[idx], e) * x + col(plan.b[idx], e) * eps
    return mean, eps


def finite_rows(a: np.ndarray) -> np.ndarray:
    return np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)


@dataclass
class Reference:
    """What the frozen drafts remember per row (B rows): the target's eps at the reference state (the
    one the row's last transition started from; ``known``: a previous round scored it), that state
    ``x`` and its plan index ``step``; for the frozen correction the cheap model's eps there ``g``
    (``has_g``: computed, and finite)."""

    eps: np.ndarray  #: [B, *shape]
    x: np.ndarray  #: [B, *shape]
    step: np.ndarray  #: int64 [B]
    known: np.ndarray  #: bool [B]
    g: np.ndarray | None = None  #: [B, *shape] (FrozenCorrection only)
    has_g: np.ndarray | None = None  #: bool [B]


class Draft:
    """A kind of draft (the base of the three classes of this module).

    ``start(X0)`` builds the per-row memory the process keeps between rounds (None: nothing);
    ``propose(...)`` drafts one round; ``advance(...)`` updates the memory after ``commit``.
    ``denoiser``: the network the draft calls (None when it calls none).
    """

    denoiser: Any = None

    def start(self, X0: np.ndarray) -> Any:
        return None

    def propose(self, ctx: DraftContext, memory: Any, rows: np.ndarray, S: np.ndarray, loc: np.ndarray,
                noise: np.ndarray, lengths: np.ndarray) -> tuple[Any, int]:
        """Draft ``k = loc.shape[1]`` steps of the rows ``rows``: fill ``S[:, 1:]`` ([R, k+1, *shape])
        and ``loc`` ([R, k, *shape]) so that ``S[:, j+1] = loc[:, j] + noise[:, j]``, lower
        ``lengths`` in place where the draft stops, keep every entry finite. Returns (what
        ``advance`` needs of this round, the number of drafts cut short)."""
        raise NotImplementedError

    def advance(self, memory: Any, rows: np.ndarray, last: np.ndarray, S: np.ndarray, steps: np.ndarray,
                eps: np.ndarray, extra: Any, lengths: np.ndarray) -> None:
        """After a round: row ``rows[i]`` made its last transition from ``S[i, last[i]]`` (plan index
        ``steps[i, last[i]]``), where the target's eps is ``eps[i]`` ([R, *shape])."""


def _pad(S: np.ndarray, loc: np.ndarray, rows: Any, j: int) -> None:
    """Finite padding at position j of ``rows`` (never read by the verifier)."""
    loc[rows, j] = S[rows, j]
    S[rows, j + 1] = S[rows, j]


def _cut_blown(S: np.ndarray, loc: np.ndarray, lengths: np.ndarray, j: int) -> int:
    """Rows whose drafted s_{j+1} is not finite (an overflowing draft): cut at j, pad. Returns the cuts."""
    blown = ~finite_rows(S[:, j + 1])
    if not blown.any():
        return 0
    cut = blown & (lengths > j)
    lengths[cut] = j
    _pad(S, loc, blown, j)
    return int(cut.sum())


def _denoised_steps(ctx: DraftContext, S, loc, noise, lengths, correction=None, G=None) -> int:
    """k steps with the draft denoiser (plus ``correction``, an eps offset per row), one call per step
    on the rows still drafting; ``G[:, j]`` receives the draft's eps at s_j. Returns the cuts."""
    k = loc.shape[1]
    cuts = 0
    for j in range(k):
        live = lengths > j
        if not live.all():
            _pad(S, loc, ~live, j)
        at = np.flatnonzero(live)
        if at.size == 0:
            continue
        x, idx = S[at, j], ctx.steps[at, j]
        out, ok = ctx.fn(x, ctx.plan.times[idx], None if ctx.labels is None else ctx.labels[at])
        mean, eps = step_means(ctx.plan, idx, x, out)
        if correction is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                eps_c = eps + correction[at]
                mean = col(ctx.plan.a[idx], x.ndim - 1) * x + col(ctx.plan.b[idx], x.ndim - 1) * eps_c
        if G is not None:
            G[at, j] = eps
        ok &= finite_rows(mean)
        loc[at, j] = mean
        with np.errstate(over="ignore", invalid="ignore"):
            S[at, j + 1] = mean + noise[at, j]
        if not ok.all():
            bad = at[~ok]
            lengths[bad] = j
            _pad(S, loc, bad, j)
            cuts += int(bad.size)
        cuts += _cut_blown(S, loc, lengths, j)
    return cuts


@dataclass(frozen=True)
class DenoiserDraft(Draft):
    """Draft with a smaller denoiser (the same signature as the target's)."""

    denoiser: Any

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        return None, _denoised_steps(ctx, S, loc, noise, lengths)


@dataclass(frozen=True)
class FrozenDraft(Draft):
    """Draft with the target's prediction at the last state scored and moved on from, held constant
    over the k steps: ``space="eps"`` (``draft="frozen"``) holds eps, ``space="x0"``
    (``"frozen-x0"``) the x_0 prediction. No network call; vectorised over rows and steps."""

    space: str = "eps"

    def __post_init__(self) -> None:
        if self.space not in ("eps", "x0"):
            raise ValueError(f"FrozenDraft: space must be 'eps' or 'x0', got {self.space!r}")

    def start(self, X0):
        B = X0.shape[0]
        return Reference(eps=np.zeros_like(X0), x=X0.copy(), step=np.zeros(B, np.int64), known=np.zeros(B, bool))

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0  # no target output known yet: a plain step
        k, e = loc.shape[1], S.ndim - 2
        plan = ctx.plan
        eps = memory.eps[rows]
        if self.space == "x0":
            ab = col(plan.alpha_bar[memory.step[rows]], e)
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                x0 = (memory.x[rows] - np.sqrt(1.0 - ab) * eps) / np.sqrt(ab)
        with np.errstate(over="ignore", invalid="ignore"):
            for j in range(k):
                idx = ctx.steps[:, j]
                x = S[:, j]
                if self.space == "x0":
                    ab = col(plan.alpha_bar[idx], e)
                    eps = (x - np.sqrt(ab) * x0) / np.sqrt(1.0 - ab)
                np.add(col(plan.a[idx], e) * x, col(plan.b[idx], e) * eps, out=loc[:, j])
                np.add(loc[:, j], noise[:, j], out=S[:, j + 1])
        cuts = 0
        if k and not np.isfinite(S).all():
            for j in range(k):
                cuts += _cut_blown(S, loc, lengths, j)
        return None, cuts

    def advance(self, memory, rows, last, S, steps, eps, extra, lengths):
        i = np.arange(len(rows))
        memory.eps[rows], memory.x[rows], memory.step[rows] = eps, S[i, last], steps[i, last]
        memory.known[rows] = True


@dataclass(frozen=True)
class FrozenCorrection(Draft):
    """A cheap denoiser plus a frozen correction: ``eps_cheap(x, t) + eps(x_ref, t_ref) -
    eps_cheap(x_ref, t_ref)``, x_ref the state the row's last transition started from (scored by the
    previous round: no extra target call). Build it with :func:`frozen_correction`."""

    denoiser: Any

    def __post_init__(self) -> None:
        if not callable(self.denoiser):
            raise TypeError("frozen_correction: the cheap denoiser must be callable, got "
                            f"{type(self.denoiser).__name__}")

    def start(self, X0):
        B = X0.shape[0]
        z = np.zeros_like(X0)
        return Reference(eps=z, x=X0.copy(), step=np.zeros(B, np.int64), known=np.zeros(B, bool), g=z.copy(),
                         has_g=np.zeros(B, bool))

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0
        fresh = np.flatnonzero((lengths > 0) & ~memory.has_g[rows])
        if fresh.size:  # the cheap eps at x_ref, once per reference, for the rows that draft
            r = rows[fresh]
            idx = memory.step[r]
            out, ok = ctx.fn(memory.x[r], ctx.plan.times[idx], None if ctx.labels is None else ctx.labels[fresh])
            _, g = step_means(ctx.plan, idx, memory.x[r], out)
            ok &= finite_rows(g)
            memory.g[r], memory.has_g[r] = np.where(col(ok, g.ndim - 1), g, 0.0), ok
            lengths[fresh[~ok]] = 0
        with np.errstate(over="ignore", invalid="ignore"):
            correction = memory.eps[rows] - memory.g[rows]
        G = np.zeros_like(S)  # the cheap eps at s_0 .. s_{k-1}: the next reference's
        return G, _denoised_steps(ctx, S, loc, noise, lengths, correction, G)

    def advance(self, memory, rows, last, S, steps, eps, G, lengths):
        i = np.arange(len(rows))
        memory.eps[rows], memory.x[rows], memory.step[rows] = eps, S[i, last], steps[i, last]
        memory.known[rows] = True
        memory.g[rows] = G[i, last]
        memory.has_g[rows] = last < lengths  # the cheap eps was computed (and finite) at s_last


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
