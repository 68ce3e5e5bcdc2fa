"""The one interface every model runtime of the text domain implements (``ModelRuntime``): the
target's and a draft model's, whichever class runs them.

The runtimes: :class:`~.kv_cache.CachedModel` (the position-indexed cache over the model's own
forward), :class:`~.encoder_decoder.CachedSeq2Seq` (its encoder-decoder form),
:class:`~.lean_llama.LeanLlama` and :class:`~.lean_seq2seq.LeanSeq2Seq` (lean loops over the same
slots for Llama, Whisper and BART; static steps for CUDA graphs) and
:class:`~.transformers_cache.TransformersCacheModel` (the fallback through transformers' own cache).
:func:`~.pick.pick_runtime` chooses among them; the process and the drafts see only this interface.

Row ``r``'s token at position ``p`` sits at slot ``p``; ``length[r]`` tokens of row ``r`` are in the
cache. A forward writes new tokens at slots ``start[r] + j`` and reads slots up to its own; rolling
back is not moving ``length`` forward (:func:`~.kv_cache.advance_length`).

>>> from speculate.domains.text.conformance import tiny_llama
>>> from speculate.domains.text.models.pick import pick_runtime
>>> isinstance(pick_runtime(tiny_llama(), "target"), ModelRuntime)
True
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["ModelRuntime"]


@runtime_checkable
class ModelRuntime(Protocol):
    """A model with a per-row cache of committed tokens, fed blocks of new tokens at per-row starts."""

    length: np.ndarray  #: int64 [B]: committed tokens in the cache per row

    @property
    def device(self) -> torch.device:
        """Where the model's logits come out."""
        ...

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty caches for ``batch`` rows of ``capacity`` (+ ``spare``) slots."""
        ...

    def release(self) -> None:
        """Free the caches."""
        ...

    def ensure_capacity(self, capacity: int) -> None:
        """Grow the caches (keeping what they hold) to at least ``capacity`` slots."""
        ...

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (indices into the current rows, increasing)."""
        ...

    def keep(self, n: np.ndarray) -> None:
        """Commit ``n[r]`` more tokens of row ``r`` (the ones the last forward wrote)."""
        ...

    def forward(self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
                valid: np.ndarray | None = None) -> torch.Tensor:
        """Logits ``[R, W, V]`` (``[R, 1, V]`` with ``last_only``) of the block ``tokens`` ``[R, W]`` written
        at slots ``start[r] + j``; ``valid[r]``: the columns row ``r`` really feeds (the rest pad a
        ragged block). A runtime that scores token trees (``tree_refusal() is None``) also takes
        ``positions=`` and ``see=`` (each node's position and what it attends to) and has
        ``move(rows, src, dst)`` (the accepted path's slots to their positions)."""
        ...

    def tree_refusal(self) -> str | None:
        """Why this runtime cannot score a token tree in one forward; None when it can."""
        ...
