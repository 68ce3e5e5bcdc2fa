"""What a request gives back: :class:`GenerationOutput` (sequences, stats, times, log-probabilities).

>>> from speculate import Stats
>>> out = GenerationOutput(sequences=[[5, 6, 7, 8]], prompt_lengths=[2], stats=Stats(), prefill_time=0.0,
...                        wall_time=0.5)
>>> out.new_tokens, out.tokens_per_second
([[7, 8]], 4.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from speculate.stats import Stats

from .strings import decode

__all__ = ["GenerationOutput", "joined"]


@dataclass
class GenerationOutput:
    """The result of :meth:`SpeculativeGenerator.generate`.

    ``sequences[r]``: prompt tokens of row ``r`` (padding removed) followed by its new tokens; for
    an encoder-decoder target, its decoder tokens (decoder start / ``decoder_input_ids``, then the
    new tokens).
    ``stats``: the round loop's :class:`speculate.Stats` (``acceptance_rate``, ``alpha``,
    ``tokens_per_call``, ``accepted_per_position`` (the accepted-length histogram),
    ``draft_time``, ``target_time``, ...). ``prefill_time`` and ``wall_time`` are in seconds.
    ``finish_reasons[r]``: ``"stop"`` (the row ended at an EOS id or a stop string) or ``"length"``
    (``max_new_tokens`` reached; under ``json_schema=`` / ``regex=`` / ``grammar=`` the text is then a
    prefix of a valid one, not a valid one).
    ``logprobs[r]`` (with ``output_logprobs=True``): the natural log of the probability of each new
    token of row ``r`` under the law it was drawn from: the target's, after every setting
    (temperature, top-k/p, penalties, processors), as the verifier had it; at temperature 0 that law
    is the greedy one (0.0 for every token).
    """

    sequences: list[list[int]]
    prompt_lengths: list[int]
    stats: Stats
    prefill_time: float
    wall_time: float
    tokenizer: Any = field(default=None, repr=False, compare=False)
    logprobs: list[list[float]] | None = None
    finish_reasons: list[str] | None = None

    @cached_property
    def texts(self) -> list[str]:
        """Each row's new tokens as text (special tokens skipped); needs the generator's tokenizer."""
        if self.tokenizer is None:
            raise ValueError("texts needs a tokenizer: create the SpeculativeGenerator with tokenizer= "
                             "(or decode out.new_tokens yourself)")
        return [decode(self.tokenizer, t) for t in self.new_tokens]

    @cached_property
    def new_tokens(self) -> list[list[int]]:
        """The generated tokens of every row (without the prompt); computed once, on first access."""
        return [s[n:] for s, n in zip(self.sequences, self.prompt_lengths, strict=True)]

    @property
    def tokens_per_second(self) -> float:
        """New tokens of all rows per second of wall time (prefill included)."""
        n = sum(len(t) for t in self.new_tokens)
        return n / self.wall_time if self.wall_time > 0 else float("nan")

    def padded(self, pad_token_id: int, side: str = "right") -> torch.Tensor:
        """The sequences as one ``[B, L]`` LongTensor, padded on ``side`` with ``pad_token_id``."""
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        L = max(len(s) for s in self.sequences)
        out = torch.full((len(self.sequences), L), int(pad_token_id), dtype=torch.long)
        for r, s in enumerate(self.sequences):
            if s:
                if side == "left":
                    out[r, L - len(s):] = torch.tensor(s)
                else:
                    out[r, : len(s)] = torch.tensor(s)
        return out


def joined(parts: Sequence[GenerationOutput], wall_time: float, tokenizer: Any = None) -> GenerationOutput:
    """The outputs of disjoint row ranges (chunks, shards) as one, rows in order, stats summed."""
    lp = [x for o in parts for x in o.logprobs] if parts and all(o.logprobs is not None for o in parts) else None
    return GenerationOutput(
        sequences=[s for o in parts for s in o.sequences], prompt_lengths=[n for o in parts for n in o.prompt_lengths],
        stats=Stats.merge([o.stats for o in parts]), prefill_time=sum(o.prefill_time for o in parts),
        wall_time=wall_time, tokenizer=tokenizer, logprobs=lp,
        finish_reasons=[x for o in parts for x in (o.finish_reasons or [])] or None)
