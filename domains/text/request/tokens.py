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

    def block(self, rows: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
        """``[R, width]`` tokens ``ids[r, start[r] : start[r] + width]`` (zeros past the end)."""
        cols = start[:, None] + np.arange(width)[None, :]  # [R, width]
        cols = np.minimum(cols, self.ids.shape[1] - 1)
        return self.ids[rows[:, None], cols]
