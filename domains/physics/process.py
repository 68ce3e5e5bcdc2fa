"""Speculative Euler-Maruyama: the Langevin chain as a Process of the core round loop.

One round, for every active row (replica):
  propose: k Euler-Maruyama steps with the draft force, s_{i+1} ~ Normal(s_i + dt F_d / gamma, s)
           (the draft kinds are the classes of ``drafts.py``); a row drafts at most the steps it
           still needs minus one;
  score:   the exact force at the configurations s_0 .. s_L of all rows in ONE call;
  verify:  the core (speculate.rounds.run) compares Normal(s_i + dt F(s_i)/gamma, s) with the
           draft's Normal of the same scale by reflection maximal coupling: a draft step is kept
           with probability 2 Phi(-delta_i / 2), delta_i = sqrt(dt / (2 gamma kT)) |F_d - F(s_i)|;
           the first rejected step is replaced by its reflection (an exact draw of the target step)
           and when all k are kept a bonus step is drawn from the target at s_k;
  commit:  keep the accepted configurations and the verifier's one.
The output is distributed exactly as ``simulate`` (the Euler-Maruyama chain with the exact force):
exact for the discretised chain, not for the continuous SDE.

The process keeps the long-lived state only (committed configurations, step counters, the draft's
memory, the recorder, the stats it counts into); one round's state (drafted configurations, the
cheap and exact forces) travels in the proposal's context, a :class:`Round`.

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate
    >>> model = Langevin(force=DoubleWell(), draft_force="frozen", dt=1e-3)
    >>> sim = speculative_simulate(model, np.zeros((1, 1)), n_steps=200, lookahead=8, rng=0)
    >>> sim.positions.shape, sim.stats.calls_per_step < 0.3
    ((201, 1, 1), True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from speculate import Normal, Stats
from speculate.rounds import Proposal, Verdict

from .forces import evaluate_force, nonfinite_error, overflow_error, transition_means
from .langevin import Langevin, Recorder

__all__ = ["LangevinProcess", "Round", "SimulationStats"]

FAR = 1e300
"""A drafted step whose squared whitened distance to the target's, |dt (F_d - F) / gamma|^2 / s^2,
is beyond this is not verified (its acceptance probability is 0 in float64, and the coupling's
arithmetic would overflow): the target's step is drawn there instead."""


@dataclass
class SimulationStats(Stats):
    """The counters of a run: those of ``speculate.Stats`` and the simulation's own.

    ``target_calls`` counts calls of the exact force (each call may hold many configurations);
    ``calls_per_step`` = target_calls / steps is the sequential depth per simulated step (1 for
    plain simulation); ``acceptance_rate`` = accepted / proposed drafted steps; ``alpha`` =
    accepted / (accepted + rejections), the per-draft acceptance of theory;
    ``accepted_per_position[j]`` counts (row, round) pairs that kept exactly j drafts. A plain
    run counts as rounds without drafts (k = 0).
    """

    steps: int = 0  #: steps per replica
    _not_summed: ClassVar[tuple[str, ...]] = ("steps",)  #: Stats.merge: per replica, not summed
    target_configurations: int = 0  #: configurations the exact force was evaluated at
    wall_time: float = 0.0  #: seconds for the whole run
    draft_truncations: int = 0  #: drafts cut short: a non-finite draft force or overflowing draft, or (in score)
    #: an undefined exact step or a draft too far from the target to verify (see LangevinProcess.score)

    @property
    def calls_per_step(self) -> float:
        """Sequential calls of the exact force per simulated step."""
        return self.target_calls / self.steps if self.steps else float("nan")

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall_time if self.wall_time > 0 else float("nan")

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["calls_per_step"], out["steps_per_second"] = self.calls_per_step, self.steps_per_second
        return out

    def summary(self) -> str:
        return f"{super().summary()} calls_per_step={self.calls_per_step:.4g}"


@dataclass
class Round:
    """The state of one round (``Proposal.context``): what ``propose`` drafted, and what ``score``
    computes for ``commit``."""

    S: np.ndarray  #: [R, k+1, N, d] the committed configuration s_0 and the drafted s_1 .. s_k
    lengths: np.ndarray  #: int64 [R] drafted steps per row
    extra: Any = None  #: the draft's own (FrozenCorrection: the cheap forces [R, k+1, N, d])
    F: np.ndarray | None = None  #: [R, k+1, N, d] exact forces (0 where not scored or not finite)
    Fb: np.ndarray | None = None  #: [M, N, d] the score call's output, the scored s_i in row order
    M: np.ndarray | None = None  #: [R, k+1, N, d] the target means as computed (for error messages)
    scored: np.ndarray | None = None  #: bool [R, k+1]: s_i scored (i <= lengths)
    first_bad: np.ndarray | None = None  #: int [R]: the first s_i whose step is undefined (k+1: none)


class LangevinProcess:
    """B replicas of the Euler-Maruyama chain of ``model``: the Process protocol of the round loop.

    Long-lived state per row: the committed configuration, its step, and the draft's memory (for
    the frozen drafts, the last exact force the row has moved on from). ``recorder`` receives every
    committed configuration; ``stats`` counts the scored configurations and the truncated drafts.
    """

    def __init__(self, model: Langevin, X0: np.ndarray, recorder: Recorder, stats: SimulationStats) -> None:
        B = X0.shape[0]
        self.model, self.recorder, self.stats = model, recorder, stats
        self.X = X0.copy()  # [B, N, d] committed
        self.step = np.zeros(B, np.int64)
        self.draft = model.draft
        self.memory = self.draft.start(X0)
        self.scale = model.noise_scale

    def propose(
        self, rows: np.ndarray, k: int, branches: int, need: np.ndarray, rng: np.random.Generator
    ) -> Proposal:
        if branches != 1:
            raise ValueError("speculative_simulate drafts one branch per round (branches=1)")
        R = len(rows)
        S = np.empty((R, k + 1, *self.X.shape[1:]))  # [R, k+1, N, d] s_0 .. s_k
        S[:, 0] = self.X[rows]
        loc = np.empty((R, k, *self.X.shape[1:]))  # [R, k, N, d] draft means
        lengths = np.minimum(need - 1, k).astype(np.int64)  # never more than a row can use
        noise = self.scale * rng.standard_normal(loc.shape)  # [R, k, N, d]
        extra, cuts = self.draft.propose(self.model, self.memory, rows, self.step[rows], S, loc, noise, lengths)
        self.stats.draft_truncations += cuts
        dists = Normal(loc, self.scale, batch_ndims=2, validate=False)
        return Proposal(outcomes=S[:, 1:], dists=dists, lengths=lengths, context=Round(S, lengths, extra))

    def score(self, rows: np.ndarray, proposal: Proposal) -> Normal:
        ctx: Round = proposal.context
        S, lengths = ctx.S, ctx.lengths
        R, K1 = S.shape[:2]
        scored = np.arange(K1)[None, :] <= lengths[:, None]  # [R, k+1]: s_0 .. s_L
        Xb = S[scored]  # [M, N, d], M <= R (k+1): a fresh array, the force's own (not read again)
        steps = (self.step[rows][:, None] + np.arange(K1)[None, :])[scored]
        Fb, finite = evaluate_force(self.model.force, Xb, who="force", steps=steps, private=True)  # ONE call
        self.stats.target_configurations += Xb.shape[0]
        F = np.zeros_like(S)  # [R, k+1, N, d]
        F[scored] = Fb
        M, defined = transition_means(self.model, S, F)  # [R, k+1, N, d] target means, [R, k+1]
        ok = np.ones((R, K1), bool)  # the step from s_i is defined: finite force and mean
        ok[scored] = finite & defined[scored]
        if not ok[:, 0].all():  # the committed state: needed now
            i = int(np.argmin(ok[:, 0]))
            b = int(scored[:i].sum())  # row i's s_0 in the batch
            step, row = int(self.step[rows[i]]), int(rows[i])
            raise nonfinite_error("force", Fb, b, step, row) if not finite[b] else overflow_error(M[i], 0, step, row)
        ctx.first_bad = np.where(ok.all(1), K1, np.argmin(ok, axis=1))
        ctx.M = M.copy() if not ok.all() else M  # the means as computed, for commit's error message
        F[~ok] = 0.0
        M[~ok] = 0.0  # placeholders: a transition used only if s_i is reached, and then commit raises
        # Drafts are verified only up to the first s_i whose step is undefined (reaching s_i raises
        # in commit either way) and before a draft so far from the target that the coupling's
        # arithmetic would overflow (kept with probability 0 anyway; the target's step is drawn
        # there instead). Both cuts depend on s_0 .. s_i only, not on the draft of step i+1, so the
        # chain stays exact (proofs/05: a draft's length may depend on the drafted prefix).
        cut = np.minimum(lengths, ctx.first_bad)
        if K1 > 1:
            loc = proposal.dists.loc  # [R, k, N, d] the draft means
            with np.errstate(over="ignore", invalid="ignore"):
                e = (M[:, :-1] - loc) / self.scale  # the whitened distance of the means
                d2 = np.einsum("rkij,rkij->rk", e, e)
                big = np.abs(loc).reshape(R, K1 - 1, -1).max(axis=2)  # the draft's noise lost in rounding
            far = ~((d2 < FAR) & (big < 1e150 * self.scale)) & (np.arange(K1 - 1)[None, :] < cut[:, None])
            if far.any():
                cut = np.where(far.any(1), np.minimum(cut, np.argmax(far, axis=1)), cut)
        short = cut < lengths
        if short.any():
            self.stats.draft_truncations += int(short.sum())
            lengths[:] = cut  # in place: the proposal's lengths, which the verifier reads
        ctx.F, ctx.Fb, ctx.scored = F, Fb, scored
        return Normal(M, self.scale, batch_ndims=2, validate=False)

    def commit(self, rows: np.ndarray, proposal: Proposal, verdict: Verdict) -> tuple[np.ndarray, None]:
        ctx: Round = proposal.context
        last = verdict.n_accepted  # [R] the last transition started from s_last
        bad = np.flatnonzero(ctx.first_bad <= last)  # a row reached an undefined step
        if bad.size:
            i = int(bad[0])
            b = int(ctx.scored[:i].sum() + ctx.first_bad[i])
            step, row = int(self.step[rows[i]] + ctx.first_bad[i]), int(rows[i])
            if not np.isfinite(ctx.Fb[b]).all():
                raise nonfinite_error("force", ctx.Fb, b, step, row)
            raise overflow_error(ctx.M[i], int(ctx.first_bad[i]), step, row)
        n = last + 1  # steps taken: the kept drafts and the verifier's configuration
        E = verdict.outcomes  # [R, k+1, N, d]: s_1 .. s_last, then the verifier's at last
        steps = self.step[rows]
        every = self.recorder.every
        rec = (steps + n) // every > steps // every  # a recorded step in the block
        if rec.all():
            self.recorder.record_block(rows, steps, E, n)
        elif rec.any():
            g = np.flatnonzero(rec)
            self.recorder.record_block(rows[g], steps[g], E[g], n[g])
        self.X[rows] = E[np.arange(len(rows)), last]
        self.draft.advance(self.memory, rows, last, ctx.S, ctx.F, ctx.extra, ctx.lengths)
        self.step[rows] += n
        return n, None
