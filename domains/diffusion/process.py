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
target's eps and means) travels in the proposal's context, a :class:`Round`. The round's record,
the proposal, the cuts of drafts that cannot be verified and the stats' shared counters are
``speculate.domains.shared.gaussian_drift``'s (the physics domain's too); the denoiser's call, the
deterministic steps, the counters by step and the error messages are this domain's.

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
from typing import ClassVar

import numpy as np
from speculate.domains.shared.gaussian_drift import (
    DriftStats,
    Round,
    check_drafts,
    finite_rows,
    propose_round,
    score_batch,
)

from speculate import Normal
from speculate.rounds import Proposal, Verdict

from .denoisers import Denoiser
from .drafts import Draft, DraftContext, col, step_means
from .samplers import Plan

__all__ = ["DiffusionProcess", "DiffusionStats", "Round", "nonfinite_error"]


@dataclass
class DiffusionStats(DriftStats):
    """The counters of a run: those of ``speculate.Stats`` and the sampler's own.

    ``target_calls`` counts sequential calls of the target denoiser (each call scores many states);
    ``calls_per_step`` = target_calls / steps (1 for plain sampling); ``target_evaluations`` the
    network evaluations inside them (states scored, twice with guidance); ``proposed_by_step[i]``,
    ``accepted_by_step[i]`` and ``rejected_by_step[i]`` count the drafted steps at step i of the plan
    (model time ``step_times[i]``) that were verified, kept, and rejected (the first rejected step of
    a block; the drafted steps after it were never tested), over all samples: ``acceptance_by_step``
    = kept / (kept + rejected) is the per-draft acceptance alpha_t of theory at each step, what the
    coupling keeps with probability 2 Phi(-delta_t / 2). ``draft_truncations``: drafts cut short (a
    non-finite draft, or, in score, an undefined target step or a draft too far from the target to
    verify). ``steps`` is per sample, ``wall_time`` the seconds of the whole run. A plain run counts
    as rounds without drafts (k = 0).
    """

    #: Stats.merge: steps per sample, and the plan's times (a label), are not summed
    _not_summed: ClassVar[tuple[str, ...]] = ("steps", "step_times")
    samples: int = 0  #: B
    target_evaluations: int = 0
    draft_evaluations: int = 0
    step_times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proposed_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    accepted_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rejected_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rounds_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  #: row-rounds starting at step i
    lookahead_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  #: the sum of their k

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

    def as_dict(self) -> dict:
        out = super().as_dict()
        for name in ("acceptance_by_step", "lookahead_at_step"):
            out[name] = [None if np.isnan(v) else float(v) for v in getattr(self, name)]
        return out


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
        e = self.X.ndim - 1
        i0 = self.step[rows]
        steps = np.minimum(i0[:, None] + np.arange(k + 1)[None, :], len(self.plan.times) - 1)  # [R, k+1]
        lengths = np.minimum(np.minimum(need - 1, k), self.free[i0]).astype(np.int64)
        scale_q = col(self.scale[steps[:, :k]], e)  # [R, k, 1, ...]: the row's own step scales
        labels = None if self.labels is None else self.labels[rows]
        ctx = DraftContext(self.plan, steps, labels, self.draft_fn)
        before = self.draft_fn.evaluations if self.draft_fn is not None else 0
        proposal = propose_round(self.draft, ctx, self.memory, rows, self.X, lengths, scale_q, rng, self.stats)
        if self.draft_fn is not None:
            self.stats.draft_evaluations += self.draft_fn.evaluations - before
        return proposal

    def score(self, rows: np.ndarray, proposal: Proposal) -> Normal:
        ctx: Round = proposal.context
        S, steps = ctx.S, ctx.steps
        R, K1 = steps.shape
        e = S.ndim - 2
        scored, Xb, idx = score_batch(ctx)  # [N, *shape] in row order
        labels = None if self.labels is None else np.repeat(self.labels[rows], scored.sum(axis=1))
        before = self.target.evaluations
        out, finite = self.target(Xb, self.plan.times[idx], labels)  # ONE call
        self.stats.target_evaluations += self.target.evaluations - before
        mean, eps = step_means(self.plan, idx, Xb, out)
        ok = np.ones((R, K1), bool)  # the step from s_j is defined: finite output and mean
        ok[scored] = finite & finite_rows(mean)
        if not ok[:, 0].all():  # the committed state: needed now
            i = int(np.argmin(ok[:, 0]))
            b = int(ctx.offset[i])
            raise nonfinite_error("the target denoiser's output", out[b], int(self.plan.times[steps[i, 0]]),
                                  int(rows[i]))
        M = np.zeros_like(S)
        M[scored] = mean
        ctx.out, ctx.f = out, eps
        M = check_drafts(ctx, M, ok, proposal.dists.loc, self.scale[steps[:, :-1]], self.stats)
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
        self.draft.advance(self.memory, rows, n, ctx.S, ctx.steps, ctx.f[ctx.offset + n], ctx.extra, ctx.lengths)
        self.step[rows] += n + 1
        return n + 1, None
