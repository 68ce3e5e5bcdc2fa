"""chain() and chains(): speculative sampling of any Markov process given as three functions.

- ``target(states)`` scores a list of states in ONE call and returns one distribution per state:
  a batched :class:`Categorical` / :class:`Normal` with batch shape ``(len(states),)``, or a
  sequence of distributions (plain values mean point masses).
- ``draft(state)`` returns the draft distribution at one state; decorate it with
  :func:`batched` if it takes a list of states and returns one distribution per state.
- ``step(state, outcome)`` returns the next state. It must NOT mutate ``state``: drafted states
  are branches, and rejected ones are simply dropped. (Domains whose state is costly to copy, such
  as KV caches or simulators, implement the Process protocol of ``speculate.rounds`` instead.)
- ``stop(state, outcome)`` (optional) ends a chain after an outcome (an end-of-sequence token, a
  terminal state); the outcome that stops it is included.

The outcomes are jointly distributed exactly as sampling ``target`` step by step (proofs/05).

>>> import numpy as np, speculate as sp
>>> P = np.array([[0.9, 0.1], [0.2, 0.8]])            # a two-state Markov chain
>>> target = lambda states: sp.Categorical(probs=P[np.array(states)])
>>> draft = lambda s: sp.Categorical(probs=[[0.8, 0.2], [0.3, 0.7]][s])
>>> traj = sp.chain(target, draft, lambda s, x: x, 0, n=50, lookahead=4, rng=0)
>>> len(traj.samples), traj.state == traj.samples[-1], traj.stats.target_calls < 50
(50, True, True)
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .distributed.sharding import map_shards
from .distributions import Categorical, Normal, as_distribution
from .errors import add_note
from .rounds import Proposal, Verdict, run
from .stats import Stats

__all__ = ["Trajectories", "Trajectory", "batched", "chain", "chains", "chains_sharded"]


#: states a step may return unchanged (as the same object): values that cannot be changed in place
_IMMUTABLE = (numbers.Number, str, bytes, tuple, frozenset, type(None), np.generic)


def _fresh_states(step: Callable) -> Callable:
    """``step`` checked on every call: returning the very (mutable) object it was given means it
    changed that state in place, which corrupts the drafted paths (every drafted state is kept
    until verification, and a rejected one must still read as it was): a ``ValueError``."""

    named = _named(step, "step(state, outcome), the chain's transition")

    def checked(state: Any, outcome: Any) -> Any:
        new = named(state, outcome)
        if new is state and not isinstance(state, _IMMUTABLE):
            raise ValueError(
                f"step returned the {type(state).__name__} it was given: chains keep every drafted state "
                "until the target verifies it, so step must return a new state and leave its input "
                "unchanged (e.g. return state + [x] or np.append(state, x), not state.append(x); return state)")
        return new

    return checked


def _named(fn: Callable | None, what: str) -> Callable | None:
    """``fn`` with a note naming it on any exception it raises (the round loop's note says only the
    phase: a step or stop called while drafting would read as "raised in propose")."""
    if fn is None:
        return None

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as err:
            add_note(err, f"raised in your {what}")
            raise

    call.batched = getattr(fn, "batched", False)  # type: ignore[attr-defined]
    return call


def batched(fn: Callable) -> Callable:
    """Mark a draft function as batched: it takes a list of states and returns one distribution each."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn


@dataclass
class Trajectory:
    samples: list  #: the n outcomes in order
    state: Any  #: the final state
    stats: Stats


@dataclass
class Trajectories:
    samples: list  #: per chain, its outcomes in order
    states: list  #: per chain, its final state
    stats: Stats  #: counters of the whole run

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Trajectory:
        return Trajectory(self.samples[i], self.states[i], self.stats)


def _split(out: Any, count: int, who: str) -> list:
    """One distribution per state from a batched distribution or a sequence."""
    if isinstance(out, (Categorical, Normal)):
        if len(out.batch_shape) != 1 or out.batch_shape[0] != count:
            raise ValueError(
                f"{who} returned a {type(out).__name__} with batch shape {out.batch_shape} for {count} states; "
                f"expected batch shape ({count},): {_batch_hint(out, count)}"
            )
        return [out[i] for i in range(count)]
    try:
        seq = list(out)
    except TypeError:
        raise ValueError(f"{who} must return one distribution per state, got {type(out).__name__}") from None
    if len(seq) != count:
        raise ValueError(f"{who} returned {len(seq)} distributions for {count} states")
    return [as_distribution(d, f"{who}'s distribution for a state") for d in seq]


def _batch_hint(out: Any, count: int) -> str:
    """How to give one distribution per state, for the error above."""
    if isinstance(out, Normal):
        if out.batch_ndims == 0 and out.loc.ndim >= 1 and out.loc.shape[0] == count:
            return (
                f"its loc has shape {out.loc.shape}, but a Normal's batch axes are only the first batch_ndims "
                "axes (default 0: the whole array is one event); pass batch_ndims=1, as in "
                "speculate.Normal(loc, scale, batch_ndims=1), so that axis 0 indexes the states"
            )
        return (
            f"give loc of shape ({count}, *event) with batch_ndims=1 (its loc has shape {out.loc.shape} "
            f"and batch_ndims={out.batch_ndims})"
        )
    return f"give probs (or logits) of shape ({count}, num_outcomes), one row per state (got {out.probs.shape})"


def _stack(dists: list, shape: tuple[int, ...]) -> Any:
    """Stack unbatched distributions into one batched one of batch ``shape`` when they are all alike;
    otherwise nested lists ``[rows][positions]`` (None when ``shape`` has branches)."""
    if dists and all(isinstance(d, Categorical) and not d.batch_shape for d in dists):
        if len({d.num_outcomes for d in dists}) == 1:
            return Categorical._of(np.stack([d.probs for d in dists]).reshape(*shape, -1))
    if dists and all(isinstance(d, Normal) and not d.batch_shape for d in dists):
        if len({d.loc.shape for d in dists}) == 1:
            ev = dists[0].loc.shape
            loc = np.stack([d.loc for d in dists]).reshape(*shape, *ev)
            scale = np.stack([np.broadcast_to(d.scale, ev) for d in dists]).reshape(*shape, *ev)
            return Normal(loc, scale, batch_ndims=len(shape), validate=False)
    if len(shape) != 2:
        return None
    it = iter(dists)
    return [[next(it) for _ in range(shape[1])] for _ in range(shape[0])]


def _reshape(out: Any, shape: tuple[int, ...]) -> Any:
    if isinstance(out, Categorical):
        return out.reshape(*shape)
    ev = out.event_shape
    scale = np.broadcast_to(out.scale, out.loc.shape).reshape(*shape, *ev)
    return Normal(out.loc.reshape(*shape, *ev), scale, batch_ndims=len(shape), validate=False)


def _batch(out: Any, count: int, who: str) -> Any:
    """A batched Categorical/Normal of batch shape (count,), stacking a sequence when possible;
    otherwise the list of distributions."""
    if isinstance(out, (Categorical, Normal)) and out.batch_shape == (count,):
        return out
    dists = _split(out, count, who)
    stacked = _stack(dists, (count,))
    return stacked if stacked is not None and not isinstance(stacked, list) else dists


class _FunctionProcess:
    """The Process protocol for a user's (target, draft, step) functions.

    Drafting advances all live branches of all active rows together, one draft step at a time, so a
    batched draft is called k times per round, and sampling is vectorised whenever the draft
    distributions are Categorical or Normal.
    """

    def __init__(self, target, draft, step, states, stop, greedy=False):
        self.target, self.draft = _named(target, "target(states)"), _named(draft, "draft(state)")
        self.step, self.stop = _fresh_states(step), _named(stop, "stop(state, outcome)")
        self.states = list(states)
        self._batched = bool(getattr(draft, "batched", False))
        self.greedy = greedy  # verify="greedy": a Categorical draft proposes its argmax

    def _pick(self, d: Any, rng: np.random.Generator) -> Any:
        """The drafted outcomes of one draft step: samples, or under greedy verification the draft's
        argmax (first maximum) for Categoricals; a point mass proposes its value either way."""
        if not self.greedy:
            return [di.sample(rng) for di in d] if isinstance(d, list) else d.sample(rng)
        if isinstance(d, Categorical):
            return np.argmax(d.probs, axis=-1).astype(np.int64, copy=False)
        if isinstance(d, list):
            return [
                int(np.argmax(di.probs)) if isinstance(di, Categorical) and not di.batch_shape else di.sample(rng)
                for di in d
            ]
        return d.sample(rng)

    def _draft_step(self, states: list) -> Any:
        if self._batched:
            return _batch(self.draft(states), len(states), "draft")
        return _batch([self.draft(s) for s in states], len(states), "draft")

    def propose(self, rows, k, branches, need, rng):
        R, m = len(rows), branches
        P = R * m  # branches, row-major: branch j of row i is pair i * m + j
        states = self.states
        paths = [[states[r]] for r in rows.tolist() for _ in range(m)]
        steps = []  # per draft step: (live pair indices or None for all, distributions, outcomes)
        stopped = {}  # pair -> index of the drafted outcome that stopped it
        step, stop = self.step, self.stop
        live: Any = range(P)
        qbuf = xbuf = None  # while every step is a Categorical over all branches: filled in place
        # drafts each pair may use (None: all k): a chain never needs more than need - 1
        need_l = need.tolist()  # Python ints: cheaper than array reductions for a few rows
        cap = None if k < min(need_l) else [min(c - 1, k) for c in need_l for _ in range(m)]
        for i in range(k):
            if cap is not None:
                live = [p for p in live if cap[p] > i]
            if not live:
                break
            d = self._draft_step([paths[p][-1] for p in live])
            xs = self._pick(d, rng)
            xl = xs.tolist() if isinstance(xs, np.ndarray) and xs.ndim == 1 else xs
            full = len(live) == P
            if full and isinstance(d, Categorical):
                if i == 0:
                    qbuf, xbuf = np.empty((P, k, d.num_outcomes), d.dtype), np.empty((P, k), np.int64)
                if qbuf is not None and d.num_outcomes == qbuf.shape[2] and d.dtype == qbuf.dtype:
                    qbuf[:, i], xbuf[:, i] = d.probs, xs
                else:
                    qbuf = None
            else:
                qbuf = None
            steps.append((None if full else np.array(live), d, xs))
            if stop is None:
                for p, x in zip(live, xl, strict=True):
                    path = paths[p]
                    path.append(step(path[-1], x))
                continue
            still = []
            for p, x in zip(live, xl, strict=True):
                path = paths[p]
                s = path[-1]
                path.append(step(s, x))
                if stop(s, x):
                    stopped[p] = len(path) - 2
                else:
                    still.append(p)
            live = still
        lengths = None  # every branch drafted all k
        if stopped or cap is not None:
            lengths = np.array([len(path) - 1 for path in paths], np.int64).reshape(R, m)
            lengths = lengths[:, 0] if m == 1 else lengths
            for path in paths:  # pad short branches: the target scores k+1 states each, extras unused
                path.extend([path[-1]] * (k + 1 - len(path)))
        context = (paths, stopped)
        shape = (R, k) if m == 1 else (R, m, k)
        if k == 0:
            return Proposal(np.zeros(shape, np.int64), None, lengths, context)
        if qbuf is not None and len(steps) == k:  # every step a Categorical over every branch
            q = Categorical._of(qbuf.reshape(*shape, qbuf.shape[2]))
            return Proposal(xbuf.reshape(shape), q, lengths, context)
        kinds = {type(d) for _, d, _ in steps}
        if kinds == {Categorical} and len({d.num_outcomes for _, d, _ in steps}) == 1:
            V = steps[0][1].num_outcomes
            q = np.zeros((P, k, V), np.result_type(*[d.dtype for _, d, _ in steps]))
            x = np.zeros((P, k), np.int64)
            for i, (lv, d, xs) in enumerate(steps):
                lv = slice(None) if lv is None else lv
                q[lv, i], x[lv, i] = d.probs, xs
            return Proposal(x.reshape(shape), Categorical._of(q.reshape(*shape, V)), lengths, context)
        if kinds == {Normal} and len({d.event_shape for _, d, _ in steps}) == 1:
            ev = steps[0][1].event_shape
            loc, scale = np.zeros((P, k, *ev)), np.ones((P, k, *ev))
            x = np.zeros((P, k, *ev))
            for i, (lv, d, xs) in enumerate(steps):
                lv = slice(None) if lv is None else lv
                loc[lv, i], scale[lv, i], x[lv, i] = (
                    d.loc,
                    np.broadcast_to(d.scale, d.loc.shape),
                    xs,
                )
            q = Normal(
                loc.reshape(*shape, *ev),
                scale.reshape(*shape, *ev),
                batch_ndims=len(shape),
                validate=False,
            )
            return Proposal(x.reshape(*shape, *ev), q, lengths, context)
        if m != 1:
            raise ValueError("multi-draft (branches > 1) needs Categorical draft distributions")
        qs = [[None] * k for _ in range(R)]
        xl = [[None] * k for _ in range(R)]
        for i, (lv, d, xs) in enumerate(steps):
            for t, p in enumerate(range(P) if lv is None else lv.tolist()):
                qs[p][i] = d[t]
                xl[p][i] = xs[t]
        return Proposal(xl, qs, lengths, context)

    def score(self, rows, proposal):
        paths, _ = proposal.context
        m = len(paths) // len(rows)
        k1 = len(paths[0])
        flat = [s for path in paths for s in path]
        shape = (len(rows), k1) if m == 1 else (len(rows), m, k1)
        out = _batch(self.target(flat), len(flat), "target")
        if isinstance(out, (Categorical, Normal)):
            return _reshape(out, shape)
        if m != 1:
            raise ValueError("multi-draft (branches > 1) needs Categorical target distributions")
        return [out[i * k1 : (i + 1) * k1] for i in range(len(rows))]

    def commit(self, rows, proposal: Proposal, verdict: Verdict):
        paths, stopped = proposal.context
        m, stop, states = len(paths) // len(rows), self.stop, self.states
        E = verdict.outcomes
        n_used: list[int] = []
        done: list[bool] | None = None if stop is None else []  # None: no chain can stop early
        rows_accepted_branch = zip(rows.tolist(), verdict.n_accepted.tolist(), verdict.branch.tolist(), strict=True)
        for i, (r, a, b) in enumerate(rows_accepted_branch):
            p = i * m + b
            path = paths[p]
            stop_at = stopped.get(p)
            if stop_at is not None and stop_at < a:  # a kept draft stopped the chain
                n_used.append(stop_at + 1)
                done.append(True)  # type: ignore[union-attr]
                states[r] = path[stop_at + 1]
                continue
            y = E[i, a]  # the verifier's outcome follows the kept drafts
            if isinstance(y, np.generic):  # a Python scalar, as the drafted outcomes step() saw
                y = y.item()
            states[r] = self.step(path[a], y)
            n_used.append(a + 1)
            if done is not None:
                done.append(bool(stop(path[a], y)))
        return n_used, done


def chains(
    target: Callable[[list], Any],
    draft: Callable[[Any], Any],
    step: Callable[[Any, Any], Any],
    states: list,
    n: int | list[int],
    *,
    lookahead: int | str = 4,
    verify: str = "token",
    branches: int = 1,
    stop: Callable[[Any, Any], bool] | None = None,
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    executor: Any = None,
    shards: int | None = None,
    rows_per_stream: int = 1,
) -> Trajectories:
    """Advance B independent chains together: one target call per round for all B x (k+1) states.

    Each chain stops at ``n`` outcomes (an int, or one per chain) or at ``stop``; finished chains
    drop out without stalling the others. ``verify``: ``"token"`` (Leviathan et al.), ``"block"``
    (Sun et al.; Categorical only), ``"greedy"`` (point-mass or argmax targets; a Categorical draft
    then proposes its argmax, first maximum on ties, and a point mass its value); ``branches=m`` > 1
    drafts m independent branches per round, verified by recursive rejection (Categorical only).
    ``lookahead``: k drafts per round, or ``"auto"``: k chosen each round from the running alpha
    and the cost ratio c (measured, or ``cost_ratio`` if given, which makes seeded runs
    bit-reproducible); see speculate.rounds.

    ``executor`` / ``shards`` (either one): the seed-stable sharded run of
    :mod:`speculate.distributed`: every chain draws from its own stream derived from ``rng``
    (``rows_per_stream`` chains per stream and batched loop), the shards run on ``executor`` (any
    ``concurrent.futures.Executor``, a Dask ``Client``, ``"ray"``; None: here, one after another),
    and the same seed gives the same samples for any executor and shard count. Without them, all B
    chains share one stream (the fastest path on one machine; its samples depend on B).
    """
    for name, fn in (("target", target), ("draft", draft), ("step", step)):
        if not callable(fn):
            raise TypeError(f"chains: {name} must be callable, got {type(fn).__name__}")
    if stop is not None and not callable(stop):
        raise TypeError(f"chains: stop must be callable or None, got {type(stop).__name__}")
    if executor is not None or shards is not None:
        return chains_sharded(target, draft, step, states, n, executor=executor, shards=shards,
                              rows_per_stream=rows_per_stream, rng=rng, lookahead=lookahead, verify=verify,
                              branches=branches, stop=stop, max_lookahead=max_lookahead, cost_ratio=cost_ratio)
    states = list(states)
    proc = _FunctionProcess(target, draft, step, states, stop, greedy=verify == "greedy")
    res = run(
        proc,
        len(states),
        n,
        lookahead=lookahead,
        verify=verify,
        branches=branches,
        rng=rng,
        max_lookahead=max_lookahead,
        cost_ratio=cost_ratio,
    )
    return Trajectories(res.samples, proc.states, res.stats)


def _chains_block(rng, states, n, target, draft, step, **kw):
    return chains(target, draft, step, list(states), list(n), rng=rng, **kw)


def _chains_merge(parts: list, seconds: float) -> Trajectories:
    return Trajectories([s for p in parts for s in p.samples], [s for p in parts for s in p.states],
                        Stats.merge(p.stats for p in parts))


def chains_sharded(target, draft, step, states, n, *, executor=None, shards=None, rows_per_stream=1, rng=None,
                   **kw) -> Trajectories:
    """:func:`chains` with one random stream per chain (see :mod:`speculate.distributed`): what
    ``chains(executor=..., shards=...)`` runs. Each stream's chains run :func:`chains` on a worker
    (:func:`speculate.distributed.map_shards`); the parts are merged in row order, the stats summed.

    >>> import numpy as np, speculate as sp
    >>> P = np.array([[0.9, 0.1], [0.2, 0.8]])
    >>> target = lambda states: sp.Categorical(probs=P[np.array(states)])
    >>> draft = lambda s: sp.Categorical(probs=[[0.8, 0.2], [0.3, 0.7]][s])
    >>> out = chains_sharded(target, draft, lambda s, x: x, [0, 1, 0], 20, lookahead=3, rng=5, shards=2)
    >>> same = chains_sharded(target, draft, lambda s, x: x, [0, 1, 0], 20, lookahead=3, rng=5, shards=3)
    >>> out.samples == same.samples, [len(s) for s in out.samples], out.stats.rounds == same.stats.rounds
    (True, [20, 20, 20], True)
    """
    states = list(states)
    ns = [n] * len(states) if isinstance(n, (int, np.integer)) else list(n)
    if len(ns) != len(states):
        raise ValueError(f"chains: n has {len(ns)} entries for {len(states)} chains")
    return map_shards(_chains_block, {"states": states, "n": ns}, merge=_chains_merge,
                      fixed={"target": target, "draft": draft, "step": step, **kw},
                      rng=rng, executor=executor, shards=shards, rows_per_stream=rows_per_stream)


def chain(
    target: Callable[[list], Any],
    draft: Callable[[Any], Any],
    step: Callable[[Any, Any], Any],
    state: Any,
    n: int,
    *,
    lookahead: int | str = 4,
    verify: str = "token",
    branches: int = 1,
    stop: Callable[[Any, Any], bool] | None = None,
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
) -> Trajectory:
    """Sample ``n`` outcomes of one chain speculatively; see :func:`chains` for the arguments."""
    res = chains(
        target,
        draft,
        step,
        [state],
        n,
        lookahead=lookahead,
        verify=verify,
        branches=branches,
        stop=stop,
        rng=rng,
        max_lookahead=max_lookahead,
        cost_ratio=cost_ratio,
    )
    return res[0]
