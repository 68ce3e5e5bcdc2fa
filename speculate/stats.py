"""The counters of a speculative run: one ``Stats`` for every domain (a domain that has more to
count extends it with fields of its own; ``summary()`` and ``as_dict()`` show those too).

What the counters mean, per (row, round) pair: the draft proposed ``L`` outcomes (``L <= k``), the
verifier kept ``n`` of them and drew one more, so the round VERIFIED ``n + 1`` outcomes; the
process then USED (emitted) ``n + 1`` or fewer when the row stopped inside the block (an EOS token,
the end of an episode). The round loop never drafts more than a row still needs, so the two
differ only by such stops.

>>> import speculate as sp
>>> s = sp.Stats()
>>> s.add_round(k=4, n_accepted=__import__("numpy").array([2]), lengths=None)
>>> s.proposed, s.accepted, s.verified, s.tokens_per_call
(4, 2, 3, 3.0)

Counters of runs on separate rows (the shards of a distributed run) merge by summing:

>>> t = sp.Stats()
>>> t.add_round(k=2, n_accepted=__import__("numpy").array([2, 0]), lengths=None)
>>> both = s + t                    # or sp.Stats.merge([s, t]); sum([s, t]) works too
>>> both.rounds, both.proposed, both.accepted, both.accepted_per_position.tolist()
(2, 8, 4, [1, 0, 2, 0, 0])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = ["Stats"]


@dataclass
class Stats:
    """Counters of a run. ``accepted_per_position[j]`` counts (row, round) pairs that kept exactly j drafts."""

    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0  #: sequential draft steps (the sum of k over rounds)
    row_rounds: int = 0  #: (row, round) pairs verified
    proposed: int = 0  #: drafted outcomes the verifier looked at
    accepted: int = 0  #: drafted outcomes it kept
    rejections: int = 0  #: row-rounds in which the verifier replaced a draft
    emitted: int = 0  #: outcomes the process used (verified ones past a stop inside a block are not)
    accepted_per_position: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    lookahead_counts: dict = field(default_factory=dict)  #: k -> rounds run with that k
    routes: dict = field(default_factory=dict)  #: verification route -> rounds (token, block, gaussian, general, ...)
    #: token trees (route "tree"): per node index, the row-rounds whose accepted path went through it
    #: (entry 0: tree row-rounds); ``accepted_per_position`` is then the accepted-depth histogram
    tree_node_accepted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tree_paths: list = field(default_factory=list)  #: token trees: per round, each row's accepted path (node indices)
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0
    commit_time: float = 0.0

    #: fields that describe each row rather than count work (a subclass's ``steps`` per replica, an
    #: array of labels): merged by taking the maximum (arrays: the longer one) instead of the sum
    _not_summed: ClassVar[tuple[str, ...]] = ()

    @property
    def verified(self) -> int:
        """Outcomes the verifier produced: kept drafts plus one drawn outcome per row-round."""
        return self.accepted + self.row_rounds

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
        """Verified outcomes per row per target call, E[n + 1]: what ``theory.expected_tokens`` predicts."""
        return self.verified / self.row_rounds if self.row_rounds else float("nan")

    @property
    def emitted_per_call(self) -> float:
        """Used outcomes per row per target call: below ``tokens_per_call`` when rows stop inside a block."""
        return self.emitted / self.row_rounds if self.row_rounds else float("nan")

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

    def add_plain(self, steps: int, row_steps: int) -> None:
        """Count ``steps`` rounds without drafts run as one plain stretch (``Process.plain``), ``row_steps``
        outcomes over all rows: as ``steps`` calls of :meth:`add_round` with k = 0."""
        self.rounds += steps
        self.target_calls += steps
        self.row_rounds += row_steps
        if len(self.accepted_per_position) < 1:
            self._grow(0)
        self.accepted_per_position[0] += row_steps
        self.lookahead_counts[0] = self.lookahead_counts.get(0, 0) + steps

    def add_tree_round(
        self, k: int, n_accepted: np.ndarray, path: np.ndarray, nodes: np.ndarray, rejected: np.ndarray
    ) -> None:
        """Count one round of token-tree verification: ``n_accepted`` int [R] (the accepted depth),
        ``path`` int [R, D] (the accepted nodes, -1 past the depth), ``nodes`` int [R] (drafted nodes
        per row: the proposed drafts), ``rejected`` bool [R] (the walk ended by rejecting a candidate)."""
        n_accepted = np.asarray(n_accepted, np.int64)
        L = n_accepted + np.asarray(rejected, np.int64)  # n_accepted < L exactly when a candidate was rejected
        self.add_round(max(k, path.shape[1]), n_accepted, L)
        self.proposed += int(np.sum(nodes)) - int(L.sum())
        on = path[path >= 0]
        width = max(int(on.max()) + 1 if on.size else 1, len(self.tree_node_accepted))
        counts = np.bincount(on, minlength=width).astype(np.int64)
        counts[: len(self.tree_node_accepted)] += self.tree_node_accepted
        counts[0] += len(n_accepted)
        self.tree_node_accepted = counts
        rows = zip(path.tolist(), n_accepted.tolist(), strict=True)
        self.tree_paths.append([tuple(int(v) for v in row[:n]) for row, n in rows])

    def _grow(self, k: int) -> None:
        grown = np.zeros(k + 1, np.int64)
        grown[: len(self.accepted_per_position)] = self.accepted_per_position
        self.accepted_per_position = grown

    def __add__(self, other: Stats) -> Stats:
        """The counters of two runs on disjoint rows, summed field by field (histograms and dicts
        entry by entry; the fields in ``_not_summed`` take the maximum). The result has the more
        derived of the two types, so a domain's subclass keeps its own fields."""
        if not isinstance(other, Stats):
            return NotImplemented
        if isinstance(self, type(other)):
            cls = type(self)
        elif isinstance(other, type(self)):
            cls = type(other)
        else:
            raise TypeError(f"cannot merge {type(self).__name__} and {type(other).__name__}")
        out = cls()
        for f in dataclasses.fields(cls):
            a, b = getattr(self, f.name, None), getattr(other, f.name, None)
            if a is None or b is None:
                setattr(out, f.name, a if b is None else b)
            elif f.name in cls._not_summed:  # a count per row, or a label array: the larger / longer
                setattr(out, f.name, (a if len(a) >= len(b) else b).copy() if isinstance(a, np.ndarray)
                        else max(a, b))
            elif isinstance(a, np.ndarray):
                n = max(len(a), len(b))
                merged = np.zeros(n, np.result_type(a, b))
                merged[: len(a)] += a
                merged[: len(b)] += b
                setattr(out, f.name, merged)
            elif isinstance(a, dict):
                d = dict(a)
                for key, v in b.items():
                    d[key] = d.get(key, 0) + v
                setattr(out, f.name, d)
            else:
                setattr(out, f.name, a + b)
        return out

    def __radd__(self, other: Any) -> Stats:
        if isinstance(other, int) and other == 0:  # sum([...]) starts from 0
            return self + type(self)()
        return NotImplemented

    @classmethod
    def merge(cls, parts: Any) -> Stats:
        """The summed counters of runs on disjoint rows (see ``__add__``); ``cls()`` when empty."""
        out: Stats = cls()
        for p in parts:
            out = out + p
        return out

    def extras(self) -> dict[str, Any]:
        """The fields a domain's subclass adds (empty for a plain ``Stats``)."""
        base = {f.name for f in dataclasses.fields(Stats)}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base}

    def as_dict(self) -> dict:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.tolist() if isinstance(v, np.ndarray) else v
        out["lookahead_counts"] = {int(k): int(v) for k, v in self.lookahead_counts.items()}
        for name in ("verified", "acceptance_rate", "alpha", "tokens_per_call", "emitted_per_call", "cost_ratio"):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        hist = " ".join(str(int(c)) for c in self.accepted_per_position)
        line = (
            f"rounds={self.rounds} proposed={self.proposed} accepted={self.accepted} "
            f"acceptance={self.acceptance_rate:.3f} alpha={self.alpha:.3f} "
            f"verified/call={self.tokens_per_call:.3f} emitted/call={self.emitted_per_call:.3f} "
            f"c={self.cost_ratio:.3f} accepted-length histogram=[{hist}]"
        )
        if self.tree_paths:
            line += " tree-node acceptance=[" + " ".join(str(int(c)) for c in self.tree_node_accepted) + "]"
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.extras().items())
        return f"{line} {extra}" if extra else line
