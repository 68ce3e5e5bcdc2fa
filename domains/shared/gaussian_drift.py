"""Drafts for chains of Gaussian steps driven by a field: the design the physics and diffusion domains share.

Both domains sample a chain whose step from a state x is Gaussian, ``x' ~ Normal(mean(x, f(x)), sigma)``,
with a mean that depends on x through a field ``f`` that is costly to evaluate: the force (physics:
``mean = x + dt F / gamma``) or the target denoiser's eps (diffusion: ``mean = a x + b eps``). The
target evaluates ``f`` at the k+1 states of a round in one call; a draft runs k steps ahead with a
field that costs little or nothing. What differs between the domains (how a field is evaluated, how a
mean is formed) is a small context object each builds per round (:class:`DraftContext`); the rest is
here:

- the kinds of draft: :class:`CheapDraft` (a cheap model's field, one call per drafted step on the
  rows that still draft), :class:`FrozenDraft` (the target's field at the last state a previous round
  scored and the row moved on from, held over the k steps: no call at all) and
  :class:`FrozenCorrection` (``cheap(x) + f(x_ref) - cheap(x_ref)``, the multiple-time-step idea as a
  draft), with the memory the frozen kinds keep per row (:class:`Reference`);
- the cuts that keep a round exact when a draft or the target leaves the numbers float64 can
  follow: a drafted state that is not finite cuts its row's draft there (:func:`cut_blown`), and a
  drafted step is verified only before the first state whose target step is undefined and before the
  first draft too far from the target to verify (:data:`FAR`, :func:`far_from_target`,
  :func:`check_drafts`); every cut depends on the drafted prefix only (proofs/05);
- a round's record (:class:`Round`, the proposal's context), the proposal every round makes
  (:func:`propose_round`) and the states the target scores (:func:`score_batch`);
- the counters every such run adds to ``speculate.Stats`` (:class:`DriftStats`), and the checks of
  the round loop's ``lookahead`` and ``cost_ratio`` (:func:`check_lookahead`,
  :func:`check_cost_ratio`; each domain checks ``max_lookahead`` its own way, between them).

Every draft fills, for the active rows, the drafted states ``S[:, 1:]`` (``S[:, 0]`` is the committed
one) and the draft means ``loc`` (``S[:, j + 1] = loc[:, j] + noise[:, j]``), lowers the drafted
lengths where it stops, and keeps every entry finite. The frozen kinds need one target field from the
past, so a row's first round drafts nothing (a plain step whose score call yields it). What a draft
remembers between rounds lives in a memory object that ``start`` builds and the process keeps;
``advance`` updates it after each commit from the round's scored states only (the committed history).

Example (a toy chain: x' ~ Normal(x + f(x), 1) with the field f(x) = -x / 2):

    >>> import numpy as np
    >>> from speculate.domains.shared.gaussian_drift import CheapDraft, Reference
    >>> class Toy:  # the context of one round: the step of each position, the field, the mean x + 1 f
    ...     steps = np.zeros((2, 4), np.int64)
    ...     def cheap_field(self, x, at, steps):
    ...         return -x / 2, np.ones(len(x), bool)
    ...     def mean_coefficients(self):
    ...         return None, 1.0
    >>> S, loc = np.zeros((2, 4, 1)), np.zeros((2, 3, 1))
    >>> S[:, 0] = [[1.0], [8.0]]
    >>> lengths = np.array([3, 2])
    >>> CheapDraft().propose(Toy(), None, np.arange(2), S, loc, np.zeros((2, 3, 1)), lengths)
    (None, 0)
    >>> S[:, :, 0].tolist()           # row 1 drafts 2 steps; past its length: padding
    [[1.0, 0.5, 0.25, 0.125], [8.0, 4.0, 2.0, 2.0]]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar, Protocol

import numpy as np

from speculate import Normal, Stats
from speculate.rounds import Proposal

__all__ = ["FAR", "CheapDraft", "Draft", "DraftContext", "DriftStats", "FrozenCorrection", "FrozenDraft",
           "Reference", "Round", "check_cost_ratio", "check_drafts", "check_lookahead", "cut_blown",
           "far_from_target", "finite_rows", "is_int", "propose_round", "score_batch"]

FAR = 1e300
"""A drafted step whose squared whitened distance to the target's, ``|mean_target - mean_draft|^2 /
sigma^2``, is beyond this (or not finite) is not verified (its acceptance probability is 0 in float64
and the coupling's arithmetic would overflow): the target's step is drawn there instead."""

RUNNING_SUM = 64
"""The frozen draft's steps ``x + b f`` of rows with up to this many numbers in all (rows x event) are
drafted as one running sum (``np.add.accumulate``); beyond it, where accumulate's strided loop costs
more than a call per step, step by step. Either way the same additions in the same order."""

NOISE_LOST = 1e150
"""A draft mean beyond ``NOISE_LOST * sigma`` in absolute value has lost the draft's noise in rounding
(``loc + noise == loc``): such a step is not verified either (the coupling would read a sample that is
not one)."""


@dataclass
class DriftStats(Stats):
    """The counters of ``speculate.Stats`` and those every Gaussian-drift run adds.

    ``steps``: steps per row (per replica, per sample: ``Stats.merge`` takes the maximum);
    ``calls_per_step`` = target_calls / steps, the sequential target calls per step (1 for plain
    sampling); ``draft_truncations``: drafts cut short (a non-finite draft, an overflowing drafted
    state, or, in score, an undefined target step or a draft too far from the target to verify);
    ``wall_time``: seconds for the whole run. A plain run counts as rounds without drafts (k = 0).
    """

    #: Stats.merge: steps per row, not summed
    _not_summed: ClassVar[tuple[str, ...]] = ("steps",)
    steps: int = 0  #: steps per row
    draft_truncations: int = 0  #: drafts cut short (see the class docstring)
    wall_time: float = 0.0  #: seconds for the whole run

    @property
    def calls_per_step(self) -> float:
        """Sequential target calls per step (plain sampling: 1)."""
        return self.target_calls / self.steps if self.steps else float("nan")

    def extras(self) -> dict[str, Any]:
        """The fields the subclass adds, arrays left out (``as_dict`` has them)."""
        return {k: v for k, v in super().extras().items() if not isinstance(v, np.ndarray)}

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["calls_per_step"] = self.calls_per_step
        return out

    def summary(self) -> str:
        return f"{super().summary()} calls_per_step={self.calls_per_step:.4g}"


def is_int(v: Any) -> bool:
    """An int (Python's or NumPy's), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_lookahead(lookahead: Any) -> None:
    """The round loop's ``lookahead``: a non-negative int or "auto" (TypeError, ValueError)."""
    if not (is_int(lookahead) or (isinstance(lookahead, str) and lookahead == "auto")):
        raise TypeError(f"lookahead must be a non-negative int or 'auto', got {lookahead!r}")
    if is_int(lookahead) and lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")


def check_cost_ratio(cost_ratio: Any) -> None:
    """The round loop's ``cost_ratio``: None or a finite real number >= 0 (TypeError, ValueError)."""
    if cost_ratio is not None:
        if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float, np.integer, np.floating)):
            raise TypeError(f"cost_ratio must be None or a real number >= 0, got {cost_ratio!r}")
        if not 0.0 <= float(cost_ratio) < float("inf"):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio}")


class DraftContext(Protocol):
    """What a draft needs of one round, built by the domain's process (each domain's ``DraftContext``).

    ``steps``: int64 ``[R, k+1]``, the step each position of each row starts (a step count, a
    sampler's plan index: whatever ``cheap_field`` reads). ``cheap_field(x, at, steps)``: the draft's
    cheap model's field at the states ``x`` ``[M, *event]`` of the round's rows ``at`` (an index or a
    slice of the round's rows) at ``steps`` ``[M]``, and which are finite (bool ``[M]``).
    ``mean_coefficients()``: ``(a, b)``, the means of the steps at the round's k drafted positions
    given the field f, ``a x + b f`` (``a`` None: x itself, or ``[R, k]``; ``b`` a number or
    ``[R, k]``), once per round for all of them.
    """

    steps: np.ndarray

    def cheap_field(self, x: np.ndarray, at: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def mean_coefficients(self) -> tuple[np.ndarray | None, Any]: ...


@dataclass
class Reference:
    """What the frozen drafts remember per row (B rows): the target's field ``f`` at the reference
    state (the one the row's last transition started from; ``known``: a previous round scored it),
    that state ``x`` and its step ``step`` (where the draft reads them); for the frozen correction the
    cheap model's field there ``g`` (``has_g``: computed, and finite)."""

    f: np.ndarray  #: [B, *event] the target's field at the reference state
    x: np.ndarray | None  #: [B, *event] the reference state (None: the draft does not read it)
    step: np.ndarray | None  #: int64 [B] its step (None with x)
    known: np.ndarray  #: bool [B]
    g: np.ndarray | None = None  #: [B, *event] the cheap field at x (FrozenCorrection only)
    has_g: np.ndarray | None = None  #: bool [B]

    @classmethod
    def empty(cls, X0: np.ndarray, cheap: bool = False, state: bool = True) -> Reference:
        """Nothing known yet for the rows of ``X0`` ``[B, *event]`` (``cheap``: with room for ``g``;
        ``state``: for ``x`` and ``step``, which ``cheap`` implies)."""
        B = X0.shape[0]
        z = np.zeros_like(X0)
        x, step = (X0.copy(), np.zeros(B, np.int64)) if state or cheap else (None, None)
        if not cheap:
            return cls(f=z, x=x, step=step, known=np.zeros(B, bool))
        return cls(f=z, x=x, step=step, known=np.zeros(B, bool), g=z.copy(), has_g=np.zeros(B, bool))


class Draft:
    """A kind of draft (the base of every kind; each domain's ``Draft`` derives from it).

    ``start(X0)`` builds the per-row memory the process keeps between rounds (None: nothing);
    ``propose(...)`` drafts one round; ``advance(...)`` updates the memory after ``commit``.
    """

    def start(self, X0: np.ndarray) -> Any:
        """The memory of a run from ``X0`` ``[B, *event]``."""
        return None

    def propose(self, ctx: DraftContext, memory: Any, rows: np.ndarray, S: np.ndarray, loc: np.ndarray,
                noise: np.ndarray, lengths: np.ndarray) -> tuple[Any, int]:
        """Draft ``k = loc.shape[1]`` steps of the rows ``rows``: fill ``S[:, 1:]`` (``[R, k+1, *event]``,
        ``S[:, 0]`` given) and ``loc`` (``[R, k, *event]``) so that ``S[:, j+1] = loc[:, j] + noise[:, j]``,
        lower ``lengths`` in place where the draft stops, keep every entry finite. Returns (what
        ``advance`` needs of this round, the number of drafts cut short)."""
        raise NotImplementedError

    def advance(self, memory: Any, rows: np.ndarray, last: np.ndarray, S: np.ndarray, steps: np.ndarray,
                f: np.ndarray, extra: Any, lengths: np.ndarray) -> None:
        """After a round: row ``rows[i]`` made its last transition from ``S[i, last[i]]`` (step
        ``steps[i, last[i]]``), where the target's field is ``f[i]`` (``[R, *event]``); ``extra`` is
        what ``propose`` returned."""


def finite_rows(a: np.ndarray) -> np.ndarray:
    """Bool ``[M]``: the rows of ``a`` ``[M, ...]`` with every entry finite."""
    return np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)


def _ndim(c: Any) -> int:
    """``np.ndim`` of a number or an array, without its cost (a round asks it a few times)."""
    return getattr(c, "ndim", 0)


def per_step(c: Any, e: int) -> Any:
    """A coefficient of ``mean_coefficients`` (a number, or ``[R, k]``) that broadcasts against
    ``[R, k, *event]`` (``e`` event axes)."""
    return c.reshape(c.shape + (1,) * e) if _ndim(c) else c


def _pad(S: np.ndarray, loc: np.ndarray, rows: Any, j: int) -> None:
    """Finite padding at position j of ``rows`` (never read by the verifier)."""
    loc[rows, j] = S[rows, j]
    S[rows, j + 1] = S[rows, j]


def cut_blown(S: np.ndarray, loc: np.ndarray, lengths: np.ndarray, j: int, at: Any = slice(None)) -> int:
    """Rows ``at`` whose drafted s_{j+1} is not finite (an overflowing draft): cut at j, padded.
    Returns the number of drafts cut short."""
    blown = ~finite_rows(S[at, j + 1])
    if not blown.any():
        return 0
    b = np.arange(S.shape[0])[at][blown]
    cut = b[lengths[b] > j]
    lengths[cut] = j
    _pad(S, loc, b, j)
    return int(cut.size)


def cheap_steps(ctx: DraftContext, S: np.ndarray, loc: np.ndarray, noise: np.ndarray, lengths: np.ndarray,
                correction: np.ndarray | None = None, G: np.ndarray | None = None) -> int:
    """k steps with the cheap field (plus ``correction``, a field offset per row), one call per step on
    the rows still drafting (``lengths > j``); ``G[:, j]`` receives the cheap field at s_j. A row whose
    field is not finite, or whose drafted state is not (a mean that is not finite, or overflows),
    stops there. Returns the number of drafts cut short."""
    R, k = loc.shape[:2]
    a, b = ctx.mean_coefficients()
    e = S.ndim - 2
    a, each, b = None if a is None else per_step(a, e), _ndim(b) > 0, per_step(b, e)
    cuts = 0
    for j in range(k):
        live = lengths > j
        if live.all():
            at: Any = slice(None)
        else:
            _pad(S, loc, ~live, j)
            at = np.flatnonzero(live)
            if at.size == 0:
                continue
        x = S[at, j]
        f, ok = ctx.cheap_field(x, at, ctx.steps[at, j])
        if G is not None:
            G[at, j] = f
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite mean or state: cut_blown below
            if correction is not None:
                f = f + correction[at]
            mean = (x if a is None else a[at, j] * x) + (b[at, j] if each else b) * f
            loc[at, j] = mean
            S[at, j + 1] = mean + noise[at, j]
        if not ok.all():
            bad = np.arange(R)[at][~ok]  # the draft stops at s_j
            lengths[bad] = j
            _pad(S, loc, bad, j)
            cuts += int(bad.size)
        cuts += cut_blown(S, loc, lengths, j, at)  # before the next call
    return cuts


class CheapDraft(Draft):
    """Draft with a cheap model's field, called once per drafted step on the rows that still draft
    (the domain's context calls it: ``ctx.cheap_field``)."""

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        return None, cheap_steps(ctx, S, loc, noise, lengths)


class FrozenDraft(Draft):
    """Draft with the target's field at the last state scored and moved on from, held over the k
    steps: no call, vectorised over rows and steps. A row's first round drafts nothing (no field
    known yet). ``hold`` says what is held, ``draft_steps`` how the k steps follow from it (by
    default the field itself, constant: its part of every mean is formed once per round)."""

    #: whether ``hold`` reads the reference state and its step (else the memory keeps neither)
    reads_state: ClassVar[bool] = False

    def start(self, X0):
        return Reference.empty(X0, state=self.reads_state)

    def hold(self, ctx: DraftContext, memory: Reference, rows: np.ndarray) -> np.ndarray:
        """What is held over the round's k steps (default: the target's field at the reference)."""
        return memory.f[rows]

    def draft_steps(self, ctx: DraftContext, held: np.ndarray, S: np.ndarray, loc: np.ndarray,
                    noise: np.ndarray) -> None:
        """Fill ``S[:, 1:]`` and ``loc`` (every row) given ``held``: by default the held field's part
        of every mean, ``b f``, is formed once per round, and each step adds ``a x`` to it."""
        a, b = ctx.mean_coefficients()
        e = held.ndim - 1
        one = not _ndim(b)  # one coefficient for every step: one drift
        drift = b * held if one else per_step(b, e) * held[:, None]  # [R, *event] or [R, k, *event]
        if a is None and held.size <= RUNNING_SUM:
            # x + b f with a few numbers a step: the k steps are one running sum, s_0 + b f + noise_0 +
            # b f + noise_1 ..., which np.add.accumulate adds left to right: the steps' own additions
            # in their order, in one call instead of 2 k
            run = np.empty((held.shape[0], 2 * loc.shape[1] + 1, *held.shape[1:]), S.dtype)
            run[:, 0] = S[:, 0]
            run[:, 1::2] = drift[:, None] if one else drift
            run[:, 2::2] = noise
            np.add.accumulate(run, axis=1, out=run)  # s_0, loc_0, s_1, loc_1, ..., s_k
            loc[:] = run[:, 1::2]
            S[:, 1:] = run[:, 2::2]
            return
        scales = repeat(None) if a is None else per_step(a, e).swapaxes(0, 1)
        drifts = repeat(drift) if one else drift.swapaxes(0, 1)
        xs = S.swapaxes(0, 1)  # s_0 .. s_k, each [R, *event]; the k steps, one after the other:
        for x, x1, m, z, a_j, d_j in zip(xs, xs[1:], loc.swapaxes(0, 1), noise.swapaxes(0, 1), scales, drifts,
                                         strict=False):
            np.add(x if a_j is None else a_j * x, d_j, out=m)
            np.add(m, z, out=x1)

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0  # no target field known yet: a plain step
        k = loc.shape[1]
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is cut just below
            self.draft_steps(ctx, self.hold(ctx, memory, rows), S, loc, noise)
        cuts = 0
        if k and not np.isfinite(S).all():
            for j in range(k):
                cuts += cut_blown(S, loc, lengths, j)
        return None, cuts

    def advance(self, memory, rows, last, S, steps, f, extra, lengths):
        memory.f[rows], memory.known[rows] = f, True
        if memory.x is not None:
            i = np.arange(len(rows))
            memory.x[rows], memory.step[rows] = S[i, last], steps[i, last]


class FrozenCorrection(Draft):
    """A cheap model plus a frozen correction: ``cheap(x) + f(x_ref) - cheap(x_ref)``, x_ref the state
    the row's last transition started from (scored by the previous round: no extra target call). The
    cheap part moves with x, the frozen target-minus-cheap gap corrects it (the multiple-time-step,
    RESPA, idea as a draft)."""

    def start(self, X0):
        return Reference.empty(X0, cheap=True)

    def propose(self, ctx, memory, rows, S, loc, noise, lengths):
        lengths[~memory.known[rows]] = 0  # no target field known yet: a plain step
        fresh = np.flatnonzero((lengths > 0) & ~memory.has_g[rows])
        if fresh.size:  # cheap(x_ref), once per reference, for the rows that draft
            r = rows[fresh]
            g, ok = ctx.cheap_field(memory.x[r], fresh, memory.step[r])
            ok &= finite_rows(g)
            memory.g[r], memory.has_g[r] = np.where(ok.reshape(ok.shape + (1,) * (g.ndim - 1)), g, 0.0), ok
            lengths[fresh[~ok]] = 0
        with np.errstate(over="ignore", invalid="ignore"):
            correction = memory.f[rows] - memory.g[rows]  # [R, *event]
        G = np.zeros_like(S)  # the cheap field at s_0 .. s_{k-1}: the next reference's
        return G, cheap_steps(ctx, S, loc, noise, lengths, correction, G)

    def advance(self, memory, rows, last, S, steps, f, G, lengths):
        i = np.arange(len(rows))
        memory.f[rows], memory.x[rows], memory.step[rows] = f, S[i, last], steps[i, last]
        memory.known[rows] = True
        memory.g[rows] = G[i, last]
        memory.has_g[rows] = last < lengths  # the cheap field was computed (and finite) at s_last


@dataclass
class Round:
    """The state of one round (``Proposal.context``): what ``propose`` drafted, and what ``score``
    computes for ``commit``."""

    S: np.ndarray  #: [R, k+1, *event] the committed state s_0 and the drafted s_1 .. s_k
    steps: np.ndarray  #: int64 [R, k+1] the step each position starts
    lengths: np.ndarray  #: int64 [R] drafted steps per row (lowered in place by score)
    extra: Any = None  #: the draft's own (FrozenCorrection: the cheap field at s_0 .. s_{k-1})
    out: np.ndarray | None = None  #: [N, *event] the score call's raw outputs, the scored s_j in row order
    f: np.ndarray | None = None  #: [N, *event] the target's field at those states
    offset: np.ndarray | None = None  #: int64 [R]: where row r's s_0 sits among them (s_j at offset[r] + j)
    M: np.ndarray | None = None  #: [R, k+1, *event] the target's means as computed (0 where not scored)
    first_bad: np.ndarray | None = None  #: int [R]: the first s_j whose target step is undefined (k+1: none)


def propose_round(draft: Draft, ctx: DraftContext, memory: Any, rows: np.ndarray, X: np.ndarray,
                  lengths: np.ndarray, scale: Any, rng: np.random.Generator, stats: DriftStats) -> Proposal:
    """One round's proposal: the committed states ``X[rows]`` and the ``k = ctx.steps.shape[1] - 1``
    steps ``draft`` drafts from them (at most ``lengths`` per row, lowered where it stops), with fresh
    noise of ``scale`` (a number, or an array broadcasting against ``[R, k, *event]``) drawn from
    ``rng``; the draft means as a Normal of that scale, the round's record in the context."""
    R, k = len(rows), ctx.steps.shape[1] - 1
    S = np.empty((R, k + 1, *X.shape[1:]))  # s_0 .. s_k
    S[:, 0] = X[rows]
    loc = np.empty((R, k, *X.shape[1:]))  # the draft means
    noise = scale * rng.standard_normal(loc.shape)  # fresh every round
    extra, cuts = draft.propose(ctx, memory, rows, S, loc, noise, lengths)
    stats.draft_truncations += cuts
    dists = Normal(loc, scale, batch_ndims=2, validate=False)
    return Proposal(outcomes=S[:, 1:], dists=dists, lengths=lengths, context=Round(S, ctx.steps, lengths, extra))


def score_batch(ctx: Round) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the target scores in the round's one call: s_0 .. s_L of every row, in row order. Returns
    (which, bool ``[R, k+1]``; the states ``[N, *event]``; their steps ``[N]``) and sets ``ctx.offset``."""
    K1 = ctx.steps.shape[1]
    scored = np.arange(K1)[None, :] <= ctx.lengths[:, None]  # [R, k+1]: s_0 .. s_L
    n = ctx.lengths + 1  # states scored per row
    ctx.offset = np.cumsum(n) - n  # row r's s_0 in the batch
    return scored, ctx.S[scored], ctx.steps[scored]


def far_from_target(M: np.ndarray, loc: np.ndarray, scale: Any) -> np.ndarray:
    """Bool ``[R, k]``: the drafted steps (draft means ``loc`` ``[R, k, *event]``) too far from the
    target's (means ``M`` ``[R, k, *event]``) to verify: a squared whitened distance beyond
    :data:`FAR` (or not finite), or a draft mean beyond :data:`NOISE_LOST` times ``scale`` (a
    number, or one per step ``[R, k]``)."""
    R, K = loc.shape[:2]
    s = scale.reshape((R, K) + (1,) * (loc.ndim - 2)) if _ndim(scale) else scale
    with np.errstate(over="ignore", invalid="ignore"):
        e = ((M - loc) / s).reshape(R, K, -1)  # the whitened distance of the means
        d2 = np.einsum("rkj,rkj->rk", e, e)
        big = np.abs(loc).reshape(R, K, -1).max(axis=2)  # the draft's noise lost in rounding
        return ~((d2 < FAR) & (big < NOISE_LOST * scale))


def check_drafts(ctx: Round, M: np.ndarray, ok: np.ndarray, loc: np.ndarray, scale: Any,
                 stats: DriftStats) -> np.ndarray:
    """After the target's call: ``M`` ``[R, k+1, *event]`` its means, ``ok`` bool ``[R, k+1]`` where
    its step is defined (scored, finite). Keeps the means as computed in ``ctx.M`` (for commit and its
    error messages) and the first undefined step of each row in ``ctx.first_bad``; cuts each row's
    drafts (``ctx.lengths``, in place: the proposal's, which the verifier reads) before that step
    (reaching it raises in commit either way) and before the first draft too far from the target to
    verify (:func:`far_from_target`; kept with probability 0 anyway: the target's step is drawn there
    instead). Both cuts depend on s_0 .. s_j only, not on the draft of step j+1, so the chain stays
    exact (proofs/05: a draft's length may depend on the drafted prefix). Returns ``M`` with 0 where
    undefined (placeholders: a step used only if s_j is reached, and then commit raises)."""
    lengths = ctx.lengths
    K1 = ok.shape[1]
    if ok.all():
        ctx.first_bad, ctx.M = np.full(len(ok), K1), M
    else:
        ctx.first_bad, ctx.M = np.where(ok.all(axis=1), K1, np.argmin(ok, axis=1)), M.copy()
        M[~ok] = 0.0
    cut = np.minimum(lengths, ctx.first_bad)
    if K1 > 1:
        far = far_from_target(M[:, :-1], loc, scale) & (np.arange(K1 - 1)[None, :] < cut[:, None])
        if far.any():
            cut = np.where(far.any(axis=1), np.minimum(cut, np.argmax(far, axis=1)), cut)
    short = cut < lengths
    if short.any():
        stats.draft_truncations += int(short.sum())
        lengths[:] = cut
    return M
