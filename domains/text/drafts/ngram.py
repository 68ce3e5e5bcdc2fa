"""Prompt lookup (``"ngram"``, ``"ngram:N"``): propose the continuation of the latest earlier match of
a row's last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) as point masses (``q`` None), which
the residual rule keeps exact. No match: 0 drafts. Encoder-decoder targets get
:class:`SourceNgramDraft`: the decoder tokens first, then the row's source ids."""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

from ..models.encoder_decoder import EncoderState
from ..request.inputs import EncoderInputs
from ..request.sampling import SamplingConfig
from ..request.tokens import TokenBuffer
from .base import Draft, Drafted, DraftOptions, named_kind

__all__ = ["NgramDraft", "SourceNgramDraft"]


@nb.njit(cache=True, nogil=True)
def _lookup(hay, hay_n, ids, n, rows, k, max_n, min_n):  # pragma: no cover - compiled
    """Per row: up to k tokens of ``hay[row]`` (its first ``hay_n[row]``) after the latest window
    ``hay[s : s+g]`` followed by a token that equals the row's last g tokens (g from max_n down to
    min_n). Prompt lookup passes the rows' own tokens as ``hay`` (the suffix itself is never a
    match: it has no token after it); encoder-decoders their source ids."""
    R = rows.shape[0]
    out = np.zeros((R, k), np.int64)
    lengths = np.zeros(R, np.int64)
    for i in range(R):
        seq = ids[rows[i]]
        L = n[rows[i]]
        S = hay_n[rows[i]]
        h = hay[rows[i]]
        for g in range(min(max_n, L), min_n - 1, -1):
            found = -1
            for s in range(S - g - 1, -1, -1):  # window h[s:s+g], followed by h[s+g]
                same = True
                for j in range(g):
                    if h[s + j] != seq[L - g + j]:
                        same = False
                        break
                if same:
                    found = s + g
                    break
            if found >= 0:
                m = min(k, S - found)
                for j in range(m):
                    out[i, j] = h[found + j]
                lengths[i] = m
                break
    return out, lengths


class NgramDraft(Draft):
    """Prompt lookup: propose the continuation of the latest earlier match of the last n tokens.

    >>> import numpy as np
    >>> from speculate.domains.text.process import TokenBuffer
    >>> from speculate.domains.text.request.sampling import SamplingConfig
    >>> buf = TokenBuffer.from_prompts([[5, 6, 7, 8, 5, 6]], extra=4)
    >>> need = np.array([10])                       # tokens the row still needs
    >>> d = NgramDraft(max_n=2).propose(np.array([0]), buf, 3, need, SamplingConfig(), None, 10)
    >>> d.outcomes[0, : d.lengths[0]].tolist(), d.q is None   # q None: point masses
    ([7, 8, 5], True)
    """

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not (1 <= min_n <= max_n):
            raise ValueError(f"ngram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> NgramDraft | None:
        n = named_kind(draft, "ngram", options)
        return None if n is None else cls(max_n=n)

    static_target = True  # the target may run static steps beside it

    def join_refusal(self) -> str | None:
        return None  # no state: it reads the token buffer

    def absorb(self, other: Draft) -> None:
        pass

    def propose(
        self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray, cfg: SamplingConfig,
        rng: np.random.Generator | None, vocab: int,
    ) -> Drafted:
        outcomes, lengths = _lookup(tokens.ids, tokens.n, tokens.ids, tokens.n, np.asarray(rows, np.int64), int(k),
                                    self.max_n, self.min_n)
        lengths = np.minimum(lengths, np.asarray(need, dtype=np.int64) - 1)  # a row uses no more
        return Drafted(outcomes, None, lengths)  # None: point masses at the outcomes; no state


class SourceNgramDraft(NgramDraft):
    """Prompt lookup for encoder-decoders: over the decoder tokens, then over the source ids.

    A row whose decoder tokens have no earlier match of their last n tokens looks them up in its
    encoder input ids (text encoders; speech encoders have no ids) and proposes what follows there,
    as point masses. Rows are addressed by their index in the request, so dropping finished rows
    needs nothing.
    """

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        super().__init__(max_n, min_n)
        self.src: np.ndarray | None = None  # int64 [B, S]: source ids, left-aligned
        self.src_n: np.ndarray | None = None  # int64 [B]

    def encode(self, inputs: EncoderInputs, target_state: EncoderState) -> None:
        if inputs.ids is None:
            self.src = self.src_n = None
            return
        self.src_n = np.array([len(r) for r in inputs.ids], np.int64)
        self.src = np.zeros((len(inputs.ids), int(self.src_n.max())), np.int64)
        for r, ids in enumerate(inputs.ids):
            self.src[r, : len(ids)] = ids

    def release(self) -> None:
        self.src = self.src_n = None

    def join_refusal(self) -> str | None:
        return "prompt lookup over encoder inputs keeps each request's source ids: rows do not join a running batch"

    def propose(
        self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray, cfg: SamplingConfig,
        rng: np.random.Generator | None, vocab: int,
    ) -> Drafted:
        d = super().propose(rows, tokens, k, need, cfg, rng, vocab)
        if self.src is None or k == 0 or d.lengths.all():
            return d
        rows = np.asarray(rows, np.int64)
        out, lengths = _lookup(self.src, self.src_n, tokens.ids, tokens.n, rows, int(k),
                                      self.max_n, self.min_n)
        lengths = np.minimum(lengths, np.asarray(need, dtype=np.int64) - 1)
        use = d.lengths == 0
        return Drafted(np.where(use[:, None], out, d.outcomes), None, np.where(use, lengths, d.lengths))
