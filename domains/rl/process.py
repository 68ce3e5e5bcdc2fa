"""The Process (speculate.rounds protocol) behind speculative rollouts of N environments.

One round, for the active environments (rows):

1. ``propose``: up to k times: ONE call of the draft (:class:`~speculate.domains.rl.drafts.PolicyDraft`)
   on the current observations of all rows still drafting, an action per row drawn from the round's
   ``rng`` (its argmax under greedy verification), then per row: save a snapshot, step the env. A
   row stops drafting when its episode ends (its ``length`` is then the number of drafted steps) or
   when it has drafted ``need - 1`` steps (the round loop's budget: the verifier's action then
   completes what the row still needs).
2. ``score``: ONE target-policy call on the k+1 observations s_0..s_L of every row (all rows
   concatenated; one call per distinct policy object when envs have different policies).
3. the round loop verifies (token, block or greedy rule of ``speculate``; no rule lives here).
4. ``commit``: keep the accepted drafted transitions (observation, reward, flags, info as they came),
   restore the snapshot of the last kept state s_n and step the env with the verifier's action.

The drafted snapshots, steps and observations of a round travel in ``Proposal.context`` (a
:class:`Round`); the process itself keeps only the environments and their committed episodes
(:class:`Row`), and the round in flight (``pending``) so that :meth:`RolloutProcess.abort` can undo
it when an exception stops the run: the environments go back to their last committed state and the
round's snapshots are released. An exception from ``env.step``, a snapshot or a policy gets a note
naming the environment and its step, or the policy and the environments it was scoring.
Truncation at ``max_steps`` is the caller's business (:func:`speculate.domains.rl.speculative_rollouts`
marks it after the run).

The environment's transition randomness (its ``np_random``) is part of the snapshot, so restoring
s_n and stepping re-uses the random stream the discarded drafted steps had used. This is exact for
every rule, block verification included (proofs/05-chains.md, statement 3): given the
environment's whole stream, committed step t always reads the stream where step t of a plain
rollout would, so states are the same deterministic function of the action history for drafts,
commits and the target, and each rule is exact for deterministic history-dependent contexts;
averaging over the stream gives the target's law. What must never be replayed under block
verification is the draft's own sampling randomness (statement 4): draft actions are drawn from
the round's fresh ``rng``, never from the environment's generator.

The process on its own, under the round loop (``speculative_rollouts`` builds it this way):

>>> import gymnasium as gym, numpy as np
>>> from speculate.rounds import run
>>> from speculate.domains.rl.drafts import PolicyDraft
>>> from speculate.domains.rl.policies import TabularPolicy, prepare
>>> from speculate.domains.rl.snapshots import snapshotter
>>> env = gym.make("FrozenLake-v1")
>>> obs, _ = env.reset(seed=0)
>>> pi = [prepare(TabularPolicy(np.full((16, 4), 0.25)))]
>>> draft = PolicyDraft(pi, env.observation_space, env.action_space)
>>> proc = RolloutProcess([env], [snapshotter(env)], [obs], pi, draft)
>>> res = run(proc, 1, 6, lookahead=3, rng=0, keep_samples=False)
>>> row = proc.rows[0]
>>> len(row.actions) == len(row.observations) - 1 <= 6, res.stats.acceptance_rate
(True, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from speculate.distributions import Categorical, Normal
from speculate.errors import add_note
from speculate.rounds import Proposal, Verdict

from .drafts import PolicyDraft
from .policies import action_arrays

__all__ = ["RolloutProcess", "Round", "Row", "env_action", "env_name", "own", "step_env"]


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


def env_name(env: Any) -> str:
    """The environment's id (``env.spec.id``) or its class name, for messages."""
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__


def step_env(env: Any, action: Any, where: Callable[[], str] | None = None) -> tuple:
    """``env.step(action)`` with the observation copied and the info dict shallow-copied.

    An exception raised by ``env.step`` gets a note saying where: ``where()`` (which environment,
    which step; built only on failure).
    """
    try:
        obs, reward, terminated, truncated, info = env.step(action)
    except BaseException as err:  # KeyboardInterrupt too
        if where is not None:
            add_note(err, f"speculate.domains.rl: raised by env.step of {where()}")
        raise
    return own(obs), reward, terminated, truncated, dict(info)


def env_action(space: Any, a: Any) -> Any:
    """The action the environment receives for the sampled outcome ``a``: ``start + a`` for a
    ``Discrete`` space (the policy scores actions ``0..n-1``), ``a`` in the space's dtype for a
    ``Box``. A Box action that the dtype cannot hold (a mean of 1e39 for float32) raises ValueError
    instead of stepping the environment with inf."""
    if hasattr(space, "n"):
        return int(a) + int(space.start)
    dtype = space.dtype
    if dtype.kind == "f":
        with np.errstate(over="ignore"):  # reported below
            out = np.asarray(a, dtype=dtype)
        if not np.all(np.isfinite(out)):
            raise ValueError(f"a sampled action {np.asarray(a).tolist()} does not fit the action space's dtype {dtype} "
                             "(it overflows to inf): the policy's mean or std is far outside the space")
        return out
    info = np.iinfo(dtype)
    a = np.asarray(a, dtype=np.float64)
    if not np.all((a > info.min - 1) & (a < info.max + 1)):
        raise ValueError(f"a sampled action {a.tolist()} does not fit the action space's dtype {dtype}")
    return a.astype(dtype)  # truncated toward zero, as in plain rollouts


class Row:
    """The committed episode of one environment, and the environment with its snapshotter."""

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


class Round:
    """What one round carries from ``propose`` to ``score`` and ``commit`` (``Proposal.context``)."""

    __slots__ = ("lengths", "observations", "rows", "snaps", "steps")

    def __init__(self, rows: list, first_obs: list) -> None:
        R = len(first_obs)
        self.rows = rows  #: the environments (row ids) of the round
        self.snaps: list[list] = [[] for _ in range(R)]  #: per row, the snapshot before each drafted step
        #: (emptied once the row's commit released them; what is left is undone by RolloutProcess.abort)
        self.steps: list[list] = [[] for _ in range(R)]  #: per row, (env action, step result) per drafted step
        self.observations = [[o] for o in first_obs]  #: per row, s_0..s_L
        self.lengths = np.zeros(R, np.int64)  #: per row, the drafted steps L


class RolloutProcess:
    """Rows = environments; outcomes = actions. See the module docstring."""

    def __init__(self, envs: list, snaps: list, first_obs: list, policies: list, draft: PolicyDraft) -> None:
        self.rows = [Row(e, s, own(o)) for e, s, o in zip(envs, snaps, first_obs, strict=True)]
        self.policies, self.draft = policies, draft
        self.obs_space = envs[0].observation_space
        self.act_space = envs[0].action_space
        self.discrete = hasattr(self.act_space, "n")
        self.pending: Round | None = None  #: the round between propose and the end of its commit

    def _env_action(self, a: Any, r: int = 0, drafted: bool = False) -> Any:
        if self.discrete and self.act_space.start == 0:
            return int(a)
        try:
            return env_action(self.act_space, a)
        except ValueError as err:  # an action the space's dtype cannot hold: say whose it is
            who = self.draft.policies[r] if drafted else self.policies[r]
            role = "draft policy" if drafted else "policy"
            raise ValueError(f"{role} {getattr(who, 'name', type(who).__name__)} of environment {r}: {err}") from None

    def _where(self, r: int, t: int, doing: str) -> Callable[[], str]:
        """What a failing env.step note says: environment r, step t (0-based) of its episode."""
        return lambda: f"environment {r} ({env_name(self.rows[r].env)}) at step {t + 1} of its episode, {doing}"

    def abort(self) -> list[str]:
        """Undo the unfinished round after an exception in propose, score, verify or commit: every
        environment with drafted steps not yet committed is restored to the state at the start of the
        round (its last committed state) and the round's snapshots are released. Returns the
        problems met on the way (an error while restoring), which do not stop the others."""
        ctx, self.pending = self.pending, None
        problems: list[str] = []
        if ctx is None:
            return problems
        for i, r in enumerate(ctx.rows):
            snaps, ctx.snaps[i] = ctx.snaps[i], []
            if not snaps:
                continue
            snap = self.rows[r].snap
            try:
                snap.restore(snaps[0])
            except Exception as err:  # report, go on with the other environments
                problems.append(f"restoring environment {r} failed: {type(err).__name__}: {err}")
            for s in snaps:
                try:
                    snap.release(s)
                except Exception as err:
                    problems.append(f"releasing a snapshot of environment {r} failed: {type(err).__name__}: {err}")
        return problems

    # -- the Process protocol

    def propose(self, rows: np.ndarray, k: int, branches: int, need: np.ndarray, rng: np.random.Generator) -> Proposal:
        if branches != 1:
            raise ValueError("speculative rollouts draft one branch per round (branches=1)")
        R = len(rows)
        ids = rows.tolist()
        committed = [self.rows[r] for r in ids]
        ctx = Round(ids, [row.observations[-1] for row in committed])
        self.pending = ctx  # from here on, an exception is cleaned up by abort()
        lengths, obs = ctx.lengths, ctx.observations
        limit = np.minimum(need - 1, k).tolist()  # the most drafted steps each row can use
        greedy = self.draft.greedy  # greedy verification: argmax drafts, no draft probabilities needed
        if self.discrete:
            A = int(self.act_space.n)
            outcomes = np.zeros((R, k), np.int64)
            q = None if greedy else np.full((R, k, A), 1.0 / A)  # padding past a row's length is ignored
        else:
            shape = tuple(self.act_space.shape)
            outcomes = np.zeros((R, k, *shape))
            loc, scale = np.zeros((R, k, *shape)), np.ones((R, k, *shape))
        start = np.array([len(row.actions) for row in committed])  # the episode step of each row's s_0
        draft, env_action = self.draft, self._env_action
        live = list(range(R))
        for j in range(k):
            live = [i for i in live if j < limit[i]]
            if not live:
                break
            dist = draft.distributions([ids[i] for i in live], [obs[i][-1] for i in live])
            acts = draft.sample(dist, rows[live], start[live] + j, rng)
            if not self.discrete:
                loc[live, j], scale[live, j] = dist.loc, dist.scale
            elif q is not None:
                q[live, j] = dist.probs
            outcomes[live, j] = acts
            still = []
            for i, a in zip(live, acts, strict=True):
                row = committed[i]
                try:
                    ctx.snaps[i].append(row.snap.save())  # s_j, before the drafted step
                except BaseException as err:
                    where = self._where(ids[i], int(start[i]) + j, "drafting")()
                    add_note(err, f"speculate.domains.rl: raised saving a snapshot of {where}")
                    raise
                a = env_action(a, ids[i], True)
                step = step_env(row.env, a, self._where(ids[i], int(start[i]) + j, "drafting"))
                ctx.steps[i].append((a, step))
                obs[i].append(step[0])
                lengths[i] = j + 1
                if not (step[2] or step[3]):
                    still.append(i)
            live = still
        if self.discrete:  # greedy drafts are point masses (dists None)
            dists = None if k == 0 or q is None else Categorical(probs=q, validate=False)
            return Proposal(outcomes, dists, lengths, ctx)
        # a Normal even when k == 0, so that equal stds keep the reflection-coupling route
        return Proposal(outcomes, Normal(loc, scale, batch_ndims=2, validate=False), lengths, ctx)

    def score(self, rows: np.ndarray, proposal: Proposal) -> Any:
        ctx: Round = proposal.context
        R, k = len(rows), proposal.outcomes.shape[1]
        flat_rows = [int(rows[i]) for i in range(R) for _ in ctx.observations[i]]
        flat_obs = [o for row_obs in ctx.observations for o in row_obs]
        # ONE call per policy
        d = action_arrays(self.policies, flat_rows, flat_obs, self.obs_space, self.act_space, "policy")
        starts = np.cumsum([0] + [len(o) for o in ctx.observations])[:-1]
        # position j of row i reads flat entry starts[i] + min(j, L_i): padding repeats s_L
        idx = starts[:, None] + np.minimum(np.arange(k + 1)[None, :], ctx.lengths[:, None])  # [R, k+1]
        if self.discrete:
            return Categorical(probs=d[idx], validate=False)  # [R, k+1, A]
        return Normal(d[0][idx], d[1][idx], batch_ndims=2, validate=False)  # [R, k+1, *shape]

    def commit(self, rows: np.ndarray, proposal: Proposal, verdict: Verdict) -> tuple[np.ndarray, np.ndarray]:
        ctx: Round = proposal.context
        E = verdict.outcomes  # [R, k+1, *shape]: the kept drafts, then the verifier's action
        R = len(rows)
        n_used = np.zeros(R, np.int64)
        done = np.zeros(R, bool)
        for i, (r, n) in enumerate(zip(rows.tolist(), verdict.n_accepted.tolist(), strict=True)):
            row, L, snaps = self.rows[r], int(ctx.lengths[i]), ctx.snaps[i]
            t = len(row.actions)
            for a, step in ctx.steps[i][:n]:
                row.append(a, step)
            if row.done:  # the last kept draft ended the episode (drafting stops there: n == L)
                n_used[i] = n
            else:
                if n < L:
                    try:
                        row.snap.restore(snaps[n])  # RNG included: see the module docstring
                    except BaseException as err:
                        add_note(err, "speculate.domains.rl: raised restoring the snapshot of "
                                  f"{self._where(r, t + n, 'committing')()}")
                        raise
                a = self._env_action(E[i, n], r)  # the verifier's action, drawn from the policy's law
                row.append(a, step_env(row.env, a, self._where(r, t + n, "committing the verifier's action")))
                n_used[i] = n + 1
            ctx.snaps[i] = []  # committed: nothing of this row is left for abort() to undo
            for s in snaps:
                row.snap.release(s)
            done[i] = row.done
        self.pending = None
        return n_used, done
