"""The round loop every domain runs on: draft -> one batched target call -> verify -> commit.

A domain implements the Process protocol (docs/architecture.md)::

    proposal = process.propose(rows, k, branches, need, rng)  # draft; per-round state in proposal.context
    target   = process.score(rows, proposal)                   # k+1 states per row in ONE call
    n_used, done = process.commit(rows, proposal, verdict)     # advance by the verified outcomes

This module owns everything else: the budget (how many outcomes each row still needs, so no row is
drafted past it), fresh uniforms every round, the choice of verification rule (speculate.verify),
ragged acceptance across rows, rows that finish early, the statistics, and the automatic lookahead.

Automatic lookahead (``lookahead="auto"``, :class:`Lookahead`): after each round, alpha is estimated
as accepted / (accepted + rejections) over rows and rounds with exponential forgetting (weight 0.9
per round, a Beta(1, 1) prior); the next round uses the k in 0..max_lookahead (0: plain decoding
through the same loop) with the most expected outcomes per measured second: the draft's time per
step, the target call's time at each width (measured, at the batch's current size) and the loop's
own time per round. With a fixed ``cost_ratio`` it maximises speculate.theory.speedup(alpha, k, c)
instead (0 when no k pays; from the first round, at the prior's alpha 1/2). While the rule says 0,
probing rounds draft the best positive k (after 8 rounds at 0, then 16, 32, ...; not with a fixed
``cost_ratio >= 1``: then no k can pay, and a run at k = 0 throughout is the plain chain, draw for
draw). The choice depends only on past
rounds, so every round stays exact (proofs/06). With measured timings k depends on the machine's
speed, so a seeded run is exact but not bit-reproducible; pass ``cost_ratio=`` to make "auto" depend
on the seed alone.

A Process in full: rows of i.i.d. flips of a biased coin (the state never changes, so commit
only takes the outcomes), the target ``P`` scored for k+1 states in one call:

>>> import numpy as np, speculate as sp
>>> P, Q = np.array([0.6, 0.4]), np.array([0.5, 0.5])
>>> class Coins:
...     def propose(self, rows, k, branches, need, rng):
...         q = sp.Categorical(probs=np.broadcast_to(Q, (len(rows), k, 2)), validate=False)
...         return Proposal(q.sample(rng), q)            # outcomes [R, k] drawn from q, fresh
...     def score(self, rows, proposal):
...         k = proposal.outcomes.shape[1]
...         return sp.Categorical(probs=np.broadcast_to(P, (len(rows), k + 1, 2)), validate=False)
...     def commit(self, rows, proposal, verdict):
...         return verdict.n_accepted + 1, None            # every verified outcome is used
>>> res = run(Coins(), n_rows=3, n=10, lookahead=4, rng=0)
>>> [len(s) for s in res.samples], res.stats.target_calls < 3 * 10, res.stats.emitted
([10, 10, 10], True, 30)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import numpy as np

from . import theory
from ._inverse_cdf import warm_up
from .errors import add_note
from .rng import as_rng
from .stats import Stats
from .verify import RULES, verify_round
from .verify.one_round import as_tree, tree_within_need

__all__ = ["Lookahead", "Process", "Proposal", "Round", "RoundLoop", "RunResult", "Verdict", "rounds", "run"]



class Proposal(NamedTuple):
    """What ``Process.propose`` returns (see docs/architecture.md for shapes)."""

    outcomes: Any  #: drafted outcomes: int64 [R, k] ([R, m, k]), floats [R, k, *event], or nested lists [R][k]
    dists: Any  #: the draft distributions they were drawn from (batched) or nested lists; None = point masses
    lengths: Any = None  #: valid drafts per row (int64 [R] or [R, m]; trees: valid-node mask bool [R, N+1]); None = all
    context: Any = None  #: the Process's own state for this round, handed back to score and commit
    tree: Any = None  #: a token tree's shape (speculate.verify.Tree or a parent array [N+1] / [R, N+1]); None = chains


class Verdict(NamedTuple):
    """What the verifier decided for the R rows of a round (handed to ``Process.commit``)."""

    outcomes: np.ndarray  #: [R, k+1, *event]: row r's kept drafts, then the verifier's draw at n_accepted[r]
    n_accepted: np.ndarray  #: int64 [R]: kept drafts; row r gets outcomes[r, :n_accepted[r] + 1]
    branch: np.ndarray  #: int64 [R]: the surviving draft branch (0 with one branch); trees: the path's last node
    path: Any = None  #: token trees: int64 [R, D], the accepted nodes root's child first, -1 past n_accepted


class Process(Protocol):
    """A batch of chains that the round loop advances (implemented by each domain).

    Optional: ``plain(rows, n, rng) -> (outcomes [R, max n, *event], n_used [R], done [R] or None)``
    advances each row by ``n[r]`` steps of the target alone (plain sampling) in one call. When
    ``lookahead="auto"`` decides that no lookahead pays (k = 0), the loop runs such stretches (up to the
    next probing round) instead of rounds without drafts, so that not speculating costs what plain
    sampling costs (``speculate.domains.physics``'s process has one)."""

    def propose(
        self, rows: np.ndarray, k: int, branches: int, need: np.ndarray, rng: np.random.Generator
    ) -> Proposal: ...

    def score(self, rows: np.ndarray, proposal: Proposal) -> Any: ...

    def commit(
        self, rows: np.ndarray, proposal: Proposal, verdict: Verdict
    ) -> tuple[Any, Any]: ...  # (n_used int [R], done bool [R] or None when no row can finish early)


class RunResult(NamedTuple):
    samples: list | None  #: per row, the list of outcomes in order (None with keep_samples=False)
    stats: Stats


class Lookahead:
    """The lookahead of each round: fixed, or ``"auto"``, chosen from past rounds only (proofs/06).

    ``"auto"`` estimates alpha as accepted / (accepted + rejections) over past drafting rounds (weight
    ``decay`` per round, a Beta(1, 1) prior) and picks the k in 0..max_lookahead (0: plain decoding
    through the same loop) with the most expected outcomes per second:

        rate(k) = E_k(alpha) / (k * step + T(k) + rest),   E_k = (1 - alpha^(k+1)) / (1 - alpha), E_0 = 1

    ``step``: measured seconds per draft step; ``T(k)``: measured seconds of the target call of a round
    that drafted k, at the batch's current width (moving averages per k, smoothed by the least-squares
    line through them, each width weighted by FADE per round since it was measured, so the cost of a
    wider block is measured, not assumed flat, and follows a cache that grows); while drafting pays, one
    round at k = 0 after REFRESH drafting rounds measures the time without drafts again;
    ``rest``: the loop's other seconds per round (verification, commit). The first rounds measure: k = 1
    (the first round's times hold one-off costs and are not kept: the cheapest round that drafts), k = 4
    (a width wide enough that the line does not miss a call that batches well), then k = 0 once, then the
    rule decides. While the rule says
    0, a round after every ``every`` rounds drafts the best positive k (a probe), so alpha and the costs stay
    current. ``every`` is set so that probes cost at most PROBE_BUDGET of the time: the last probe's measured
    loss (its seconds minus what plain steps would have taken for its outcomes; before any probe, the
    measuring round's, where no k would pay even at alpha = 1; else 8 rounds) over PROBE_BUDGET times a
    plain round's seconds, in 8..MAX_PROBE. A process
    with ``plain`` runs the rounds at 0 as stretches of plain steps. With ``cost_ratio=`` the rule is the
    textbook one, from alpha and that ratio alone (0 when no k pays; ``every`` doubles after each probe
    that still says 0), and a seeded run is reproducible.
    """

    PROBE = 8  #: rounds at k = 0 before the first probing round
    MAX_PROBE = 4096  #: the most rounds at k = 0 between two probes
    PROBE_BUDGET = 0.01  #: the share of the time that probes may lose where drafting does not pay
    FIRST = 1  #: the lookahead of a run's first round (its times hold one-off costs and are not kept)
    MEASURE = 4  #: the lookahead of the measuring round (a width the line can extrapolate from)
    FADE = 0.97  #: weight per round of age of a width's time in the width line (64 rounds: 0.14)
    REFRESH = 64  #: rounds of drafting after which one round at k = 0 measures the call without drafts again

    def __init__(
        self, lookahead: int | str, max_lookahead: int, cost_ratio: float | None = None, decay: float = 0.9
    ) -> None:
        self.auto = lookahead == "auto"
        if not self.auto and (isinstance(lookahead, bool) or not isinstance(lookahead, (int, np.integer))):
            raise TypeError(f"lookahead must be a non-negative int or 'auto', got {lookahead!r}")
        if not self.auto and lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        if max_lookahead < 1:
            raise ValueError(f"max_lookahead must be >= 1, got {max_lookahead}")
        self.k = min(self.FIRST, max_lookahead) if self.auto else int(lookahead)
        self.max, self.decay = int(max_lookahead), decay
        self.acc = self.rej = 0.0
        if cost_ratio is not None and not (0.0 <= cost_ratio < float("inf")):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio}")
        if self.auto and cost_ratio is not None:  # the textbook rule from the start, at the prior's alpha
            self.k = theory.optimal_lookahead(0.5, float(cost_ratio), self.max)
        self.fixed_c = cost_ratio
        self.c: float | None = cost_ratio  # draft step / target call (reported by Stats)
        self.rounds = 0
        self.step: float | None = None  # seconds per draft step
        self.call: dict[int, float] = {}  # k -> seconds of the target call of a round with k drafts
        self.rest: float | None = None  # the loop's other seconds per round
        self.zeros = 0  # rounds at k = 0 since the last drafting round
        self.every = self.PROBE  # rounds at k = 0 between two probes
        self.probing = False  # the last choice was a probe
        self.skip = True  # the next round's times hold one-off costs (first calls, allocation): not kept
        self.plain_step: float | None = None  # seconds per step of the process's own plain path (k = 0)
        self.loss: float | None = None  # seconds the last probe lost against plain steps
        self.seen: dict[int, int] = {}  # k -> the round in which call[k] was last measured
        self.seen_plain = -(1 << 62)  # the round in which plain_step was last measured
        self.refreshing = False  # the next round is a refresh of the width-0 time
        self.measured: tuple[float, float] | None = None  # a drafting round before k = 0 was: (seconds, outcomes)

    @classmethod
    def kept(cls, holder: dict, lookahead: int | str, max_lookahead: int, cost_ratio: float | None,
             width: int) -> Lookahead | None:
        """The control a caller keeps across runs in ``holder`` (one per batch ``width`` and
        ``max_lookahead``) for measured ``lookahead="auto"``; None otherwise (a fixed lookahead, or a fixed
        ``cost_ratio``: each run then starts afresh and its output depends on its seed alone). Many short
        runs then pay for the measuring rounds once."""
        if lookahead != "auto" or cost_ratio is not None:
            return None
        key = (int(max_lookahead), int(width))
        c = holder.get(key)
        if c is None:
            c = holder[key] = cls("auto", max_lookahead)
        return c

    def begin(self) -> Lookahead:
        """A new run continues with what this control learned (alpha, the costs); its first round's
        times are not kept. A generator that runs many short requests keeps one control across them."""
        self.skip = True
        return self

    @classmethod
    def _ema(cls, old: float | None, new: float, age: int = 1) -> float:
        """A moving average; an old value measured ``age`` rounds ago keeps 0.8 * FADE**(age - 1) of its
        weight (a width measured rarely is mostly replaced by its new time)."""
        if old is None:
            return new
        w = 0.8 * cls.FADE ** max(age - 1, 0)
        return w * old + (1.0 - w) * new

    def update(self, n_acc: np.ndarray, lengths: np.ndarray | None, k: int, t_draft: float, t_target: float,
               t_rest: float = 0.0) -> None:
        if not self.auto:
            return
        if k > 0:
            if lengths is None:
                lengths = np.full(len(n_acc), k, np.int64)
            self.acc = self.decay * self.acc + float(n_acc.sum())
            self.rej = self.decay * self.rej + float(np.sum(n_acc < lengths))
        alpha = (self.acc + 1.0) / (self.acc + self.rej + 2.0)
        self.rounds += 1
        if self.fixed_c is not None:
            best = theory.optimal_lookahead(alpha, self.fixed_c, self.max)
            if self.fixed_c >= 1.0:  # a draft step costs a target call: no k pays, even at alpha = 1
                self.k = best
                return
            self.k = self._probed(best, lambda: max(1, theory.optimal_lookahead(alpha, 0.0, self.max)))
            return
        skip, self.skip = self.skip, False
        if self.probing and not skip and k > 0:  # a probe: what it lost against plain steps
            plain = self._plain_round()
            if plain is not None:
                self.loss = max(t_draft + t_target + t_rest - float(np.mean(n_acc + 1)) * plain, 0.0)
        if not skip and k > 0 and self._plain_round() is None:  # measuring: its loss is known once k = 0 is
            self.measured = (t_draft + t_target + t_rest, float(np.mean(n_acc + 1)))
        if not skip and t_target > 0:  # a run's first round's times hold one-off costs: skipped
            self.call[k] = self._ema(self.call.get(k), t_target, self.rounds - self.seen.get(k, self.rounds))
            self.seen[k] = self.rounds
            self.rest = self._ema(self.rest, max(t_rest, 0.0))
            if k > 0:
                self.step = self._ema(self.step, t_draft / k)
                self.c = self.step / t_target
        if not self.call:  # measuring: a drafting round, then a plain one
            if k > 0 and self.step is None:
                self.k = min(self.MEASURE, self.max)
            return
        if 0 not in self.call and self.plain_step is None:  # measuring: then one round without drafts
            self.k = 0
            return
        self._decide(alpha)

    def _decide(self, alpha: float) -> None:
        """The next round's k from the measured rule; while drafting, one round at k = 0 after REFRESH
        rounds without one, so the time without drafts (the width line's intercept) follows the costs as
        they drift (a cache that grows, a batch that shrinks)."""
        self.refreshing = False
        self.k = self._probed(self._best(alpha)[0], lambda: max(1, self._best(alpha, positive=True)[0]))
        zero = max(self.seen.get(0, -(1 << 62)), self.seen_plain)
        if self.k > 0 and self.rounds - zero > self.REFRESH:
            self.k, self.refreshing = 0, True

    def _probed(self, best: int, positive: Any) -> int:
        """``best``, or after ``every`` rounds at 0 the best positive k (``positive()``): alpha and the
        costs of drafting stay current while the rule says not to draft. A probe after which the rule
        still says 0 sets ``every`` by ``_probe_interval``: where speculation does not pay, probing fades."""
        probed, self.probing = self.probing, False
        if best > 0:
            self.zeros, self.every, self.loss = 0, self.PROBE, None
            return best
        if probed:
            self.every = self._probe_interval()
        elif self.loss is None and self.measured is not None and self._plain_round() and self._hopeless():
            # the first time the rule says 0, where no k would pay even if every draft were kept: the
            # measuring round lost as a probe would, so it spaces the first probe too (a fixed 8 rounds
            # cost a fresh 100-step LJ run at N = 108 about 7%). Elsewhere (a low alpha, or noisy first
            # times) the first probe comes after PROBE rounds, so a misjudged start is soon undone.
            seconds, outcomes = self.measured
            self.loss, self.measured = max(seconds - outcomes * self._plain_round(), 0.0), None
            self.every = self._probe_interval()
        self.zeros += 1
        if self.zeros >= self.every:
            self.zeros, self.probing = 0, True
            return int(positive())
        return 0

    def _hopeless(self) -> bool:
        """No k >= 1 beats a plain round even at alpha = 1 (every draft kept), by the measured costs."""
        plain = self._plain_round()
        return bool(plain) and self._best(1.0, positive=True)[1] * plain < 1.0

    def _plain_round(self) -> float | None:
        """Seconds of a round at k = 0 (one step of every row): the plain path's step, else the measured
        target call at width 0 plus the loop's rest; None before either is measured."""
        if self.plain_step is not None:
            return self.plain_step
        if 0 in self.call:
            return self.call[0] + (self.rest or 0.0)
        return None

    def _probe_interval(self) -> int:
        """Rounds at k = 0 before the next probe: doubling with a fixed cost_ratio (no times); measured,
        as many as keep the last probe's loss within PROBE_BUDGET of the time, in PROBE..MAX_PROBE."""
        plain = self._plain_round()
        if self.fixed_c is not None or self.loss is None or not plain:
            return min(2 * self.every, self.MAX_PROBE)
        return int(min(max(np.ceil(self.loss / (self.PROBE_BUDGET * plain)), self.PROBE), self.MAX_PROBE))

    def plain_steps(self) -> int:
        """Steps a process with a plain path (``Process.plain``) runs at once while the rule says 0: up to
        the next probing round (no bound where the rule never probes: a fixed cost_ratio >= 1)."""
        if self.fixed_c is not None and self.fixed_c >= 1.0:
            return 1 << 62
        if self.refreshing:  # one step measures the plain path again, then the rule drafts
            return 1
        return max(1, self.every - self.zeros)

    def update_plain(self, steps: int, seconds: float) -> None:
        """``steps`` plain steps (k = 0, the process's own path) took ``seconds``; then as after as many
        rounds at k = 0 (a probing round after PROBE of them)."""
        if not self.auto:
            return
        self.rounds += 1
        skip, self.skip = self.skip, False
        if not skip and steps > 0 and seconds > 0:
            self.plain_step = self._ema(self.plain_step, seconds / steps, max(self.rounds - self.seen_plain, 1))
            self.seen_plain = self.rounds
        self.zeros += steps - 1
        alpha = (self.acc + 1.0) / (self.acc + self.rej + 2.0)
        if self.fixed_c is not None:
            best = theory.optimal_lookahead(alpha, self.fixed_c, self.max)
            self.k = best if self.fixed_c >= 1.0 else self._probed(
                best, lambda: max(1, theory.optimal_lookahead(alpha, 0.0, self.max)))
            return
        self._decide(alpha)

    def _width_line(self) -> tuple[float, float, float]:
        """The target call's time against width k: (intercept, slope >= 0, floor), the weighted
        least-squares line through every width measured (one width: flat at that time), so that one lucky
        or unlucky measurement does not steer the choice; a width's weight fades by FADE per round since it
        was last measured, so that old times (a shorter cache) yield to current ones; never below the
        cheapest measured call (the floor)."""
        known = [(k, t, self.seen.get(k, self.rounds)) for k, t in self.call.items()]  # (width, time, round)
        if 0 not in self.call and self.plain_step is not None:  # a plain step bounds the call without drafts
            known.append((0, self.plain_step, self.seen_plain))
        if not known:  # nothing measured yet
            return 0.0, 0.0, 0.0
        floor = min(t for _, t, _ in known)
        if len(known) == 1:
            return floor, 0.0, floor
        # a handful of points: plain floats (numpy's per-call cost would exceed the arithmetic)
        w = [self.FADE ** min(self.rounds - r, 10000) for _, _, r in known]
        sw = sum(w)
        km = sum(wi * k for wi, (k, _, _) in zip(w, known, strict=True)) / sw
        tm = sum(wi * t for wi, (_, t, _) in zip(w, known, strict=True)) / sw
        sxx = sxy = 0.0
        for wi, (k, t, _) in zip(w, known, strict=True):  # centred: no cancellation when a weight is tiny
            sxx += wi * (k - km) * (k - km)
            sxy += wi * (k - km) * (t - tm)
        b = sxy / sxx if sxx > 0 else 0.0
        return tm - b * km, max(b, 0.0), floor

    def _best(self, alpha: float, positive: bool = False) -> tuple[int, float]:
        step, rest = self.step or 0.0, self.rest or 0.0
        a, b, floor = self._width_line()  # one fit per decision, not one per candidate k
        best, best_rate = 0, -1.0
        last = -1.0
        for k in range(1 if positive else 0, self.max + 1):
            e = theory.expected_tokens(alpha, k)
            t = k * step + max(a + b * k, floor) + rest
            if k == 0 and self.plain_step is not None:  # the process's own plain path: what k = 0 costs
                t = min(t, self.plain_step)
            r = e / t if t > 0 else float(k + 1)
            if r > best_rate * (1 + 1e-9):  # ties: the smaller k
                best, best_rate = k, r
            if k >= 1:  # e (concave in k) over t (convex: a maximum of lines) is quasi-concave for k >= 1:
                if r < last:  # once the rate falls it never rises again, so no larger k can win
                    break
                last = r
        return best, best_rate


_Lookahead = Lookahead  # the name before it was public


def _per_row(n: Any, n_rows: int) -> np.ndarray:
    a = np.asarray(n)
    if a.ndim == 1 and a.size == 0:
        a = a.astype(np.int64)  # an empty list of counts, for no chains
    if not (np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_):  # checked even for no rows
        raise TypeError(f"n (outcomes per chain) must be an integer or integers, got {n!r} (dtype {a.dtype})")
    if a.ndim == 0:
        a = np.full(n_rows, a)
    if a.shape != (n_rows,):
        raise ValueError(f"n must be an int or one per row ({n_rows}), got shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() > np.iinfo(np.int64).max):
        raise ValueError(f"n (outcomes per chain) must lie in 0..2**63-1, got {a.min()}..{a.max()}")
    return a.astype(np.int64)


def _within_need(lengths: Any, need: np.ndarray, k: int, m: int) -> np.ndarray:
    """Per-row draft counts cut to ``need - 1``: more drafts than that could never be used."""
    cap = np.minimum(need - 1, k)
    if lengths is None:
        return cap if m == 1 else np.repeat(cap[:, None], m, axis=1)
    a = np.asarray(lengths, dtype=np.int64)
    return np.minimum(a, cap if a.ndim == 1 else cap[:, None])


def _padded(outcomes: Any, n: np.ndarray, nxt: Any, branch: np.ndarray, m: int) -> np.ndarray:
    """[R, k+1, *event]: each row's drafts (of its surviving branch) with the verifier's outcome at n[r]."""
    R = len(n)
    if isinstance(outcomes, np.ndarray) and isinstance(nxt, np.ndarray):
        rows = outcomes if m == 1 else outcomes[np.arange(R), branch]  # [R, k, *event]
        E = np.empty((R, rows.shape[1] + 1, *rows.shape[2:]), np.result_type(rows.dtype, nxt.dtype))
        E[:, :-1] = rows
        if R == 1:  # one chain: a scalar index is several times cheaper than a fancy one
            E[0, n[0]] = nxt[0]
        else:
            E[np.arange(R), n] = nxt
        return E
    k = max((len(o) for o in outcomes), default=0)  # nested lists (general distributions): objects
    E = np.empty((R, k + 1), dtype=object)
    for r in range(R):
        row = outcomes[r] if m == 1 else outcomes[r][branch[r]]
        for i in range(int(n[r])):
            E[r, i] = row[i]
        E[r, n[r]] = nxt[r]
    return E


def _tree_verdict(proposal: Proposal, n: np.ndarray, nxt: np.ndarray, path: np.ndarray) -> Verdict:
    """A token tree's verdict: outcomes [R, D+1] = the accepted path's tokens, then the next outcome."""
    R, D = path.shape
    tokens = np.asarray(proposal.outcomes)
    E = np.zeros((R, D + 1), np.result_type(tokens.dtype, nxt.dtype))
    rows = np.arange(R)
    on = path >= 0
    E[:, :D][on] = tokens[np.repeat(rows, D).reshape(R, D)[on], path[on]]
    E[rows, n] = nxt
    last = np.where(n > 0, path[rows, np.maximum(n - 1, 0)] if D else 0, 0)
    return Verdict(E, n, last, path)


def _tree_stats(stats: Stats, proposal: Proposal, k: int, verdict: Verdict) -> np.ndarray:
    """Count a tree round; returns the per-row draft counts the lookahead control sees (n_accepted,
    plus one where the walk ended by rejecting a candidate: the path's last node has children)."""
    tree = as_tree(proposal.tree)
    R = len(verdict.n_accepted)
    N1 = np.shape(tree.parent)[-1]
    parent = np.broadcast_to(np.asarray(tree.parent, np.int64), (R, N1))
    valid = np.ones((R, N1), bool) if proposal.lengths is None else np.asarray(proposal.lengths, bool)
    has_child = np.zeros((R, N1), bool)
    r, i = np.nonzero(valid[:, 1:])
    has_child[r, parent[r, i + 1]] = True
    rejected = has_child[np.arange(R), verdict.branch]
    stats.add_tree_round(k, verdict.n_accepted, verdict.path, valid[:, 1:].sum(axis=1), rejected)
    return verdict.n_accepted + rejected


def _rows(rows: np.ndarray) -> str:
    ids = rows.tolist()
    return ", ".join(map(str, ids)) if len(ids) <= 8 else ", ".join(map(str, ids[:8])) + f", ... ({len(ids)} rows)"



class Round(NamedTuple):
    """What :func:`rounds` yields after each round: who took part and what each row used."""

    rows: np.ndarray  #: int64 [R]: the rows of this round
    outcomes: np.ndarray  #: [R, k+1, *event]: the verdict's outcomes; row i used outcomes[i, :used[i]]
    used: list  #: per row, how many outcomes it used (commit's n_used)
    finished: list  #: the rows that are done after this round (n reached, or done by the process)
    stats: Stats  #: the run's counters so far


def rounds(
    process: Process,
    n_rows: int,
    n: int | np.ndarray,
    *,
    lookahead: int | str = 4,
    verify: str = "token",
    branches: int = 1,
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    stats: Stats | None = None,
    control: Lookahead | None = None,
) -> Iterator[Round]:
    """The round loop as a generator: one :class:`Round` after each commit, until every row of
    ``process`` has ``n`` outcomes (or is done). For callers that show results as they come
    (streaming); stopping early is allowed (close the generator: the process keeps what it
    committed). Arguments as for :func:`run`, which is this loop run to the end; ``control``: a
    :class:`Lookahead` to continue (``lookahead="auto"`` across calls: what it learned is the past).
    """
    if verify not in RULES:
        raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
    if isinstance(branches, bool) or not isinstance(branches, (int, np.integer)) or branches < 1:
        raise ValueError(f"branches (draft branches per round) must be an int >= 1, got {branches!r}")
    if branches > 1 and verify != "token":
        raise ValueError(f"multi-draft (branches={branches}) uses recursive rejection: pass verify='token'")
    m = int(branches)
    rng = as_rng(rng)
    wanted = _per_row(n, n_rows)
    if control is not None and not isinstance(control, Lookahead):
        raise TypeError(f"control must be a speculate.rounds.Lookahead, got {type(control).__name__}")
    control = Lookahead(lookahead, max_lookahead, cost_ratio) if control is None else control.begin()
    warm_up()  # the draws a draft step makes: compiled (once per process) before any round is timed
    stats = Stats() if stats is None else stats
    return _rounds(process, wanted, m, verify, rng, control, stats)


def _after(rows: np.ndarray, left: list, used: list | None, done: Any) -> tuple[np.ndarray, list, np.ndarray, list]:
    """After a round: (the rows that go on, their budgets, the round's rows, the rows that finished)."""
    if used is not None:
        left = [a - u for a, u in zip(left, used, strict=True)]
    done_l = np.asarray(done, dtype=bool).tolist() if done is not None else None
    keep = [a > 0 and not (done_l and done_l[i]) for i, a in enumerate(left)]
    finished: list = []
    event_rows = rows
    if not all(keep):  # finished rows drop out; the others go on
        finished = [r for r, kp in zip(rows.tolist(), keep, strict=True) if not kp]
        idx = [i for i, kp in enumerate(keep) if kp]
        rows, left = rows[idx], [left[i] for i in idx]
    return rows, left, event_rows, finished


def _rounds(process, wanted, m, verify, rng, control, stats) -> Iterator[Round]:
    plain = getattr(process, "plain", None)  # optional: several plain steps in one call (k = 0)
    rows = np.flatnonzero(wanted > 0)
    left = wanted[rows].tolist()  # outcomes each active row still needs (Python ints: cheap for few rows)
    phase = "propose"  # where an exception came from, for the note added to it below
    try:
        while rows.size:
            R = len(rows)
            k = min(control.k, max(left) - 1)  # never draft past what the neediest row can use
            need = np.array(left, np.int64)
            if k == 0 and control.auto and plain is not None:  # the process's own plain path: several steps
                phase = "plain"
                steps = min(control.plain_steps(), max(left))
                t0 = time.perf_counter()
                outcomes, n_used, done = plain(rows, np.minimum(need, steps), rng)
                dt = time.perf_counter() - t0
                used = np.asarray(n_used, np.int64).tolist()
                stats.add_plain(steps, sum(used))
                stats.emitted += sum(used)
                stats.target_time += dt
                control.update_plain(steps, dt)
                rows, left, event_rows, finished = _after(rows, left, used, done)
                phase = "the caller's handling of a round"
                yield Round(event_rows, outcomes, used, finished, stats)
                continue
            phase = "propose"
            t0 = time.perf_counter()
            proposal = process.propose(rows, k, m, need, rng)
            phase = "score"
            t1 = time.perf_counter()
            target = process.score(rows, proposal)
            phase = "verify"
            t2 = time.perf_counter()
            tree = getattr(proposal, "tree", None)
            if tree is not None:  # a token tree: no node deeper than a row can use
                proposal = proposal._replace(lengths=tree_within_need(proposal, need - 1))
            elif k >= min(left):  # some row needs fewer than k + 1 outcomes: verify no more than it uses
                proposal = proposal._replace(lengths=_within_need(proposal.lengths, need, k, m))
            n_acc, nxt, branch, route = verify_round(target, proposal, verify, m, k, R, rng)
            t3 = time.perf_counter()
            if tree is not None:
                verdict = _tree_verdict(proposal, n_acc, nxt, branch)
            else:
                verdict = Verdict(_padded(proposal.outcomes, n_acc, nxt, branch, m), n_acc, branch)
            phase = "commit"
            n_used, done = process.commit(rows, proposal, verdict)
            phase = "the loop's bookkeeping after commit"
            t4 = time.perf_counter()
            used = n_used.tolist() if isinstance(n_used, np.ndarray) else list(n_used)
            if len(used) != R:
                raise ValueError(f"process.commit must return n_used for each of the {R} rows, got {n_used!r}")
            for u, a in zip(used, n_acc.tolist(), strict=True):
                if not 0 <= u <= a + 1:
                    raise ValueError(f"process.commit returned n_used={u} for a row with {a + 1} verified outcomes")
            left = [a - u for a, u in zip(left, used, strict=True)]
            lengths = proposal.lengths
            if tree is not None:
                lengths = _tree_stats(stats, proposal, k, verdict)
            else:
                if lengths is not None:
                    lengths = np.asarray(lengths)
                    if lengths.ndim == 2:  # multi-draft: the surviving branch's length
                        lengths = lengths[np.arange(R), branch]
                stats.add_round(k, n_acc, lengths)
            stats.emitted += sum(used)
            stats.routes[route] = stats.routes.get(route, 0) + 1
            stats.draft_time += t1 - t0
            stats.target_time += t2 - t1
            stats.verify_time += t3 - t2
            stats.commit_time += t4 - t3
            control.update(n_acc, lengths, k, t1 - t0, t2 - t1, t4 - t2)
            rows, left, event_rows, finished = _after(rows, left, None, done)
            phase = "the caller's handling of a round"
            yield Round(event_rows, verdict.outcomes, used, finished, stats)
    except GeneratorExit:  # the caller stopped early: nothing to report
        raise
    except BaseException as err:  # KeyboardInterrupt too: say where it stopped, then let it go
        add_note(err, f"speculate.rounds.run: raised in {phase} of round {stats.rounds + 1} (rows {_rows(rows)})")
        raise


class RoundLoop:
    """The round loop with rows that come and go between rounds (continuous batching): :meth:`add`
    rows with their budgets, :meth:`drop` rows, and :meth:`step` one round of every active row.

    Unlike :func:`rounds`, every row drafts the same ``k`` (the lookahead) every round, never cut to
    what the neediest row can use: a row's work, and so the draws it takes from a per-row random
    stream, do not depend on the rows beside it. A row may therefore commit up to ``k`` outcomes past
    its budget; the caller keeps the first ``n`` (the law of a chain's first ``n`` outcomes is the
    same whether it stops at ``n`` or runs on: proofs/06). ``left`` holds each row's remaining budget.

    >>> import numpy as np, speculate as sp
    >>> class Coins:                                  # the biased coin of the module's example
    ...     def propose(self, rows, k, branches, need, rng):
    ...         q = sp.Categorical(probs=np.full((len(rows), k, 2), 0.5), validate=False)
    ...         return Proposal(q.sample(rng), q)
    ...     def score(self, rows, proposal):
    ...         k = proposal.outcomes.shape[1]
    ...         return sp.Categorical(probs=np.broadcast_to([0.6, 0.4], (len(rows), k + 1, 2)), validate=False)
    ...     def commit(self, rows, proposal, verdict):
    ...         return verdict.n_accepted + 1, None
    >>> loop = RoundLoop(Coins(), lookahead=3, rng=0)
    >>> loop.add([0, 1], [5, 2])
    >>> ev = loop.step(); loop.add([2], [4])          # row 2 joins between rounds
    >>> while loop.rows.size:
    ...     ev = loop.step()
    >>> loop.stats.emitted >= 11
    True
    """

    def __init__(self, process: Process, *, lookahead: int | str = 4, verify: str = "token",
                 rng: int | np.random.Generator | None = None, max_lookahead: int = 16,
                 cost_ratio: float | None = None, stats: Stats | None = None) -> None:
        if verify not in RULES:
            raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
        self.process, self.verify = process, verify
        self.rng = rng if hasattr(rng, "random") and not isinstance(rng, (int, np.integer)) else as_rng(rng)
        self.control = Lookahead(lookahead, max_lookahead, cost_ratio)
        self.stats = Stats() if stats is None else stats
        self.rows = np.zeros(0, np.int64)
        self.left = np.zeros(0, np.int64)
        warm_up()

    def add(self, rows: Any, n: Any) -> None:
        """Rows ``rows`` (ids greater than every active row's) join with budgets ``n``."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        n = _per_row(n, len(rows))
        if len(rows) and len(self.rows) and rows.min() <= self.rows.max():
            raise ValueError(f"new rows must come after the active rows ({int(self.rows.max())}), got {rows.tolist()}")
        self.rows = np.concatenate([self.rows, rows[n > 0]])
        self.left = np.concatenate([self.left, n[n > 0]])

    def drop(self, rows: Any) -> None:
        """Rows ``rows`` leave (cancelled, or finished by the caller's own rule)."""
        keep = ~np.isin(self.rows, np.asarray(rows, np.int64))
        self.rows, self.left = self.rows[keep], self.left[keep]

    def renumber(self, mapping: np.ndarray) -> None:
        """The active rows become ``mapping[rows]`` (after the caller compacted its rows, in order)."""
        self.rows = np.asarray(mapping, np.int64)[self.rows]

    def step(self) -> Round:
        """One round of every active row: draft ``k`` each, score in one call, verify, commit."""
        rows, R = self.rows, len(self.rows)
        if R == 0:
            raise ValueError("no active rows: add() some first")
        k = int(self.control.k)
        phase = "propose"
        try:
            t0 = time.perf_counter()
            proposal = self.process.propose(rows, k, 1, np.full(R, k + 1, np.int64), self.rng)
            phase = "score"
            t1 = time.perf_counter()
            target = self.process.score(rows, proposal)
            phase = "verify"
            t2 = time.perf_counter()
            tree = getattr(proposal, "tree", None)
            n_acc, nxt, branch, route = verify_round(target, proposal, self.verify, 1, k, R, self.rng)
            t3 = time.perf_counter()
            verdict = (_tree_verdict(proposal, n_acc, nxt, branch) if tree is not None
                       else Verdict(_padded(proposal.outcomes, n_acc, nxt, branch, 1), n_acc, branch))
            phase = "commit"
            n_used, done = self.process.commit(rows, proposal, verdict)
        except BaseException as err:
            add_note(err, f"speculate.rounds.RoundLoop: raised in {phase} of round {self.stats.rounds + 1} "
                          f"(rows {_rows(rows)})")
            raise
        t4 = time.perf_counter()
        used = np.asarray(n_used, np.int64)
        lengths = _tree_stats(self.stats, proposal, k, verdict) if tree is not None else proposal.lengths
        if tree is None:
            self.stats.add_round(k, n_acc, None if lengths is None else np.asarray(lengths))
        self.stats.emitted += int(used.sum())
        self.stats.routes[route] = self.stats.routes.get(route, 0) + 1
        self.stats.draft_time += t1 - t0
        self.stats.target_time += t2 - t1
        self.stats.verify_time += t3 - t2
        self.stats.commit_time += t4 - t3
        self.control.update(n_acc, None if lengths is None else np.asarray(lengths), k, t1 - t0, t2 - t1, t4 - t2)
        self.left = self.left - used
        over = self.left <= 0
        if done is not None:
            over |= np.asarray(done, bool)
        finished = rows[over].tolist()
        self.rows, self.left = rows[~over], self.left[~over]
        return Round(rows, verdict.outcomes, used.tolist(), finished, self.stats)


def run(
    process: Process,
    n_rows: int,
    n: int | np.ndarray,
    *,
    lookahead: int | str = 4,
    verify: str = "token",
    branches: int = 1,
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    keep_samples: bool = True,
    stats: Stats | None = None,
    control: Lookahead | None = None,
) -> RunResult:
    """Advance ``n_rows`` chains of ``process`` until each has ``n`` outcomes (or is done).

    ``branches``: independent draft branches per row and round (multi-draft, verified by recursive
    rejection; Categorical only). ``stats``: the object to count into (a domain passes its own
    subclass of :class:`Stats`). ``keep_samples=False`` records no outcomes (``RunResult.samples``
    is None): for processes that keep their own trajectory and long runs whose outcomes are large.
    ``control``: a :class:`Lookahead` to continue (see :func:`rounds`).
    :func:`rounds` is the same loop as a generator, one :class:`Round` at a time.
    """
    stats = Stats() if stats is None else stats
    loop = rounds(process, n_rows, n, lookahead=lookahead, verify=verify, branches=branches, rng=rng,
                  max_lookahead=max_lookahead, cost_ratio=cost_ratio, stats=stats, control=control)
    if not keep_samples:
        for _ in loop:
            pass
        return RunResult(None, stats)
    samples: list[list] = [[] for _ in range(n_rows)]
    for event in loop:
        E = event.outcomes
        for i, (r, u) in enumerate(zip(event.rows.tolist(), event.used, strict=True)):
            e = E[i, :u]
            samples[r].extend(e.tolist() if e.ndim == 1 else list(e))
    return RunResult(samples, stats)
