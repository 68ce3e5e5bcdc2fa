"""The Process (speculate.rounds protocol) behind speculative rollouts of N environments.

One round, for the active environments (rows):

1. ``propose``: save a snapshot of each env at its committed state s_0, then k times: ONE draft-policy
   call on the current observations of all rows still drafting, sample an action per row, save a
   snapshot, step the env. A row stops drafting when its episode ends (its ``length`` is then the
   number of drafted steps) or when only one more step remains before ``max_steps``.
2. ``score``: ONE target-policy call on the k+1 observations s_0..s_L of every row (all rows
   concatenated; one call per distinct policy object when envs have different policies).
3. the round loop verifies (token, block or greedy rule of ``speculate``; no rule lives here).
4. ``commit``: keep the accepted drafted transitions (observation, reward, flags, info as they came),
   restore the snapshot of the last kept state s_n and step the env with the verifier's action.

The environment's transition randomness (its ``np_random``) is part of the snapshot, so restoring
s_n and stepping re-uses the random stream the discarded drafted steps had used. This is exact for
every rule, block verification included (proofs/05-chains.md, statement 3): given the
environment's whole stream, committed step t always reads the stream where step t of a plain
rollout would, so states are the same deterministic function of the action history for drafts,
commits and the target, and each rule is exact for deterministic history-dependent contexts;
averaging over the stream gives the target's law. What must never be replayed under block
verification is the draft's own sampling randomness (statement 4): draft actions are drawn from
the round's fresh ``rng``, never from the environment's generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speculate.distributions import Categorical, Normal
from speculate.rounds import Proposal

from .policies import action_distributions, batch_observations


def own(obs: Any) -> Any:
    """A copy of an observation (arrays, tuples / dicts of them) that the env cannot overwrite later:
    an env that returns the same buffer every step would otherwise make the k+1 drafted
    observations alias one array by the time the policy scores them."""
    if isinstance(obs, np.ndarray):
        return obs.copy()
    if isinstance(obs, tuple):
        return tuple(own(o) for o in obs)
    if isinstance(obs, dict):
        return {k: own(v) for k, v in obs.items()}
    return obs


def step_env(env: Any, action: Any) -> tuple:
    """``env.step(action)`` with the observation copied and the info dict shallow-copied."""
    obs, reward, terminated, truncated, info = env.step(action)
    return own(obs), reward, terminated, truncated, dict(info)


class _Row:
    """The committed trajectory of one environment."""

    __slots__ = ("actions", "done", "env", "infos", "observations", "rewards", "snap", "terminated", "truncated")

    def __init__(self, env: Any, snap: Any, obs: Any) -> None:
        self.env, self.snap = env, snap
        self.observations = [obs]
        self.actions: list = []
        self.rewards: list = []
        self.infos: list = []
        self.terminated = self.truncated = self.done = False

    def append(self, action: Any, step: tuple) -> None:
        obs, reward, terminated, truncated, info = step
        self.actions.append(action)
        self.observations.append(obs)
        self.rewards.append(float(reward))
        self.infos.append(info)
        if terminated or truncated:
            self.terminated, self.truncated, self.done = bool(terminated), bool(truncated), True


class RolloutProcess:
    """Rows = environments; outcomes = actions. See the module docstring."""

    def __init__(
        self,
        envs: list,
        snaps: list,
        first_obs: list,
        policies: list,
        drafts: list,
        max_steps: int,
    ) -> None:
        self.rows = [_Row(e, s, own(o)) for e, s, o in zip(envs, snaps, first_obs, strict=True)]
        self.policies, self.drafts = policies, drafts
        self.obs_space = envs[0].observation_space
        self.act_space = envs[0].action_space
        self.discrete = hasattr(self.act_space, "n")
        self.max_steps = max_steps

    # -- policy calls: one per distinct policy object, rows of the same policy batched together

    def _dists(self, which: list, rows: list[int], obs: list) -> Any:
        """Action distributions of ``obs[i]`` under ``which[rows[i]]``: probs [M, A] or (loc, scale) [M, *shape]."""
        M = len(obs)
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(id(which[r]), []).append(i)
        out: Any = None
        for idx in groups.values():
            pol = which[rows[idx[0]]]
            batch = batch_observations(self.obs_space, [obs[i] for i in idx])
            d = action_distributions(pol, batch, self.act_space, len(idx))
            if len(groups) == 1:
                return d.probs if self.discrete else (d.loc, np.broadcast_to(d.scale, d.loc.shape))
            if self.discrete:
                if out is None:
                    out = np.empty((M, d.num_outcomes), np.float64)
                out[idx] = d.probs
            else:
                if out is None:
                    out = (np.empty((M, *d.event_shape)), np.empty((M, *d.event_shape)))
                out[0][idx], out[1][idx] = d.loc, np.broadcast_to(d.scale, d.loc.shape)
        return out

    def _sample_draft(self, dist: Any, rows: np.ndarray, j: int, rng: np.random.Generator) -> Any:
        """Drafted actions of ``rows`` at draft position ``j``: fresh draws from the round's ``rng``
        (replaying earlier randomness here would bias block verification, proofs/05 statement 4;
        tests/rl override this to show that their checks catch it)."""
        return dist.sample(rng)

    def _env_action(self, a: Any) -> Any:
        if self.discrete:
            return int(a)
        return np.asarray(a, dtype=self.act_space.dtype)

    # -- the Process protocol

    def propose(self, rows: np.ndarray, k: int, m: int, rng: np.random.Generator) -> Proposal:
        if m != 1:
            raise ValueError("speculative rollouts draft one branch per round (drafts=1)")
        R = len(rows)
        room = np.array([self.max_steps - len(self.rows[r].actions) - 1 for r in rows])
        limit = np.clip(room, 0, k)  # [R] the most drafted steps each row may take
        lengths = np.zeros(R, np.int64)
        self._snaps: list[list] = [[] for _ in range(R)]
        self._steps: list[list] = [[] for _ in range(R)]  # drafted (action, step result) per row
        self._obs = [[self.rows[r].observations[-1]] for r in rows]  # s_0..s_L per row
        if self.discrete:
            A = int(self.act_space.n)
            outcomes = np.zeros((R, k), np.int64)
            q = np.full((R, k, A), 1.0 / A)  # padding past a row's length is ignored by the verifier
        else:
            shape = tuple(self.act_space.shape)
            outcomes = np.zeros((R, k, *shape))
            loc, scale = np.zeros((R, k, *shape)), np.ones((R, k, *shape))
        live = [i for i in range(R) if limit[i] > 0]
        for j in range(k):
            live = [i for i in live if j < limit[i]]
            if not live:
                break
            d = self._dists(self.drafts, [int(rows[i]) for i in live], [self._obs[i][-1] for i in live])
            if self.discrete:
                dist = Categorical(probs=d, validate=False)  # [n_live, A]
                acts = self._sample_draft(dist, rows[live], j, rng)
                q[live, j] = d
            else:
                dist = Normal(d[0], d[1], batch_ndims=1, validate=False)  # [n_live, *shape]
                acts = self._sample_draft(dist, rows[live], j, rng)
                loc[live, j], scale[live, j] = d
            outcomes[live, j] = acts
            still = []
            for i, a in zip(live, acts, strict=True):
                row = self.rows[rows[i]]
                self._snaps[i].append(row.snap.save())  # s_j, before the drafted step
                step = step_env(row.env, self._env_action(a))
                self._steps[i].append((self._env_action(a), step))
                self._obs[i].append(step[0])
                lengths[i] = j + 1
                if not (step[2] or step[3]):
                    still.append(i)
            live = still
        self._lengths = lengths
        if k == 0:
            return Proposal(outcomes, None, lengths)
        if self.discrete:
            return Proposal(outcomes, Categorical(probs=q, validate=False), lengths)
        return Proposal(outcomes, Normal(loc, scale, batch_ndims=2, validate=False), lengths)

    def score(self, rows: np.ndarray, proposal: Proposal) -> Any:
        R, k = len(rows), proposal.outcomes.shape[1]
        flat_rows = [int(rows[i]) for i in range(R) for _ in self._obs[i]]
        flat_obs = [o for i in range(R) for o in self._obs[i]]
        d = self._dists(self.policies, flat_rows, flat_obs)  # ONE call per distinct policy
        starts = np.cumsum([0] + [len(o) for o in self._obs])[:-1]
        # position j of row i reads flat entry starts[i] + min(j, L_i): padding repeats s_L
        idx = starts[:, None] + np.minimum(np.arange(k + 1)[None, :], self._lengths[:, None])  # [R, k+1]
        if self.discrete:
            return Categorical(probs=d[idx], validate=False)  # [R, k+1, A]
        return Normal(d[0][idx], d[1][idx], batch_ndims=2, validate=False)  # [R, k+1, *shape]

    def commit(self, rows: np.ndarray, emitted: list, n_accepted: np.ndarray, branch: np.ndarray):
        R = len(rows)
        n_used = np.zeros(R, np.int64)
        done = np.zeros(R, bool)
        for i in range(R):
            row, L, n, e = self.rows[rows[i]], int(self._lengths[i]), int(n_accepted[i]), emitted[i]
            kept = min(n, len(e))
            for a, step in self._steps[i][:kept]:
                row.append(a, step)
            n_used[i] = kept
            if not row.done and len(e) > n:
                if n < L:
                    row.snap.restore(self._snaps[i][n])  # RNG included: see the module docstring
                a = self._env_action(e[n])
                row.append(a, step_env(row.env, a))
                n_used[i] = n + 1
            elif kept < L:
                row.snap.restore(self._snaps[i][kept])
            for s in self._snaps[i]:
                row.snap.release(s)
            if len(row.actions) >= self.max_steps and not row.done:
                row.truncated, row.done = True, True
            done[i] = row.done
        self._snaps = []
        return n_used, done
