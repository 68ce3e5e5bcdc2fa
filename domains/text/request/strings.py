"""Text in, text out: chat messages through the tokenizer's chat template, the decoding of new
tokens (whole, and incremental for streaming), and stop strings.

>>> from speculate.domains.text import ByteTokenizer
>>> tok = ByteTokenizer()
>>> d = IncrementalDecoder(tok)
>>> ids = tok("é!", add_special_tokens=False).input_ids       # 'é' is two bytes: two tokens
>>> [d.push(ids[:1]), d.push(ids[1:]), d.flush()]               # no half character is ever shown
['', 'é!', '']
>>> StopStrings(tok, ["\\n\\n"]).first_stop([*tok("a\\n\\nb", add_special_tokens=False).input_ids], 0, 0, 4)
2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["IncrementalDecoder", "StopStrings", "chat_prompts", "decode", "is_chat"]


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and "role" in m and "content" in m


def is_chat(x: Any) -> bool:
    """True for one conversation (a list of ``{"role", "content"}`` dicts) or a list of them."""
    if not isinstance(x, (list, tuple)) or not x:
        return False
    if all(_is_message(m) for m in x):
        return True
    return all(isinstance(c, (list, tuple)) and c and all(_is_message(m) for m in c) for c in x)


def chat_prompts(messages: Any, tokenizer: Any) -> list[list[int]]:
    """Token ids of each conversation through ``tokenizer``'s chat template, with the generation
    prompt (the assistant's turn) appended."""
    convs = [messages] if all(_is_message(m) for m in messages) else list(messages)
    if tokenizer is None:
        raise TypeError("chat messages need a tokenizer: create the SpeculativeGenerator with tokenizer=")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no chat template, so it cannot "
                         "format chat messages: pass plain strings, or set tokenizer.chat_template")
    out = []
    for conv in convs:
        text = tokenizer.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=True)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """``ids`` as text, special tokens skipped."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


class IncrementalDecoder:
    """The text of a growing list of tokens, piece by piece: :meth:`push` returns only text that is
    final (a multi-byte character split across tokens waits for its last byte), :meth:`flush` the
    rest. The pieces always add up to ``decode(all tokens)``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = 0  # characters returned so far

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        text = decode(self.tokenizer, self.ids)
        end = len(text.rstrip("\ufffd"))  # an incomplete character decodes to U+FFFD: wait for it
        if end <= self.shown:
            return ""
        piece, self.shown = text[self.shown:end], end
        return piece

    def flush(self) -> str:
        text = decode(self.tokenizer, self.ids)
        piece, self.shown = text[self.shown:], len(text)
        return piece


class StopStrings:
    """Ends a row at the first new token whose text completes one of ``strings``."""

    def __init__(self, tokenizer: Any, strings: Sequence[str]) -> None:
        if tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: create the SpeculativeGenerator with tokenizer=")
        self.tokenizer, self.strings = tokenizer, list(strings)
        self.window = 4 * max(len(s) for s in self.strings) + 4  # tokens: a character has <= 4 bytes

    def first_stop(self, ids: Sequence[int], prompt_len: int, start: int, end: int) -> int | None:
        """The first position ``p`` in ``start..end-1`` (indices into ``ids``) at which the new text
        ``ids[prompt_len : p + 1]`` contains a stop string; None if none does."""
        for p in range(start, end):
            lo = max(prompt_len, p + 1 - self.window)
            text = decode(self.tokenizer, ids[lo : p + 1])
            if any(s in text for s in self.strings):
                return p
        return None

    def hook(self, tokens: Any) -> Any:
        """``TextProcess.stop`` for the rows of ``tokens`` (a ``TokenBuffer``)."""

        def stop(rows: np.ndarray, start: np.ndarray, n_used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            n_used = np.array(n_used, dtype=np.int64)
            hit = np.zeros(len(rows), bool)
            for i, r in enumerate(rows.tolist()):
                s = int(start[i])
                p = self.first_stop(tokens.ids[r], int(tokens.prompt_len[r]), s, s + int(n_used[i]))
                if p is not None:
                    n_used[i], hit[i] = p - s + 1, True
            return n_used, hit

        return stop
