"""What a request may ask of its models, checked before any work: sequences no longer than a model can
decode (learned positions), KV caches no larger than the memory of the device they go to.

>>> from speculate.domains.text.conformance import tiny_llama
>>> ModelLimits().check_lengths([(tiny_llama(), "target")], [[1, 2, 3]], n_new=8)   # RoPE: no limit
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .encoder_decoder import decoder_length_limit, seq2seq_cache_bytes
from .facts import execution_device, length_limits, reads_encoder
from .memory import CacheMemoryError, available_memory, cache_bytes_by_device

__all__ = ["ModelLimits"]


class ModelLimits:
    """The checks, with each model's structure read once per model and dtype (walking the modules on
    every request shows on small models)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, Any], tuple[bool, list[tuple[int, str]], int | None]] = {}

    def structure(self, model: Any) -> tuple[bool, list[tuple[int, str]], int | None]:
        """Whether ``model`` reads an encoder, its length limits, and (if it reads one) the bytes of
        its caches per row and slot: read from its modules and config once per generator and dtype
        (walking the modules on every request shows on small models)."""
        seen = self.seen
        key = (id(model), next(model.parameters()).dtype)
        if key not in seen:
            reads = reads_encoder(model)
            seen[key] = (reads, decoder_length_limit(model) if reads else length_limits(model),
                         seq2seq_cache_bytes(model, 1, 1, 0) if reads else None)
        return seen[key]

    def check_lengths(self, models: list[tuple[Any, str]], prompts: list[Any], n_new: int) -> None:
        """Refuse, before any work, sequences longer than a model can decode (learned positions,
        sliding window)."""
        lens = np.array([len(p) for p in prompts])
        r = int(np.argmax(lens))
        L = int(lens[r])
        total = L + n_new
        for model, role in models:
            for limit, why in self.structure(model)[1]:
                if total > limit:
                    fix = (f"Lower max_new_tokens to {limit - L} or shorten the prompt" if limit > L
                           else f"Shorten the prompt to at most {limit - 1} tokens")
                    raise ValueError(
                        f"row {r}: its prompt ({L} tokens) plus max_new_tokens={n_new} makes {total} "
                        f"tokens, more than the {role} ({type(model).__name__}) can decode: it has "
                        f"{why}. {fix} (generate the longer rows separately)")

    def check_memory(self, models: list[tuple[Any, str]], n_rows: int, capacity: int, spare: int,
                     source: int = 0) -> None:
        """Refuse, before anything is allocated, a batch whose KV caches (and token buffer) need
        more memory than the device they go to has available (:func:`available_memory`).
        ``source``: encoder positions per row (encoder-decoders: their cross-attention caches)."""
        need: dict[torch.device, list[tuple[str, int]]] = {}
        for model, role in models:
            reads, _, unit = self.structure(model)
            if reads:  # seq2seq_cache_bytes: linear in rows and in slots (self-attention + source)
                b = None if unit is None else unit * n_rows * (capacity + spare + source)
                per = {} if b is None else {execution_device(model): b}
            else:
                per = cache_bytes_by_device(model, n_rows, capacity + spare)
            for dev, b in per.items():
                need.setdefault(dev, []).append((f"{role} KV cache", b))
        need.setdefault(torch.device("cpu"), []).append(("token buffer", n_rows * capacity * 8))
        for dev, parts in need.items():
            total = sum(b for _, b in parts)
            avail = available_memory(dev)
            if avail is None or total <= avail[0]:
                continue
            gib = 2.0 ** 30
            fit = int(avail[0] // max(1, total // n_rows))
            detail = ", ".join(f"{what} {b / gib:.3g} GiB" for what, b in parts)
            fix = (f"Pass batch_size={fit} to run the prompts in chunks of that many rows (or generate at most "
                   f"about {fit} rows per call), or ask for fewer new tokens (max_new_tokens)" if fit >= 1 else
                   "Not even one row fits: lower max_new_tokens")
            raise CacheMemoryError(
                f"not enough memory on {dev} for this call: {n_rows} rows of up to {capacity} "
                f"tokens need {total / gib:.3g} GiB ({detail}) but {avail[0] / gib:.3g} GiB is "
                f"available ({avail[1]}). {fix}")
