"""Speculative diffusion sampling: the reverse chain as a Process of the core round loop.

One round, for every active row (sample):
  propose: k denoising steps with the draft, s_{j+1} ~ Normal(a x + b eps_draft, sigma_j) with the
           scale sigma_j of the row's own step (the draft kinds are the classes of ``drafts.py``); a
           row drafts at most the steps it still needs minus one, and never a deterministic step;
  score:   the target denoiser at the states s_0 .. s_L of all rows in ONE call (batch = rows x
           positions, each state at its own time, with the row's label; guidance doubles the batch
           inside that call);
  verify:  the core (speculate.rounds.run) compares Normal(a x + b eps_target, sigma_j) with the
           draft's Normal of the same per-position scale by reflection maximal coupling (the Gaussian
           kernel): a drafted step is kept with probability 2 Phi(-delta_j / 2), delta_j =
           |b_j| |eps_draft - eps_target| / sigma_j; the first rejected step is replaced by its
           reflection, and when all are kept a bonus step is drawn from the target;
  commit:  keep the accepted states and the verifier's one; a deterministic step (sigma = 0: the
           last step of every sampler) is only ever the verifier's draw at a row's last position,
           and is taken as the target's mean there (the kernel's draw at that position, made with a
           placeholder unit scale, is discarded).
The output is distributed exactly as ``sample`` (the same chain, step by step, with the target).

The process keeps the long-lived state only (committed states, step indices, labels, the draft's
memory, the recorded path, the stats it counts into); one round's state (drafted states, the
target's eps and means) travels in the proposal's context, a :class:`Round`.

Example:
    >>> import numpy as np
    >>> from speculate.domains.diffusion import DDPM, speculative_sample
    >>> from speculate.domains.diffusion.marginal_law import GaussianData
    >>> sched = DDPM(timesteps=50)
    >>> target = GaussianData(mean=[1.0, -1.0], std=0.5).denoiser(sched)
    >>> x, stats = speculative_sample(sched, target, "frozen", shape=(8, 2), lookahead=4, rng=0)
    >>> x.shape, stats.target_calls < 50, stats.calls_per_step < 1
    ((8, 2), True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from speculate import Normal, Stats
from speculate.rounds import Proposal, Verdict

from .denoisers import Denoiser
from .drafts import Draft, DraftContext, col, finite_rows, step_means
from .samplers import Plan

__all__ = ["DiffusionProcess", "DiffusionStats", "Round", "nonfinite_error"]

FAR = 1e300
"""A drafted step whose squared whitened distance to the target's is beyond this (or not finite) is
not verified (its acceptance probability is 0 in float64 and the coupling's arithmetic would
overflow): the target's step is drawn there instead."""


@dataclass
class DiffusionStats(Stats):
    """The counters of a run: those of ``speculate.Stats`` and the sampler's own.

    ``target_calls`` counts sequential calls of the target denoiser (each call scores many states);
    ``calls_per_step`` = target_calls / steps (1 for plain sampling); ``target_evaluations`` the
    network evaluations inside them (states scored, twice with guidance); ``proposed_by_step[i]``,
    ``accepted_by_step[i]`` and ``rejected_by_step[i]`` count the drafted steps at step i of the plan
    (model time ``step_times[i]``) that were verified, kept, and rejected (the first rejected step of
    a block; the drafted steps after it were never tested), over all samples: ``acceptance_by_step``
    = kept / (kept + rejected) is the per-draft acceptance alpha_t of theory at each step, what the
    coupling keeps with probability 2 Phi(-delta_t / 2). A plain run counts
    as rounds without drafts (k = 0).
    """

    #: Stats.merge: steps per sample, and the plan's times (a label), are not summed
    _not_summed: ClassVar[tuple[str, ...]] = ("steps", "step_times")
    steps: int = 0  #: steps per sample (the plan's length S)
    samples: int = 0  #: B
    target_evaluations: int = 0
    draft_evaluations: int = 0
    draft_truncations: int = 0  #: drafts cut short: a non-finite draft, or (in score) an undefined target step
    wall_time: float = 0.0
    step_times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proposed_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    accepted_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rejected_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rounds_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  #: row-rounds starting at step i
    lookahead_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  #: the sum of their k

    @property
    def calls_per_step(self) -> float:
        """Sequential target calls per denoising step (plain sampling: 1)."""
        return self.target_calls / self.steps if self.steps else float("nan")

    @property
    def acceptance_by_step(self) -> np.ndarray:
        """Kept / (kept + rejected) drafted steps at each step of the plan: the per-draft acceptance
        (NaN where no drafted step was tested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.accepted_by_step / (self.accepted_by_step + self.rejected_by_step)

    @property
    def lookahead_at_step(self) -> np.ndarray:
        """The mean lookahead k of the rounds that started at each step of the plan (what
        ``lookahead="auto"`` chose there; NaN where no round started)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.lookahead_by_step / self.rounds_by_step

    def extras(self) -> dict[str, Any]:
        out = {k: v for k, v in super().extras().items() if not isinstance(v, np.ndarray)}
        out["calls_per_step"] = self.calls_per_step
        return out

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["calls_per_step"] = self.calls_per_step
        for name in ("acceptance_by_step", "lookahead_at_step"):
            out[name] = [None if np.isnan(v) else float(v) for v in getattr(self, name)]
        return out


@dataclass
class Round:
    """The state of one round (``Proposal.context``): what ``propose`` drafted, and what ``score``
    computes for ``commit``."""

    S: np.ndarray  #: [R, k+1, *shape] the committed state s_0 and the drafted s_1 .. s_k
    steps: np.ndarray  #: int64 [R, k+1] the plan index of the step that starts at s_j (clipped to S-1)
    lengths: np.ndarray  #: int64 [R] drafted steps per row (lowered in place by score)
    extra: Any = None  #: the draft's own (FrozenCorrection: the cheap eps at s_0 .. s_{k-1})
    eps: np.ndarray | None = None  #: [N, *shape] the target's eps at the scored states, in row order
    offset: np.ndarray | None = None  #: int64 [R]: where row r's s_0 sits among them (s_j at offset[r] + j)
    M: np.ndarray | None = None  #: [R, k+1, *shape] the target's means (0 where not scored or not defined)
    first_bad: np.ndarray | None = None  #: int [R]: the first s_j whose target step is undefined (k+1: none)
    out: np.ndarray | None = None  #: [N, *shape] the score call's raw outputs (for error messages)


def nonfinite_error(who: str, out: np.ndarray, t: int, sample: int) -> ValueError:
    """A ValueError naming the time, the sample and the first bad entry of a non-finite output."""
    bad = np.argwhere(~np.isfinite(out))
    where = f" at index {tuple(int(i) for i in bad[0])} ({out[tuple(bad[0])]})" if bad.size else ""
    return ValueError(f"{who} is not finite at t = {t} (sample {sample}){where}, or the step's mean overflows; "
                      "the chain reached a state where the denoiser is not defined")


class DiffusionProcess:
    """B samples of the reverse chain of ``plan``: the Process protocol of the round loop.

    Long-lived state per row: the committed state, its plan index (0..S), its label and the draft's
    memory; ``record`` (state indices, 0..S) says which states go to ``path``; ``stats`` counts
    the scored states, the truncated drafts and the acceptance by step.
    """

    def __init__(self, plan: Plan, target: Denoiser, draft: Draft, draft_fn: Denoiser | None, X0: np.ndarray,
                 labels: np.ndarray | None, record: np.ndarray, stats: DiffusionStats) -> None:
        self.plan, self.target, self.draft, self.draft_fn = plan, target, draft, draft_fn
        self.X = X0.copy()  # [B, *shape] committed
        self.step = np.zeros(X0.shape[0], np.int64)
        self.labels, self.stats = labels, stats
        self.memory = draft.start(X0)
        S = len(plan.times)
        det = np.flatnonzero(plan.sigma == 0)  # the deterministic steps
        # free[i]: steps from i before the next deterministic one (a row never drafts across one)
        self.free = np.append(det, S)[np.searchsorted(det, np.arange(S))] - np.arange(S)
        self.scale = np.where(plan.sigma > 0, plan.sigma, 1.0)  # 1.0: a placeholder, never used (see commit)
        self.record = record
        self.path = {int(s): np.empty_like(X0) for s in record}
        if 0 in self.path:
            self.path[0][:] = X0

    def propose(self, rows: np.ndarray, k: int, branches: int, need: np.ndarray,
                rng: np.random.Generator) -> Proposal:
        if branches != 1:
            raise ValueError("speculative_sample drafts one branch per round (branches=1)")
        R, shape = len(rows), self.X.shape[1:]
        e = len(shape)
        i0 = self.step[rows]
        steps = np.minimum(i0[:, None] + np.arange(k + 1)[None, :], len(self.plan.times) - 1)  # [R, k+1]
        lengths = np.minimum(np.minimum(need - 1, k), self.free[i0]).astype(np.int64)
        S = np.empty((R, k + 1, *shape))
        S[:, 0] = self.X[rows]
        loc = np.empty((R, k, *shape))
        scale_q = col(self.scale[steps[:, :k]], e)  # [R, k, 1, ...]: the row's own step scales
        noise = scale_q * rng.standard_normal(loc.shape)  # fresh every round
        labels = None if self.labels is None else self.labels[rows]
        ctx = DraftContext(self.plan, steps, labels, self.draft_fn)
        before = self.draft_fn.evaluations if self.draft_fn is not None else 0
        extra, cuts = self.draft.propose(ctx, self.memory, rows, S, loc, noise, lengths)
        if self.draft_fn is not None:
            self.stats.draft_evaluations += self.draft_fn.evaluations - before
        self.stats.draft_truncations += cuts
        dists = Normal(loc, scale_q, batch_ndims=2, validate=False)
        return Proposal(outcomes=S[:, 1:], dists=dists, lengths=lengths, context=Round(S, steps, lengths, extra))

    def score(self, rows: np.ndarray, proposal: Proposal) -> Normal:
        ctx: Round = proposal.context
        S, steps, lengths = ctx.S, ctx.steps, ctx.lengths
        R, K1 = steps.shape
        e = S.ndim - 2
        scored = np.arange(K1)[None, :] <= lengths[:, None]  # [R, k+1]: s_0 .. s_L
        Xb, idx = S[scored], steps[scored]  # [N, *shape] in row order
        labels = None if self.labels is None else np.repeat(self.labels[rows], scored.sum(axis=1))
        before = self.target.evaluations
        out, finite = self.target(Xb, self.plan.times[idx], labels)  # ONE call
        self.stats.target_evaluations += self.target.evaluations - before
        mean, eps = step_means(self.plan, idx, Xb, out)
        ok = np.ones((R, K1), bool)  # the step from s_j is defined: finite output and mean
        ok[scored] = finite & finite_rows(mean)
        if not ok[:, 0].all():  # the committed state: needed now
            i = int(np.argmin(ok[:, 0]))
            b = int(scored[:i].sum())
            raise nonfinite_error("the target denoiser's output", out[b], int(self.plan.times[steps[i, 0]]),
                                  int(rows[i]))
        all_ok = bool(ok.all())
        ctx.first_bad = np.full(R, K1) if all_ok else np.where(ok.all(axis=1), K1, np.argmin(ok, axis=1))
        M = np.zeros_like(S)
        M[scored] = mean
        if not all_ok:
            M[~ok] = 0.0  # placeholders: a step used only if s_j is reached, and then commit raises
        # Drafts are verified only up to the first s_j whose target step is undefined and before a
        # draft so far from the target that the coupling's arithmetic would overflow (kept with
        # probability 0 anyway). Both cuts depend on s_0 .. s_j only, not on the draft of step j+1,
        # so the chain stays exact (proofs/05: a draft's length may depend on the drafted prefix).
        cut = np.minimum(lengths, ctx.first_bad)
        if K1 > 1:
            with np.errstate(over="ignore", invalid="ignore"):
                diff = M[:, :-1] - proposal.dists.loc
                d2 = np.square(diff, out=diff).reshape(R, K1 - 1, -1).sum(axis=2) / self.scale[steps[:, :-1]] ** 2
            far = ~(d2 < FAR) & (np.arange(K1 - 1)[None, :] < cut[:, None])
            if far.any():
                cut = np.where(far.any(axis=1), np.minimum(cut, np.argmax(far, axis=1)), cut)
        short = cut < lengths
        if short.any():
            self.stats.draft_truncations += int(short.sum())
            lengths[:] = cut  # in place: the proposal's lengths, which the verifier reads
        ctx.M, ctx.eps, ctx.out = M, eps, out
        ctx.offset = np.concatenate([[0], np.cumsum(scored.sum(axis=1))[:-1]])  # row r's s_0 in the batch
        return Normal(M, col(self.scale[steps], e), batch_ndims=2, validate=False)

    def commit(self, rows: np.ndarray, proposal: Proposal, verdict: Verdict) -> tuple[np.ndarray, None]:
        ctx: Round = proposal.context
        n = verdict.n_accepted  # [R]: the last transition started from s_n
        R = len(rows)
        i = np.arange(R)
        bad = np.flatnonzero(ctx.first_bad <= n)  # a row reached an undefined step
        if bad.size:
            r = int(bad[0])
            j = int(ctx.first_bad[r])
            b = int(ctx.offset[r]) + j
            raise nonfinite_error("the target denoiser's output", ctx.out[b], int(self.plan.times[ctx.steps[r, j]]),
                                  int(rows[r]))
        E = verdict.outcomes  # [R, k+1, *shape]: s_1 .. s_n, then the verifier's at n
        last = ctx.steps[i, n]
        new = E[i, n].copy()
        det = self.plan.sigma[last] == 0
        if det.any():  # a deterministic step: the target's mean (only ever the verifier's draw at L)
            new[det] = ctx.M[i[det], n[det]]
        i0 = self.step[rows]
        for s, store in self.path.items():  # state s is the (s - i0 - 1)-th outcome of the row's block
            j = s - i0 - 1
            hit = (j >= 0) & (j <= n)
            if hit.any():
                h = np.flatnonzero(hit)
                store[rows[h]] = np.where(col(j[h] == n[h], new.ndim - 1), new[h], E[h, np.minimum(j[h], n[h])])
        k = ctx.steps.shape[1] - 1
        S = len(self.plan.times)
        self.stats.rounds_by_step += np.bincount(i0, minlength=S)
        self.stats.lookahead_by_step += k * np.bincount(i0, minlength=S)
        if k:
            lengths = np.asarray(proposal.lengths)  # as verified
            pos = np.arange(k)[None, :]
            self.stats.proposed_by_step += np.bincount(ctx.steps[:, :k][pos < lengths[:, None]], minlength=S)
            self.stats.accepted_by_step += np.bincount(ctx.steps[:, :k][pos < n[:, None]], minlength=S)
            rejected = n < lengths  # the verifier replaced the drafted step at position n
            self.stats.rejected_by_step += np.bincount(ctx.steps[rejected, n[rejected]], minlength=S)
        self.X[rows] = new
        self.draft.advance(self.memory, rows, n, ctx.S, ctx.steps, ctx.eps[ctx.offset + n], ctx.extra, ctx.lengths)
        self.step[rows] += n + 1
        return n + 1, None
