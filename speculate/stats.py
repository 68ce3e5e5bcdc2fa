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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0
    commit_time: float = 0.0

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

    def _grow(self, k: int) -> None:
        grown = np.zeros(k + 1, np.int64)
        grown[: len(self.accepted_per_position)] = self.accepted_per_position
        self.accepted_per_position = grown

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
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.extras().items())
        return f"{line} {extra}" if extra else line
