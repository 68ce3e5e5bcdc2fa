"""What the serving engine takes and gives: one request's settings (:class:`Sampling`), the events
it streams back (:class:`JobEvent`), and the errors it raises before any work (:class:`Refused`,
:class:`Busy`). The HTTP layer (``app.py``) turns OpenAI requests into these and these into OpenAI
responses; the engine (``engine.py``) knows nothing of HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Busy", "JobEvent", "Refused", "Sampling"]


class Refused(ValueError):
    """A request the engine will not run (bad settings, a prompt too long, ids outside the vocabulary):
    raised by ``Engine.submit`` before any work. ``param``: the request field at fault, if one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Busy(RuntimeError):
    """The engine's queue is full (or it is shutting down): try again later (HTTP 429 / 503)."""

    def __init__(self, message: str, shutting_down: bool = False) -> None:
        super().__init__(message)
        self.shutting_down = shutting_down


@dataclass(frozen=True)
class Sampling:
    """One request's settings, OpenAI's names. ``temperature`` 0: greedy. ``seed``: the request's own
    random stream (the same tokens whether it runs alone or beside others, with a fixed lookahead);
    None: fresh entropy. ``stop``: strings that end a choice (not included in its text);
    ``stop_token_ids``: ids that end it (included, like EOS); ``ignore_eos``: run to ``max_tokens``.
    ``json_schema``: structured output (llguidance; the target's law masked by the schema at every
    position, proofs/12); the choice ends at EOS once the text is complete."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    json_schema: Any = None  #: the JSON schema (a dict or its text) every choice's text must match


@dataclass
class JobEvent:
    """What a job streams: choice ``index`` got ``token_ids`` (and their ``text``, held back while it
    could still be the start of a stop string or an incomplete character) and, with ``logprobs``,
    each token's log-probability under the law it was drawn from. The last event of a choice has
    ``finish_reason``: "stop" (EOS, a stop id or string), "length" (``max_tokens``), "cancelled", or
    "error" (then ``error`` says what)."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    error: str | None = None
