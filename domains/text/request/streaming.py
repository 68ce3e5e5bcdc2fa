"""Streaming: what :meth:`SpeculativeGenerator.stream` yields after every round, and the adapter
that feeds transformers streamers (``TextStreamer``, ``TextIteratorStreamer``: ``put`` / ``end``).

Both are built on :func:`speculate.rounds.rounds`, the round loop as a generator: each round's
committed tokens are read from its :class:`~speculate.rounds.Round` event. Text is decoded
incrementally (:class:`~speculate.domains.text.request.strings.IncrementalDecoder`): a character split
across tokens (byte-level vocabularies) is shown once its last token arrives, and a row's pieces
add up to its ``out.texts`` entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from speculate.rounds import Round
from speculate.stats import Stats

from .strings import IncrementalDecoder

__all__ = ["StreamEvent", "stream_events", "streamer_feed"]


@dataclass
class StreamEvent:
    """One round of a stream. ``tokens[r]``: the tokens row ``r`` committed in this round (empty if
    it took no part); ``texts[r]``: their text (None without a tokenizer); ``finished``: the rows
    that ended in this round; ``stats``: the run's counters so far."""

    tokens: list[list[int]]
    texts: list[str] | None
    finished: list[int]
    stats: Stats


class _Feed:
    """Feeds one row's tokens to a transformers streamer: the prompt first, then every round's
    tokens, then ``end()`` (once, also when the stream stops early)."""

    def __init__(self, streamer: Any, tokens: Any) -> None:
        if len(tokens.n) != 1:
            raise ValueError(f"streamer= takes one row (transformers' streamers support batch size 1), got "
                             f"{len(tokens.n)} rows (prompts x num_return_sequences): use stream() for batches")
        if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise TypeError(f"streamer must have put() and end() (a transformers streamer), got "
                            f"{type(streamer).__name__}")
        self.streamer, self.ended = streamer, False
        streamer.put(torch.as_tensor(tokens.ids[0, : tokens.n[0]]).reshape(1, -1))

    def round(self, event: Round) -> None:
        u = event.used[0]
        if u:
            self.streamer.put(torch.as_tensor(event.outcomes[0, :u]).reshape(-1))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()


def streamer_feed(streamer: Any, tokens: Any, tokenizer: Any = None) -> _Feed:
    """The feed of ``streamer`` for the request whose buffer is ``tokens`` (one row)."""
    return _Feed(streamer, tokens)


def stream_events(events: Iterator[Round], tokens: Any, tokenizer: Any = None,
                  feed: _Feed | None = None) -> Iterator[StreamEvent]:
    """The :class:`StreamEvent` of every round of ``events`` (the request's round generator);
    closing this generator closes ``events`` (which releases the caches)."""
    B = len(tokens.n)
    decoders = [IncrementalDecoder(tokenizer) for _ in range(B)] if tokenizer is not None else None
    try:
        for ev in events:
            new: list[list[int]] = [[] for _ in range(B)]
            for i, r in enumerate(ev.rows.tolist()):
                new[r] = [int(t) for t in ev.outcomes[i, : ev.used[i]]]
            texts = None
            if decoders is not None:
                texts = [decoders[r].push(new[r]) if new[r] else "" for r in range(B)]
                for r in ev.finished:
                    texts[r] += decoders[r].flush()
            if feed is not None:
                feed.round(ev)
            yield StreamEvent(new, texts, list(ev.finished), ev.stats)
    finally:
        events.close()
        if feed is not None:
            feed.end()
