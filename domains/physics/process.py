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
cheap and exact forces) travels in the proposal's context, a :class:`Round`. The round's record,
the proposal, the cuts of drafts that cannot be verified and the stats' shared counters are
``speculate.domains.shared.gaussian_drift``'s (the diffusion domain's too); the exact force's call,
its checks and its error messages are this domain's.

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
from typing import Any

import numpy as np
from speculate.domains.shared.gaussian_drift import DriftStats, Round, check_drafts, propose_round, score_batch

from speculate import Normal
from speculate.rounds import Proposal, Verdict

from .drafts import DraftContext
from .forces import evaluate_force, nonfinite_error, overflow_error, transition_means
from .langevin import Langevin, Recorder

__all__ = ["LangevinProcess", "Round", "SimulationStats"]

_UNSET = object()  # no draft memory built yet


@dataclass
class SimulationStats(DriftStats):
    """The counters of a run: those of ``speculate.Stats`` and the simulation's own.

    ``target_calls`` counts calls of the exact force (each call may hold many configurations);
    ``calls_per_step`` = target_calls / steps is the sequential depth per simulated step (1 for
    plain simulation); ``acceptance_rate`` = accepted / proposed drafted steps; ``alpha`` =
    accepted / (accepted + rejections), the per-draft acceptance of theory;
    ``accepted_per_position[j]`` counts (row, round) pairs that kept exactly j drafts;
    ``draft_truncations``: drafts cut short (a non-finite draft force or overflowing draft, or, in
    score, an undefined exact step or a draft too far from the target to verify). ``steps`` is per
    replica, ``wall_time`` the seconds of the whole run. A plain run counts as rounds without
    drafts (k = 0).
    """

    target_configurations: int = 0  #: configurations the exact force was evaluated at

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall_time if self.wall_time > 0 else float("nan")

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["steps_per_second"] = self.steps_per_second
        return out


class LangevinProcess:
    """B replicas of the Euler-Maruyama chain of ``model``: the Process protocol of the round loop.

    Long-lived state per row: the committed configuration, its step, and the draft's memory (for
    the frozen drafts, the last exact force the row has moved on from). ``recorder`` receives every
    committed configuration; ``stats`` counts the scored configurations and the truncated drafts.
    """

    def __init__(self, model: Langevin, X0: np.ndarray, recorder: Recorder, stats: SimulationStats,
                 keep_outcomes: bool = True) -> None:
        B = X0.shape[0]
        self.model, self.recorder, self.stats = model, recorder, stats
        self.keep_outcomes = keep_outcomes  # False: plain stretches return no outcomes (the recorder has them)
        self.X = X0.copy()  # [B, N, d] committed
        self.step = np.zeros(B, np.int64)
        self.draft = model.draft
        self._memory: Any = _UNSET  # the draft's memory, started by the first drafting round
        self.scale = model.noise_scale

    @property
    def memory(self) -> Any:
        """The draft's per-row memory (``Draft.start``), built when a round first drafts: a run that
        ``lookahead="auto"`` keeps plain throughout never builds it."""
        if self._memory is _UNSET:
            self._memory = self.draft.start(self.X)
        return self._memory

    def propose(
        self, rows: np.ndarray, k: int, branches: int, need: np.ndarray, rng: np.random.Generator
    ) -> Proposal:
        if branches != 1:
            raise ValueError("speculative_simulate drafts one branch per round (branches=1)")
        steps = self.step[rows][:, None] + np.arange(k + 1)[None, :]  # [R, k+1] the step at s_0 .. s_k
        lengths = np.minimum(need - 1, k).astype(np.int64)  # never more than a row can use
        ctx = DraftContext(self.model, steps, self.draft.force)
        return propose_round(self.draft, ctx, self.memory, rows, self.X, lengths, self.scale, rng, self.stats)

    def score(self, rows: np.ndarray, proposal: Proposal) -> Normal:
        ctx: Round = proposal.context
        S = ctx.S
        R, K1 = S.shape[:2]
        scored, Xb, steps = score_batch(ctx)  # [M, N, d], M <= R (k+1): a fresh array, the force's own
        Fb, finite = evaluate_force(self.model.force, Xb, who="force", steps=steps, private=True)  # ONE call
        self.stats.target_configurations += Xb.shape[0]
        F = np.zeros_like(S)  # [R, k+1, N, d]
        F[scored] = Fb
        M, defined = transition_means(self.model, S, F)  # [R, k+1, N, d] target means, [R, k+1]
        ok = np.ones((R, K1), bool)  # the step from s_i is defined: finite force and mean
        ok[scored] = finite & defined[scored]
        if not ok[:, 0].all():  # the committed state: needed now
            i = int(np.argmin(ok[:, 0]))
            b = int(ctx.offset[i])  # row i's s_0 in the batch
            step, row = int(self.step[rows[i]]), int(rows[i])
            raise nonfinite_error("force", Fb, b, step, row) if not finite[b] else overflow_error(M[i], 0, step, row)
        ctx.out = ctx.f = Fb
        M = check_drafts(ctx, M, ok, proposal.dists.loc, self.scale, self.stats)
        return Normal(M, self.scale, batch_ndims=2, validate=False)

    def plain(self, rows: np.ndarray, n: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, None]:
        """``n[r]`` plain Euler-Maruyama steps of each row (the exact force, no drafts: ``simulate``'s step),
        in one call of the loop: what ``lookahead="auto"`` runs while no lookahead pays (k = 0). Returns the
        configurations ``[R, max n, N, d]`` (None with ``keep_outcomes=False``: only the recorded steps are
        written, into the recorder, as ``simulate`` does), the steps taken and None. The draft's memory is
        left as it was (a stale reference drafts worse, never wrongly: its law is the one it reports)."""
        n = np.asarray(n, np.int64)
        X = self.X[rows].copy()  # [R, N, d]
        steps = self.step[rows]
        R, n_max = len(rows), int(n.max())
        keep = self.keep_outcomes or self.recorder.every == 1  # every step recorded: the block write
        out = np.empty((R, n_max, *X.shape[1:]), X.dtype) if keep else None  # [R, max n, N, d]
        due = {} if keep else self.recorder.due(steps, n)  # j -> the rows (indices into rows) recorded after step j
        ragged = bool((n < n_max).any())  # rows that stop early: gathers (all rows step together otherwise)
        act = np.arange(R)
        first = int(steps.min())  # a plain int: no array arithmetic per step
        model, force, scale = self.model, self.model.force, self.scale
        for j in range(n_max):
            if ragged:
                act = np.flatnonzero(n > j)
            Xa = X[act] if ragged else X
            F, finite = evaluate_force(force, Xa, who="force", steps=first + j)  # rows: see the errors
            if not finite.all():
                b = int(np.argmin(finite))
                raise nonfinite_error("force", F, b, int(steps[act[b]] + j), int(rows[act[b]]))
            M, ok = transition_means(model, Xa, F)
            if not ok.all():
                b = int(np.argmin(ok))
                raise overflow_error(M, b, int(steps[act[b]] + j), int(rows[act[b]]))
            new = M + scale * rng.standard_normal(M.shape)
            if ragged:
                X[act] = new
            else:
                X = new
            if keep:
                if ragged:
                    out[act, j] = new
                else:
                    out[:, j] = new
            elif j in due:
                i = due[j]
                self.recorder.positions[rows[i], (steps[i] + j + 1) // self.recorder.every] = X[i]
        if keep:
            self.recorder.record_block(rows, steps, out, n)
        self.stats.target_configurations += int(n.sum())  # one exact force per row and step taken
        self.X[rows] = X
        self.step[rows] += n
        return out, n, None

    def commit(self, rows: np.ndarray, proposal: Proposal, verdict: Verdict) -> tuple[np.ndarray, None]:
        ctx: Round = proposal.context
        last = verdict.n_accepted  # [R] the last transition started from s_last
        bad = np.flatnonzero(ctx.first_bad <= last)  # a row reached an undefined step
        if bad.size:
            i = int(bad[0])
            b = int(ctx.offset[i] + ctx.first_bad[i])
            step, row = int(self.step[rows[i]] + ctx.first_bad[i]), int(rows[i])
            if not np.isfinite(ctx.out[b]).all():
                raise nonfinite_error("force", ctx.out, b, step, row)
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
        self.draft.advance(self.memory, rows, last, ctx.S, ctx.steps, ctx.f[ctx.offset + last], ctx.extra,
                           ctx.lengths)
        self.step[rows] += n
        return n, None
