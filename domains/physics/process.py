"""Speculative Euler-Maruyama: the Langevin chain as a Process of the core round loop.

One round, for every active row (replica):
  propose: k Euler-Maruyama steps with the draft force, s_{i+1} ~ Normal(s_i + dt F_d / gamma, s);
  score:   the exact force at the k+1 configurations s_0 .. s_k of all rows in ONE call;
  verify:  the core (speculate.rounds.run) compares Normal(s_i + dt F(s_i)/gamma, s) with the
           draft's Normal of the same scale by reflection maximal coupling: a draft step is kept
           with probability 2 Phi(-delta_i / 2), delta_i = sqrt(dt / (2 gamma kT)) |F_d - F(s_i)|;
           the first rejected step is replaced by its reflection (an exact draw of the target step)
           and when all k are kept a bonus step is drawn from the target at s_k;
  commit:  keep the accepted configurations and the verifier's one.
The output is distributed exactly as ``simulate`` (the Euler-Maruyama chain with the exact force):
exact for the discretised chain, not for the continuous SDE.

Drafts: a force function, ``"frozen"`` (the exact force at the last configuration the previous round
scored and kept, constant over the k steps: free, nothing to train) or ``frozen_correction(cheap)``
(cheap(x) + F(x_ref) - cheap(x_ref)). The frozen drafts need one exact force from the past: in the
first round of a row they propose nothing (length 0) and the round is a plain step whose score
call yields that force.

Example:
    >>> import numpy as np
    >>> from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate
    >>> model = Langevin(force=DoubleWell(), draft_force="frozen", dt=1e-3)
    >>> traj = speculative_simulate(model, np.zeros((1, 1)), n_steps=200, lookahead=8, seed=0)
    >>> traj.positions.shape, traj.stats.calls_per_step < 0.3
    ((201, 1, 1), True)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from speculate import Normal
from speculate.rounds import Proposal, run

from .langevin import (
    FrozenCorrection,
    Langevin,
    Recorder,
    SimulationStats,
    Trajectory,
    check_steps,
    check_x0,
    evaluate_force,
    nonfinite_error,
)


class LangevinProcess:
    """B replicas of the Euler-Maruyama chain of ``model``: the Process protocol of the round loop.

    State per row: the committed configuration, its step, and the last exact force the row has
    committed to (for the frozen drafts). ``recorder`` receives every committed configuration.
    """

    def __init__(self, model: Langevin, X0: np.ndarray, n_steps: int, recorder: Recorder) -> None:
        B = X0.shape[0]
        self.model, self.n_steps, self.recorder = model, n_steps, recorder
        self.X = X0.copy()                                          # [B, N, d] committed
        self.step = np.zeros(B, np.int64)
        self.F_ref = np.zeros_like(X0)                              # exact force at X_ref
        self.X_ref = X0.copy()
        self.G_ref = np.zeros_like(X0)                              # cheap force at X_ref
        self.has_ref = np.zeros(B, bool)
        self.has_G = np.zeros(B, bool)
        self.scale = model.noise_scale
        self.target_configurations = 0
        self.draft_truncations = 0
        self._round: dict[str, Any] = {}

    # ---------------------------------------------------------------- draft
    def _cheap(self, fn, X: np.ndarray, rows: np.ndarray, i: int):
        F, finite = evaluate_force(fn, X, who="draft_force", steps=self.step[rows] + i)
        F[~finite] = 0.0
        return F, finite

    def _cut_blown(self, S: np.ndarray, loc: np.ndarray, lengths: np.ndarray, i: int) -> None:
        """Rows whose drafted s_{i+1} overflowed (a finite but huge draft force): cut at i."""
        blown = ~np.isfinite(S[:, i + 1].reshape(S.shape[0], -1)).all(axis=1)
        if blown.any():
            cut = blown & (lengths > i)
            self.draft_truncations += int(cut.sum())
            lengths[cut] = i
            loc[blown, i] = S[blown, i]                             # keep every array finite
            S[blown, i + 1] = S[blown, i]

    def propose(self, rows: np.ndarray, k: int, m: int, rng: np.random.Generator) -> Proposal:
        if m != 1:
            raise ValueError("speculative_simulate drafts one branch per round (drafts=1)")
        model, draft = self.model, self.model.draft_force
        R = len(rows)
        S = np.empty((R, k + 1, *self.X.shape[1:]))                 # [R, k+1, N, d] s_0 .. s_k
        S[:, 0] = self.X[rows]
        loc = np.empty((R, k, *self.X.shape[1:]))                   # [R, k, N, d] draft means
        G = np.zeros_like(S) if isinstance(draft, FrozenCorrection) else None
        lengths = np.full(R, k, np.int64)
        frozen = draft == "frozen" or isinstance(draft, FrozenCorrection)
        if frozen:
            lengths[~self.has_ref[rows]] = 0                        # no exact force known yet
            correction = self.F_ref[rows]                           # [R, N, d]
        if isinstance(draft, FrozenCorrection) and k > 0:
            need = np.flatnonzero(self.has_ref[rows] & ~self.has_G[rows])
            if need.size:                                           # cheap(X_ref), once per ref
                g, ok = self._cheap(draft.draft, self.X_ref[rows[need]], rows[need], 0)
                self.G_ref[rows[need]] = g
                self.has_G[rows[need]] = True
                lengths[need[~ok]] = 0
            correction = correction - self.G_ref[rows]
        noise = self.scale * rng.standard_normal(loc.shape)         # [R, k, N, d]
        if draft == "frozen":                                       # the same drift every step
            drift = (model.dt / model.gamma) * correction
            for i in range(k):
                np.add(S[:, i], drift, out=loc[:, i])
                np.add(loc[:, i], noise[:, i], out=S[:, i + 1])
            if k and not np.isfinite(S).all():
                for i in range(k):
                    self._cut_blown(S, loc, lengths, i)
        for i in range(k if draft != "frozen" else 0):
            fn = draft.draft if isinstance(draft, FrozenCorrection) else draft
            F, ok = self._cheap(fn, S[:, i], rows, i)
            if G is not None:
                G[:, i] = F
                F = F + correction
            cut = ~ok & (lengths > i)
            self.draft_truncations += int(cut.sum())
            lengths[cut] = i                                        # the draft stops there
            loc[:, i] = model.mean(S[:, i], F)
            S[:, i + 1] = loc[:, i] + noise[:, i]
            self._cut_blown(S, loc, lengths, i)                     # before the next draft call
        self._round = {"S": S, "G": G, "lengths": lengths}
        dists = Normal(loc, self.scale, batch_ndims=2, validate=False)
        return Proposal(outcomes=S[:, 1:], dists=dists, lengths=lengths)

    # ---------------------------------------------------------------- target
    def score(self, rows: np.ndarray, proposal: Proposal) -> Normal:
        S, lengths = self._round["S"], self._round["lengths"]
        R, K1 = S.shape[:2]
        need = np.arange(K1)[None, :] <= lengths[:, None]           # [R, k+1]: s_0 .. s_L
        Xb = S[need]                                                # [M, N, d], M <= R (k+1)
        steps = (self.step[rows][:, None] + np.arange(K1)[None, :])[need]
        Fb, finite = evaluate_force(self.model.force, Xb, who="force", steps=steps)   # ONE call
        self.target_configurations += Xb.shape[0]
        F = np.zeros_like(S)                                        # [R, k+1, N, d]
        ok = np.ones((R, K1), bool)
        F[need], ok[need] = Fb, finite
        if not ok[:, 0].all():                              # the committed state: needed now
            i = int(np.argmin(ok[:, 0]))
            b = int(need[:i].sum())                                 # row i's s_0 in the batch
            raise nonfinite_error("force", Fb, b, int(self.step[rows[i]]), int(rows[i]))
        F[~ok] = 0.0                    # placeholder: a transition used only if s_i is reached,
        self._round["first_bad"] = np.where(ok.all(1), K1, np.argmin(ok, axis=1))   # then we raise
        self._round["F"], self._round["Fb"], self._round["need"] = F, Fb, need
        return Normal(self.model.mean(S, F), self.scale, batch_ndims=2, validate=False)

    # ---------------------------------------------------------------- commit
    def commit(
        self, rows: np.ndarray, emitted: list, n_accepted: np.ndarray, branch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        S, F, G = self._round["S"], self._round["F"], self._round["G"]
        first_bad, need, Fb = self._round["first_bad"], self._round["need"], self._round["Fb"]
        R, K1 = S.shape[:2]
        n = np.fromiter((len(e) for e in emitted), np.int64, count=R)      # [R] steps taken
        bad = np.flatnonzero(first_bad <= n - 1)            # a row reached a non-finite force
        if bad.size:
            i = int(bad[0])
            b = int(need[:i].sum() + first_bad[i])
            step = int(self.step[rows[i]] + first_bad[i])
            raise nonfinite_error("force", Fb, b, step, int(rows[i]))
        go = np.flatnonzero(n > 0)
        if go.size == 0:
            return n, self.step[rows] >= self.n_steps
        last = n[go] - 1                                    # em[-1] came from s_last's transition
        r = rows[go]
        X_new = np.stack([np.asarray(emitted[i][-1]) for i in go])             # [G, N, d]
        every = self.recorder.every
        rec = (self.step[r] + n[go]) // every > self.step[r] // every        # a recorded step
        if rec.any():
            g = go[rec]
            E = np.concatenate([S[g, 1:], S[g, :1]], axis=1)  # [G', k+1, N, d]: s_1 .. s_k, spare
            E[np.arange(len(g)), last[rec]] = X_new[rec]
            self.recorder.record_block(rows[g], self.step[rows[g]], E, n[g])
        self.X[r] = X_new
        self.X_ref[r], self.F_ref[r], self.has_ref[r] = S[go, last], F[go, last], True
        if G is not None:
            self.G_ref[r] = G[go, last]
            self.has_G[r] = (last < K1 - 1) & (last < self._round["lengths"][go])
        self.step[r] += n[go]
        n_used = n
        return n_used, self.step[rows] >= self.n_steps


def speculative_simulate(
    model: Langevin,
    x0: Any,
    n_steps: int,
    lookahead: int | str = 8,
    seed: int | np.random.Generator | None = 0,
    *,
    record_every: int = 1,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
) -> Trajectory:
    """Simulate the Euler-Maruyama chain of ``model`` exactly, drafting ``lookahead`` steps ahead.

    The returned trajectory has the same law as ``simulate(model, x0, n_steps)`` (exact for the
    discretised chain), with ``stats.target_calls`` sequential calls of the exact force instead of
    n_steps; each call scores up to B (lookahead+1) configurations.

    Args:
        model: Langevin(force, draft_force, dt, kT, gamma).
        x0: initial configuration [N, d], or [B, N, d] for B replicas advanced together.
        n_steps: steps per replica. lookahead: drafted steps per round, or "auto" (chosen online
            from the measured acceptance and cost ratio, up to ``max_lookahead``).
        seed: int seed or numpy Generator. record_every: keep every record_every-th configuration.
        cost_ratio: with lookahead="auto", a fixed draft/target cost ratio c instead of the
            measured one (the run then depends on the seed alone, not on timings).

    Raises ValueError naming the step when the exact force is not finite at a configuration the
    chain reaches (a non-finite force at a drafted configuration that is never reached is
    harmless: that draft is simply not kept) or when a force returns the wrong shape.

    Example:
        >>> import numpy as np
        >>> from speculate.domains.physics import DoubleWell, Langevin, speculative_simulate
        >>> model = Langevin(force=DoubleWell(), draft_force=DoubleWell(tilt=3.0), dt=1e-2)
        >>> traj = speculative_simulate(model, np.zeros((3, 1, 1)), 50, lookahead=4, seed=1)
        >>> traj.positions.shape, 0.5 < traj.stats.acceptance_rate < 1
        ((3, 51, 1, 1), True)
    """
    if not isinstance(model, Langevin):
        raise TypeError(f"model must be a Langevin, got {type(model).__name__}")
    check_steps(n_steps, record_every)
    X, batched = check_x0(x0)
    rec = Recorder(X, n_steps, record_every)
    process = LangevinProcess(model, X, n_steps, rec)
    t0 = time.perf_counter()
    result = run(process, X.shape[0], n_steps, lookahead=lookahead, verify="token", rng=seed,
                 max_lookahead=max_lookahead, cost_ratio=cost_ratio, keep_samples=False)
    core = result.stats
    stats = SimulationStats(
        steps=n_steps,
        target_calls=core.target_calls,
        target_configurations=process.target_configurations,
        draft_calls=core.draft_calls,
        proposed=core.proposed,
        accepted=core.accepted,
        rounds=core.rounds,
        target_time=core.target_time,
        draft_time=core.draft_time,
        wall_time=time.perf_counter() - t0,
        accepted_per_position=core.accepted_per_position.copy(),
        core=core,
    )
    stats.draft_truncations = process.draft_truncations
    stats.lookahead_counts = dict(core.lookahead_counts)
    return rec.trajectory(process.X, stats, batched)
