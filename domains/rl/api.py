"""The RL domain's public functions: speculative rollouts of gymnasium environments with an
expensive policy, and plain rollouts (the reference they match in distribution).

Randomness: ``rng=`` is an int seed, a numpy Generator or None; see
:mod:`speculate.domains.rl.seeding` for how the environments' reset seeds and the generator of the
draft and the verifier come from it (the same reset seeds in plain and speculative rollouts).

>>> import numpy as np, gymnasium as gym
>>> from speculate.domains.rl import TabularPolicy, speculative_rollout
>>> rng = np.random.default_rng(0)
>>> policy = TabularPolicy(rng.dirichlet(np.ones(4), size=16))
>>> draft = TabularPolicy(0.8 * policy.probs + 0.05)
>>> episode = speculative_rollout(gym.make("FrozenLake-v1"), policy, draft, max_steps=20, rng=0)
>>> len(episode.actions) == len(episode.rewards) == len(episode.observations) - 1
True
>>> episode.terminated or episode.truncated
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speculate.distributed.sharding import map_shards
from speculate.errors import add_note
from speculate.rounds import run
from speculate.stats import Stats
from speculate.verify import RULES

from .drafts import PolicyDraft
from .policies import batch_observations, policy_calls, prepare
from .process import RolloutProcess, Row, env_action, env_name, own, step_env
from .seeding import rollout_seeds
from .snapshots import SnapshotError, snapshotter

__all__ = ["Episode", "Rollouts", "rollout", "rollouts", "rollouts_sharded", "speculative_rollout",
           "speculative_rollouts"]


@dataclass
class Episode:
    """One episode (or its first ``max_steps`` steps).

    ``observations`` has one more entry than ``actions`` and ``rewards`` (it starts with the reset
    observation); arrays when the spaces are Discrete or Box, lists otherwise. ``truncated`` is True
    when the environment truncated the episode or ``max_steps`` was reached first.
    """

    observations: Any
    actions: Any
    rewards: np.ndarray
    terminated: bool
    truncated: bool
    infos: list = field(repr=False)
    stats: Stats | None = field(default=None, repr=False)  #: counters of the whole run (shared)

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def total_reward(self) -> float:
        return float(np.sum(self.rewards))


@dataclass
class Rollouts:
    """The episodes of N environments, in order, and the counters of the run that produced them."""

    episodes: list[Episode]
    stats: Stats | None

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, i: int) -> Episode:
        return self.episodes[i]

    def __iter__(self):
        return iter(self.episodes)

    @property
    def steps(self) -> int:
        return sum(len(t) for t in self.episodes)


# ----------------------------------------------------------------------------------------------
# inputs


def _as_envs(envs_or_fns: Any) -> tuple[list, bool]:
    """(list of single envs, whether we created them)."""
    import gymnasium as gym

    if isinstance(envs_or_fns, gym.vector.VectorEnv):
        if isinstance(envs_or_fns, gym.vector.SyncVectorEnv):
            return list(envs_or_fns.envs), False
        raise SnapshotError(
            f"{type(envs_or_fns).__qualname__}: speculative rollouts need each sub-environment in "
            "this process to snapshot it; pass a SyncVectorEnv, a list of envs or a list of env_fns "
            "(AsyncVectorEnv keeps its envs in other processes; a native vector env such as "
            "CartPoleVectorEnv has no per-env snapshot)"
        )
    if isinstance(envs_or_fns, gym.Env):
        return [envs_or_fns], False
    if isinstance(envs_or_fns, (str, bytes)) or not isinstance(envs_or_fns, Sequence):
        raise TypeError(
            "expected a gymnasium Env, a SyncVectorEnv, or a list of envs or env constructors, got "
            f"{type(envs_or_fns).__name__}"
        )
    items = list(envs_or_fns)
    if not items:
        raise ValueError("no environments given")
    if all(isinstance(e, gym.Env) for e in items):
        if len({id(e) for e in items}) != len(items):
            raise ValueError("the same environment object appears twice: give N distinct envs")
        return items, False
    if all(callable(e) and not isinstance(e, gym.Env) for e in items):
        envs = [fn() for fn in items]
        bad = [type(e).__name__ for e in envs if not isinstance(e, gym.Env)]
        if bad:
            raise TypeError(f"env_fns must return gymnasium Envs, one returned {bad[0]}")
        return envs, True
    raise TypeError("give a list of gymnasium Envs or a list of env constructors, not a mix")


def _check_spaces(envs: list) -> None:
    import gymnasium as gym

    a0, o0 = envs[0].action_space, envs[0].observation_space
    if not isinstance(a0, (gym.spaces.Discrete, gym.spaces.Box)):
        raise TypeError(
            f"speculative rollouts support Discrete and Box action spaces, got {type(a0).__name__}"
        )
    for i, e in enumerate(envs[1:], 1):
        if e.action_space != a0 or e.observation_space != o0:
            raise ValueError(f"environment {i} has different spaces from environment 0")


def _per_env(policy: Any, N: int, what: str) -> list:
    """One prepared policy per env (the same object for envs that share a policy)."""
    if callable(policy):
        return [prepare(policy)] * N
    if isinstance(policy, Sequence) and len(policy) == N and all(callable(p) for p in policy):
        prepared = {id(p): prepare(p) for p in policy}
        return [prepared[id(p)] for p in policy]
    if isinstance(policy, Sequence):
        raise ValueError(f"{what}: give one callable, or a sequence of {N} (one per environment)")
    raise TypeError(f"{what} must be callable (observations -> action distributions), got {type(policy).__name__}")


_MAX_STEPS = 2**62  # far beyond any episode; keeps the round loop's int64 budget exact


def _check_steps(max_steps: int) -> int:
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 0:
        raise ValueError(f"max_steps must be a non-negative int, got {max_steps!r}")
    if max_steps > _MAX_STEPS:
        raise ValueError(f"max_steps must be at most 2**62, got {max_steps}")
    return int(max_steps)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_round_args(lookahead: Any, verify: Any, max_lookahead: Any, cost_ratio: Any) -> None:
    """The round loop's arguments, checked before any environment is made or reset."""
    if isinstance(lookahead, str):
        if lookahead != "auto":
            raise ValueError(f"lookahead must be a non-negative int or 'auto', got {lookahead!r}")
    elif not _is_int(lookahead):
        raise TypeError(f"lookahead must be a non-negative int or 'auto', got {type(lookahead).__name__} {lookahead!r}")
    elif lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    if not _is_int(max_lookahead):
        raise TypeError(f"max_lookahead must be an int >= 1, got {type(max_lookahead).__name__} {max_lookahead!r}")
    if max_lookahead < 1:
        raise ValueError(f"max_lookahead must be >= 1, got {max_lookahead}")
    if not isinstance(verify, str):
        raise TypeError(f"verify must be 'auto' or one of {RULES}, got {type(verify).__name__} {verify!r}")
    if verify != "auto" and verify not in RULES:
        raise ValueError(f"verify must be 'auto' or one of {RULES}, got {verify!r}")
    if cost_ratio is not None:
        real = isinstance(cost_ratio, (int, float, np.integer, np.floating))
        if isinstance(cost_ratio, (bool, np.bool_)) or not real:
            raise TypeError(f"cost_ratio must be a number >= 0 or None, got {type(cost_ratio).__name__}")
        if not 0.0 <= float(cost_ratio) < float("inf"):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio}")


def _truncate(rows: list[Row], max_steps: int) -> None:
    """Episodes that reached ``max_steps`` without ending are truncated (episode semantics: the
    round loop only stops each row at ``max_steps`` outcomes)."""
    for r in rows:
        if not r.done and len(r.actions) >= max_steps:
            r.truncated = r.done = True


def _reset(envs: list, seeds: list) -> list:
    """The first observation of each environment, reset with its seed; a failing reset is named."""
    first = []
    for i, (e, s) in enumerate(zip(envs, seeds, strict=True)):
        try:
            first.append(e.reset(seed=s)[0])
        except BaseException as err:
            add_note(err, f"speculate.domains.rl: raised by env.reset of environment {i} ({env_name(e)})")
            raise
    return first


def _where(i: int, env: Any, t: int) -> Callable[[], str]:
    """The note of a failing env.step in a plain rollout (built only on failure)."""
    return lambda: f"environment {i} ({env_name(env)}) at step {t + 1} of its episode"


def _episode(space: Any, act_space: Any, row: Row, stats: Stats | None) -> Episode:
    import gymnasium as gym

    obs: Any = row.observations
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.Box)):
        obs = batch_observations(space, obs)
    acts: Any = row.actions
    if isinstance(act_space, gym.spaces.Discrete):
        acts = np.asarray(acts, dtype=np.int64)
    else:
        acts = np.asarray(acts, dtype=act_space.dtype).reshape(len(acts), *act_space.shape)
    return Episode(obs, acts, np.asarray(row.rewards, np.float64), row.terminated, row.truncated, row.infos, stats)


# ----------------------------------------------------------------------------------------------
# speculative


def speculative_rollouts(
    envs: Any,
    policy: Callable | Sequence[Callable],
    draft: Callable | Sequence[Callable],
    *,
    max_steps: int = 500,
    lookahead: int | str = 4,
    verify: str = "auto",
    rng: int | np.random.Generator | None = 0,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    executor: Any = None,
    shards: int | None = None,
    rows_per_stream: int = 1,
) -> Rollouts:
    """Roll out N environments at once with ``policy``, drafting ahead with ``draft``; exact.

    The episodes are distributed exactly as plain rollouts of ``policy`` (:func:`rollouts`),
    the environments' own randomness included. Each round drafts up to ``lookahead`` actions per
    environment on a snapshot, scores all the drafted observations of all environments in ONE call of
    ``policy``, keeps a prefix per environment (ragged), and restores each environment to its last
    kept state. Episodes end independently (also inside a drafted block); no environment is reset
    while drafting (autoreset is never triggered).

    ``envs``: a ``gymnasium.vector.SyncVectorEnv`` (its sub-environments are stepped directly; reset
    it before stepping it again), a list of envs, or a list of env constructors (made and closed here).
    ``rng``: an int seed, a numpy Generator or None; each env is reset with a seed drawn from it (the
    same seeds as :func:`rollouts`; see :mod:`speculate.domains.rl.seeding`).
    ``policy``/``draft``: see :mod:`speculate.domains.rl.policies`; one callable, or a list of one per env.
    ``verify``: ``"auto"`` (block for Discrete actions, token for Box), ``"block"`` (Sun et al.,
    Discrete only), ``"token"`` (Leviathan et al.), ``"greedy"`` (Discrete only: the episodes are
    those of the policy's argmax action, and the draft proposes its own argmax, first maximum).
    ``lookahead``: drafted steps per round (0 to any int; ``max_lookahead`` caps only ``"auto"``), or
    ``"auto"``: k chosen each round from the running alpha and the cost ratio c (draft step / policy
    call). Reproducibility rule: with ``lookahead="auto"`` and ``cost_ratio=None`` c is measured, so k
    depends on the machine's timings and the same seed may give different episodes (each one still
    exactly distributed); pass ``cost_ratio=`` (a number >= 0) to make a seeded run bit-reproducible.
    A fixed int ``lookahead`` is always reproducible.
    ``executor`` / ``shards`` (either one): the seed-stable sharded run of :mod:`speculate.distributed`
    (every environment its own stream: reset seed, actions and uniforms; the same episodes for any
    executor and shard count; ``envs`` as env constructors, policies as picklable objects or
    ``speculate.distributed.PerWorker`` factories).
    Raises :class:`SnapshotError` for an env that cannot be snapshotted exactly, ValueError /
    TypeError for bad arguments (before any environment is reset) and for bad policy output (naming
    the policy). An exception raised inside the run (by an env, a policy, a snapshot, or
    KeyboardInterrupt) propagates unchanged with notes naming the round and the environment or
    policy; before it leaves, every environment is put back to its last committed state and the
    round's snapshots are released, so the environments can be used again at once.

    >>> import gymnasium as gym, numpy as np
    >>> from speculate.domains.rl import TabularPolicy, speculative_rollouts
    >>> pi = TabularPolicy(np.full((16, 4), 0.25))
    >>> many = speculative_rollouts([lambda: gym.make("FrozenLake-v1")] * 3, pi, pi, max_steps=8)
    >>> len(many), many.stats.acceptance_rate
    (3, 1.0)
    """
    import gymnasium as gym

    max_steps = _check_steps(max_steps)
    _check_round_args(lookahead, verify, max_lookahead, cost_ratio)
    rollout_seeds(rng, 0)  # checks rng (draws nothing)
    if executor is not None or shards is not None:
        return rollouts_sharded(envs, policy, draft, executor=executor, shards=shards, rows_per_stream=rows_per_stream,
                                rng=rng, max_steps=max_steps, lookahead=lookahead, verify=verify,
                                max_lookahead=max_lookahead, cost_ratio=cost_ratio)
    env_list, owned = _as_envs(envs)
    try:
        _check_spaces(env_list)
        N = len(env_list)
        policies = _per_env(policy, N, "policy")
        drafts = _per_env(draft, N, "draft")
        space, act_space = env_list[0].observation_space, env_list[0].action_space
        discrete = isinstance(act_space, gym.spaces.Discrete)
        if verify == "auto":
            verify = "block" if discrete else "token"
        if not discrete and verify != "token":
            raise ValueError(
                f"verify={verify!r} needs Discrete actions; Box actions (Normal policies) are "
                "verified token-wise by reflection coupling: use verify='token' or 'auto'"
            )
        snaps = [snapshotter(e) for e in env_list]  # raises SnapshotError before anything runs
        env_seeds, gen = rollout_seeds(rng, N)
        first = _reset(env_list, env_seeds)
        draft_policy = PolicyDraft(drafts, space, act_space, greedy=verify == "greedy")
        proc = RolloutProcess(env_list, snaps, first, policies, draft_policy)
        try:
            res = run(proc, N, max_steps, lookahead=lookahead, verify=verify, rng=gen, max_lookahead=max_lookahead,
                      cost_ratio=cost_ratio, keep_samples=False)
        except BaseException as err:  # KeyboardInterrupt too: leave the environments usable, then re-raise
            problems = proc.abort()
            add_note(err, "speculate.domains.rl: the environments were put back to their last committed state "
                      "and the round's snapshots released" + (f" ({'; '.join(problems)})" if problems else ""))
            raise
        _truncate(proc.rows, max_steps)  # as plain rollouts do (max_steps=0 too: the same law, flags included)
        return Rollouts([_episode(space, act_space, r, res.stats) for r in proc.rows], res.stats)
    finally:
        if owned:
            for e in env_list:
                e.close()


def _rollouts_block(rng, envs, policy, draft, **kw):
    return speculative_rollouts(list(envs), policy if callable(policy) else list(policy),
                                draft if callable(draft) else list(draft), rng=rng, **kw)


def _rollouts_merge(parts: list, seconds: float) -> Rollouts:
    stats = Stats.merge(p.stats for p in parts)
    episodes = [e for p in parts for e in p.episodes]
    for e in episodes:
        e.stats = stats
    return Rollouts(episodes, stats)


def rollouts_sharded(envs, policy, draft, *, executor=None, shards=None, rows_per_stream=1, rng=0, **kw) -> Rollouts:
    """:func:`speculative_rollouts` with one random stream per environment (reset seed, actions,
    uniforms): what ``speculative_rollouts(executor=..., shards=...)`` runs. Each stream's
    environments run :func:`speculative_rollouts` on a worker (``speculate.distributed.map_shards``);
    the episodes are merged in environment order, the stats summed (every episode holds the sum)."""
    import gymnasium as gym

    if isinstance(envs, gym.vector.SyncVectorEnv):
        envs = list(envs.envs)
    if isinstance(envs, gym.Env):
        envs = [envs]
    envs = list(envs)
    if executor is not None and any(isinstance(e, gym.Env) for e in envs):
        raise TypeError("speculative_rollouts(executor=...): give env constructors (picklable callables such as "
                        "functools.partial(gymnasium.make, 'CartPole-v1')), not live environments: each worker "
                        "builds its own")
    cols: dict[str, Any] = {"envs": envs}
    fixed: dict[str, Any] = dict(kw)
    for name, value in (("policy", policy), ("draft", draft)):
        if not callable(value) and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != len(envs):
                raise ValueError(f"{name}: give one callable, or a sequence of {len(envs)} (one per environment)")
            cols[name] = list(value)
        else:
            fixed[name] = value
    return map_shards(_rollouts_block, cols, merge=_rollouts_merge, fixed=fixed, rng=rng, executor=executor,
                      shards=shards, rows_per_stream=rows_per_stream)


def speculative_rollout(
    env: Any,
    policy: Callable,
    draft: Callable,
    *,
    max_steps: int = 500,
    lookahead: int | str = 4,
    verify: str = "auto",
    rng: int | np.random.Generator | None = 0,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
) -> Episode:
    """One speculative episode of ``env``; see :func:`speculative_rollouts` for the arguments.

    Reproducibility rule: ``lookahead="auto"`` chooses k from measured timings unless ``cost_ratio=``
    is given, so only a fixed int ``lookahead``, or ``"auto"`` with ``cost_ratio``, makes a seeded
    episode reproducible (the law is exact either way). ``verify="greedy"`` gives the policy's argmax
    episode.

    >>> import gymnasium as gym, numpy as np
    >>> from speculate.domains.rl import TabularPolicy, speculative_rollout
    >>> pi = TabularPolicy(np.full((16, 4), 0.25))
    >>> episode = speculative_rollout(gym.make("FrozenLake-v1"), pi, pi, max_steps=5, rng=1)
    >>> episode.stats.target_calls <= len(episode)
    True
    """
    import gymnasium as gym

    if not isinstance(env, gym.Env):
        raise TypeError(f"speculative_rollout takes one gymnasium Env, got {type(env).__name__} "
                        "(use speculative_rollouts for several)")
    out = speculative_rollouts(env, policy, draft, max_steps=max_steps, lookahead=lookahead, verify=verify,
                               rng=rng, max_lookahead=max_lookahead, cost_ratio=cost_ratio)
    return out[0]


# ----------------------------------------------------------------------------------------------
# plain


def rollouts(
    envs: Any,
    policy: Callable | Sequence[Callable],
    *,
    max_steps: int = 500,
    rng: int | np.random.Generator | None = 0,
) -> Rollouts:
    """Plain rollouts of N environments in lockstep: one ``policy`` call per step for all of them.

    The reference that :func:`speculative_rollouts` matches in distribution (same reset seeds from
    the same ``rng``).

    >>> import gymnasium as gym, numpy as np
    >>> from speculate.domains.rl import TabularPolicy, rollouts
    >>> out = rollouts([gym.make("FrozenLake-v1")], TabularPolicy(np.full((16, 4), 0.25)), max_steps=3)
    >>> len(out[0]) <= 3
    True
    """
    max_steps = _check_steps(max_steps)
    rollout_seeds(rng, 0)  # checks rng (draws nothing)
    env_list, owned = _as_envs(envs)
    try:
        _check_spaces(env_list)
        N = len(env_list)
        policies = _per_env(policy, N, "policy")
        env_seeds, gen = rollout_seeds(rng, N)
        space, act_space = env_list[0].observation_space, env_list[0].action_space
        rows = [Row(e, None, own(o)) for e, o in zip(env_list, _reset(env_list, env_seeds), strict=True)]
        for t in range(max_steps):
            live = [i for i in range(N) if not rows[i].done]
            if not live:
                break
            calls = policy_calls(policies, live, [rows[i].observations[-1] for i in live], space, act_space)
            for idx, d in calls:  # one policy at a time, its rows in order
                for p, a in zip(idx, d.sample(gen), strict=True):
                    try:
                        a = env_action(act_space, a)
                    except ValueError as err:
                        raise ValueError(f"policy {policies[live[p]].name} of environment {live[p]}: {err}") from None
                    row = rows[live[p]]
                    row.append(a, step_env(row.env, a, _where(live[p], row.env, t)))
        _truncate(rows, max_steps)
        return Rollouts([_episode(space, act_space, r, None) for r in rows], None)
    finally:
        if owned:
            for e in env_list:
                e.close()


def rollout(env: Any, policy: Callable, *, max_steps: int = 500, rng: int | np.random.Generator | None = 0) -> Episode:
    """One plain episode of ``env`` under ``policy`` (one policy call per step)."""
    return rollouts(env, policy, max_steps=max_steps, rng=rng)[0]
