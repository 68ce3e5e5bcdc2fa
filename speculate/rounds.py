"""The round loop every domain runs on: draft -> one batched target call -> verify -> commit.

A domain implements the Process protocol (docs/architecture.md): ``propose(rows, k, m, rng)``,
``score(rows, proposal)`` and ``commit(rows, emitted, n_accepted, branch)``. This module owns
everything else: fresh uniforms every round, the choice of verification rule, ragged acceptance
across rows, rows that finish early, the statistics, and the automatic lookahead.

Automatic lookahead (``lookahead="auto"``): after each round, alpha is estimated as
accepted / (accepted + rejections) over rows and rounds with exponential forgetting (weight 0.9 per
round, a Beta(1, 1) prior), and the cost ratio c as the measured time per draft step over the
measured time per target call (exponential moving average), or the fixed ``cost_ratio`` when one
is given; the next round uses the k in 1..max_lookahead that maximises
speculate.theory.speedup(alpha, k, c). The choice depends only on past rounds, so every round stays
exact (proofs/06). With measured timings k depends on the machine's speed, so a seeded run is exact
but not bit-reproducible; pass ``cost_ratio=`` to make "auto" depend on the seed alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from . import theory
from ._dispatch import RULES, verify_round
from ._rng import as_rng

__all__ = ["Process", "Proposal", "RunResult", "Stats", "run"]


class Proposal(NamedTuple):
    """What ``Process.propose`` returns (see docs/architecture.md for shapes)."""

    outcomes: Any  #: drafted outcomes: int64 [R, k] ([R, m, k]) or nested lists [R][k]
    dists: Any  #: the draft distributions they were drawn from (batched) or nested lists; None = point masses
    lengths: Any = None  #: valid drafts per row (int64 [R] or [R, m]); None = all k


class Process(Protocol):
    """A batch of chains that the round loop advances (implemented by each domain)."""

    def propose(self, rows: np.ndarray, k: int, m: int, rng: np.random.Generator) -> Proposal: ...

    def score(self, rows: np.ndarray, proposal: Proposal) -> Any: ...

    def commit(
        self, rows: np.ndarray, emitted: list, n_accepted: np.ndarray, branch: np.ndarray
    ) -> tuple[Any, Any]: ...  # (n_used int [R], done bool [R] or None when no row can finish early)


@dataclass
class Stats:
    """Counters of a run. ``accepted_per_position[j]`` counts (row, round) pairs that kept exactly j drafts."""

    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0  # sequential draft steps (the sum of k over rounds)
    row_rounds: int = 0  # (row, round) pairs verified
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0  # row-rounds in which the verifier replaced a draft
    emitted: int = 0  # outcomes handed to the caller (after truncation to n and stops)
    accepted_per_position: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    lookahead_counts: dict = field(default_factory=dict)  # k -> rounds run with that k
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0
    commit_time: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def alpha(self) -> float:
        """Per-draft acceptance estimate accepted / (accepted + rejections): the i.i.d. alpha of theory."""
        d = self.accepted + self.rejections
        return self.accepted / d if d else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """Outcomes the verifier produced per row per target call (before truncation): E[n + 1]."""
        return (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else float("nan")

    @property
    def cost_ratio(self) -> float:
        """Measured c = time per draft step / time per target call."""
        if not (self.draft_calls and self.target_calls and self.target_time > 0):
            return float("nan")
        return (self.draft_time / self.draft_calls) / (self.target_time / self.target_calls)

    def add_round(self, k: int, n_accepted: np.ndarray, lengths: np.ndarray | None) -> None:
        """Count one round; ``lengths`` None means every row drafted all k."""
        self.rounds += 1
        self.target_calls += 1
        self.draft_calls += k
        self.row_rounds += len(n_accepted)
        if len(self.accepted_per_position) < k + 1:  # the histogram covers 0..k whatever the rows
            self._grow(k)
        if len(n_accepted) == 1:  # one chain: plain Python is faster than four numpy reductions
            a, L = int(n_accepted[0]), k if lengths is None else int(lengths[0])
            self.proposed += L
            self.accepted += a
            self.rejections += a < L
            self.accepted_per_position[a] += 1
        else:
            if lengths is None:
                lengths = np.full(len(n_accepted), k, np.int64)
            self.proposed += int(lengths.sum())
            self.accepted += int(n_accepted.sum())
            self.rejections += int(np.count_nonzero(n_accepted < lengths))
            self.accepted_per_position[: k + 1] += np.bincount(n_accepted, minlength=k + 1)[: k + 1]
        self.lookahead_counts[k] = self.lookahead_counts.get(k, 0) + 1

    def _grow(self, k: int) -> None:
        grown = np.zeros(k + 1, np.int64)
        grown[: len(self.accepted_per_position)] = self.accepted_per_position
        self.accepted_per_position = grown

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "accepted_per_position"}
        out["accepted_per_position"] = self.accepted_per_position.tolist()
        out["lookahead_counts"] = {int(k): int(v) for k, v in self.lookahead_counts.items()}
        for name in ("acceptance_rate", "alpha", "tokens_per_call", "cost_ratio"):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        hist = " ".join(str(int(c)) for c in self.accepted_per_position)
        return (
            f"rounds={self.rounds} proposed={self.proposed} accepted={self.accepted} "
            f"acceptance={self.acceptance_rate:.3f} alpha={self.alpha:.3f} "
            f"tokens/call={self.tokens_per_call:.3f} c={self.cost_ratio:.3f} "
            f"accepted-length histogram=[{hist}]"
        )


class RunResult(NamedTuple):
    samples: list | None  #: per row, the list of outcomes in order (None with keep_samples=False)
    stats: Stats


class _Lookahead:
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
        self.k = min(4, max_lookahead) if self.auto else int(lookahead)
        self.max, self.decay = int(max_lookahead), decay
        self.acc = self.rej = 0.0
        if cost_ratio is not None and not (0.0 <= cost_ratio < float("inf")):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio}")
        self.fixed_c = cost_ratio
        self.c: float | None = cost_ratio

    def update(self, n_acc: np.ndarray, lengths: np.ndarray | None, k: int, t_draft: float, t_target: float) -> None:
        if not self.auto:
            return
        if lengths is None:
            lengths = np.full(len(n_acc), k, np.int64)
        self.acc = self.decay * self.acc + float(n_acc.sum())
        self.rej = self.decay * self.rej + float(np.sum(n_acc < lengths))
        alpha = (self.acc + 1.0) / (self.acc + self.rej + 2.0)
        if self.fixed_c is None and k > 0 and t_target > 0:
            c = (t_draft / k) / t_target
            self.c = c if self.c is None else 0.8 * self.c + 0.2 * c
        self.k = max(1, theory.optimal_lookahead(alpha, self.c or 0.0, self.max))


def _per_row(n: Any, n_rows: int) -> np.ndarray:
    a = np.asarray(n)
    if a.ndim == 0:
        a = np.full(n_rows, a)
    if a.shape != (n_rows,):
        raise ValueError(f"n must be an int or one per row ({n_rows}), got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"n must be an integer, got {a.dtype}")
    if a.size and a.min() < 0:
        raise ValueError(f"n (outcomes per chain) must be >= 0, got {a.min()}")
    return a.astype(np.int64)


def _emitted(outcomes: Any, n: np.ndarray, nxt: Any, branch: np.ndarray, m: int, want: Any) -> list:
    """Per row: its kept drafts followed by the verifier's outcome, cut to the outcomes still wanted."""
    R = len(n)
    if R <= 4 and m == 1 and isinstance(outcomes, np.ndarray) and isinstance(nxt, np.ndarray):
        out = []  # a few rows: per-row arrays are cheaper than the padded array below
        for r, (nr, c) in enumerate(zip(n.tolist(), list(want), strict=True)):
            e = np.empty((min(nr + 1, c), *outcomes.shape[2:]), np.result_type(outcomes.dtype, nxt.dtype))
            e[: min(nr, c)] = outcomes[r, : min(nr, c)]
            if c > nr:
                e[nr] = nxt[r]
            out.append(e)
        return out
    if isinstance(outcomes, np.ndarray) and isinstance(nxt, np.ndarray):  # vectorised: one array, R views
        rows = outcomes if m == 1 else outcomes[np.arange(R), branch]  # [R, k, *event]
        k = rows.shape[1]
        E = np.empty((R, k + 1, *rows.shape[2:]), np.result_type(rows.dtype, nxt.dtype))
        E[:, :k] = rows
        E[np.arange(R), n] = nxt  # the next outcome sits right after the kept drafts
        return [E[r, :c] for r, c in enumerate(np.minimum(n + 1, np.asarray(want)).tolist())]
    out = []
    for r in range(R):
        row = outcomes[r] if m == 1 else outcomes[r][branch[r]]
        out.append([*list(row[: n[r]]), nxt[r]][: want[r]])
    return out


def run(
    process: Process,
    n_rows: int,
    n: int | np.ndarray,
    *,
    lookahead: int | str = 4,
    verify: str = "token",
    drafts: int = 1,
    rng: int | np.random.Generator | None = None,
    max_lookahead: int = 16,
    cost_ratio: float | None = None,
    keep_samples: bool = True,
) -> RunResult:
    """Advance ``n_rows`` chains of ``process`` until each has ``n`` outcomes (or is done).

    ``keep_samples=False`` records no outcomes (``RunResult.samples`` is None): for processes that
    keep their own trajectory and long runs whose outcomes are large arrays.
    """
    if verify not in RULES:
        raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
    if isinstance(drafts, bool) or not isinstance(drafts, (int, np.integer)) or drafts < 1:
        raise ValueError(f"drafts (branches per round) must be an int >= 1, got {drafts!r}")
    if drafts > 1 and verify != "token":
        raise ValueError(f"multi-draft (drafts={drafts}) uses recursive rejection: pass verify='token'")
    rng = as_rng(rng)
    remaining = _per_row(n, n_rows)
    control = _Lookahead(lookahead, max_lookahead, cost_ratio)
    stats = Stats()
    samples: list[list] | None = [[] for _ in range(n_rows)] if keep_samples else None
    rows = np.flatnonzero(remaining > 0)
    left = remaining[rows].tolist()  # outcomes still wanted, per active row
    while rows.size:
        R, k = len(rows), control.k
        t0 = time.perf_counter()
        proposal = process.propose(rows, k, drafts, rng)
        t1 = time.perf_counter()
        target = process.score(rows, proposal)
        t2 = time.perf_counter()
        n_acc, nxt, branch = verify_round(target, proposal, verify, drafts, k, R, rng)
        t3 = time.perf_counter()
        emitted = _emitted(proposal.outcomes, n_acc, nxt, branch, drafts, left)
        n_used, done = process.commit(rows, emitted, n_acc, branch)
        t4 = time.perf_counter()
        used = np.asarray(n_used, dtype=np.int64)
        if used.shape != (R,):
            raise ValueError(f"process.commit must return n_used of shape ({R},), got {n_used!r}")
        used_l = used.tolist()
        if min(used_l) < 0:
            raise ValueError(f"process.commit returned a negative n_used: {n_used!r}")
        lengths = proposal.lengths
        if lengths is not None:
            lengths = np.asarray(lengths)
            if lengths.ndim == 2:  # multi-draft: the surviving branch's length
                lengths = lengths[np.arange(R), branch]
        taken = [min(len(e), u) for e, u in zip(emitted, used_l, strict=True)]
        rows_l = rows.tolist()
        if samples is not None:
            for e, u, r in zip(emitted, taken, rows_l, strict=True):
                e = e[:u]
                samples[r].extend(e.tolist() if isinstance(e, np.ndarray) and e.ndim == 1 else list(e))
        left = [a - t for a, t in zip(left, taken, strict=True)]
        done_l = np.asarray(done, dtype=bool).tolist() if done is not None else None
        keep = [a > 0 and not (done_l and done_l[i]) for i, a in enumerate(left)]
        if not all(keep):  # finished rows drop out; the others go on
            idx = [i for i, kp in enumerate(keep) if kp]
            rows, left = rows[idx], [left[i] for i in idx]
        stats.add_round(k, n_acc, lengths)
        stats.emitted += sum(taken)
        stats.draft_time += t1 - t0
        stats.target_time += t2 - t1
        stats.verify_time += t3 - t2
        stats.commit_time += t4 - t3
        control.update(n_acc, lengths, k, t1 - t0, t2 - t1)
    return RunResult(samples, stats)
