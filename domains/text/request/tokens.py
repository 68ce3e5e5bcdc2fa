"""The committed tokens of a request's rows (:class:`TokenBuffer`): what drafts read and the process writes.

>>> import numpy as np
>>> buf = TokenBuffer.from_prompts([[5, 6, 7], [8]], extra=4)    # 2 rows, room for 4 new tokens
>>> buf.ids.shape, buf.n.tolist()
((2, 7), [3, 1])
>>> buf.block(np.array([0, 1]), np.array([1, 0]), 3).tolist()   # tokens from per-row starts
[[6, 7, 0], [8, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TokenBuffer"]


@dataclass
class TokenBuffer:
    """Committed tokens of every row: ``ids[r, :n[r]]`` (prompt first), ``np.int64``."""

    ids: np.ndarray  # [B, capacity]
    n: np.ndarray  # [B]
    prompt_len: np.ndarray  # [B]

    @classmethod
    def from_prompts(cls, prompts: Sequence[Sequence[int]], extra: int) -> TokenBuffer:
        """The prompts, with room for ``extra`` more tokens after the longest."""
        B = len(prompts)
        lens = np.array([len(p) for p in prompts], dtype=np.int64)
        ids = np.zeros((B, int(lens.max()) + extra), dtype=np.int64)
        for r, p in enumerate(prompts):
            ids[r, : len(p)] = p
        return cls(ids=ids, n=lens.copy(), prompt_len=lens)

    def joined(self, other: TokenBuffer, extra: int = 0) -> TokenBuffer:
        """This buffer's rows, then ``other``'s (as many columns as the wider, plus ``extra``)."""
        C = max(self.ids.shape[1], other.ids.shape[1]) + extra
        ids = np.zeros((len(self.n) + len(other.n), C), np.int64)
        ids[: len(self.n), : self.ids.shape[1]] = self.ids
        ids[len(self.n) :, : other.ids.shape[1]] = other.ids
        return TokenBuffer(ids, np.concatenate([self.n, other.n]), np.concatenate([self.prompt_len, other.prompt_len]))

    def taken(self, rows: np.ndarray) -> TokenBuffer:
        """Only the rows ``rows`` (renumbered ``0 .. len(rows) - 1``, in that order)."""
        return TokenBuffer(self.ids[rows], self.n[rows].copy(), self.prompt_len[rows].copy())

    def block(self, rows: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
        """``[R, width]`` tokens ``ids[r, start[r] : start[r] + width]`` (zeros past the end)."""
        cols = start[:, None] + np.arange(width)[None, :]  # [R, width]
        cols = np.minimum(cols, self.ids.shape[1] - 1)
        return self.ids[rows[:, None], cols]
