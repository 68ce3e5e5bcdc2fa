"""What ``SpeculativeGenerator.generate`` accepts as a request, checked before any work.

Prompts are token ids (a ``[B, L]`` tensor or array with an ``attention_mask`` marking left or
right padding, or lists of ids of any lengths) or, with a tokenizer, text; EOS ids must lie in the
vocabulary. Everything else is refused with a message that names the problem and the fix: text
without a tokenizer, float or nested ids, masks with holes or values other than 0/1, empty
prompts, ids outside the vocabulary.

>>> prompt_ids(torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]), vocab=10)
[array([5, 6]), array([7, 8, 9])]
>>> eos_ids([2, 3], vocab=10, source="eos_token_id").tolist()
[2, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["eos_ids", "ids_of", "is_int", "prompt_ids"]


def ids_of(x: Any) -> set[int]:
    if x is None:
        return set()
    return {int(v) for v in (x if isinstance(x, (list, tuple)) else [x])}


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def eos_ids(eos: Any, vocab: int, source: str) -> np.ndarray:
    """The EOS ids as a sorted int64 array, checked: ints (or a list of them) in ``0..vocab-1``."""
    if eos is None:
        return np.zeros(0, np.int64)
    if isinstance(eos, (torch.Tensor, np.ndarray)):
        arr = eos.detach().cpu().numpy() if isinstance(eos, torch.Tensor) else eos
        if arr.ndim > 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"{source} must be an int or a list of ints, got an array of "
                            f"shape {arr.shape} and dtype {arr.dtype}")
        vals = arr.reshape(-1).tolist()
    elif is_int(eos):
        vals = [int(eos)]
    elif isinstance(eos, (list, tuple, set, frozenset)) and all(is_int(v) for v in eos):
        vals = [int(v) for v in eos]
    else:
        raise TypeError(f"{source} must be an int, a list of ints, [] (never stop early) or None, "
                        f"got {eos!r}")
    bad = [v for v in vals if not 0 <= v < vocab]
    if bad:
        fix = ("pass eos_token_id= with the tokenizer's EOS id, or [] to never stop early"
               if source != "eos_token_id" else
               "pass the id of the target tokenizer's EOS token, or [] to never stop early")
        raise ValueError(f"{source} has id(s) {bad} outside the target's vocabulary "
                         f"(ids 0..{vocab - 1}), which no row could ever emit: {fix}")
    return np.array(sorted(set(vals)), dtype=np.int64)


_TEXT_FIX = ("tokenize it first (e.g. input_ids = tokenizer(texts).input_ids), or create the "
             "SpeculativeGenerator with tokenizer= to let generate() tokenize text")


def _is_text(x: Any) -> bool:
    return isinstance(x, (str, bytes)) or (
        isinstance(x, Sequence) and len(x) > 0 and all(isinstance(v, (str, bytes)) for v in x))


def _tokenize(texts: Any, tokenizer: Any, attention_mask: Any) -> list[list[int]]:
    if tokenizer is None:
        ex = texts if isinstance(texts, (str, bytes)) else texts[0]
        raise TypeError(f"input_ids holds text ({ex!r:.40}), not token ids: {_TEXT_FIX}")
    if attention_mask is not None:
        raise ValueError("attention_mask goes with token ids; text is tokenized without padding "
                         "(drop attention_mask, or tokenize the texts yourself)")
    batch = [texts] if isinstance(texts, (str, bytes)) else list(texts)
    if any(isinstance(t, bytes) for t in batch):
        raise TypeError("input_ids holds bytes: decode them to str, or tokenize them yourself")
    return [list(r) for r in tokenizer(batch)["input_ids"]]


def _row(r: Any, i: int) -> np.ndarray:
    """Row ``i`` of input_ids as a 1-D integer array (not yet range-checked)."""
    if isinstance(r, torch.Tensor):
        r = r.detach().cpu().numpy()
    if isinstance(r, (str, bytes)):
        raise TypeError(f"row {i} of input_ids is text ({r!r:.40}), not token ids: {_TEXT_FIX}")
    try:
        a = np.asarray(r)
    except (ValueError, TypeError) as e:
        raise TypeError(f"row {i} of input_ids is not a list of token ids: {e}") from None
    if a.ndim != 1:
        raise ValueError(f"row {i} of input_ids must be a flat list of token ids, got shape "
                         f"{a.shape}; input_ids is [B, L] (or one list of ids)")
    if a.size == 0:
        raise ValueError(f"row {i} of input_ids is an empty prompt: give at least one token (e.g. BOS)")
    if a.dtype.kind not in "iu":
        raise TypeError(f"input_ids must hold integer token ids, got {a.dtype} in row {i}: pass a "
                        "LongTensor or lists of ints (token ids, not probabilities or text)")
    return a


def _mask_rows(attention_mask: Any, n_rows: int, width: int | None) -> np.ndarray:
    """The attention mask as bool ``[B, L]``, checked: 0/1 values, left or right padding only."""
    if isinstance(attention_mask, torch.Tensor):
        mask = attention_mask.detach().cpu().numpy()
    else:
        try:
            mask = np.asarray(attention_mask)
        except (ValueError, TypeError) as e:
            raise ValueError(f"attention_mask must be a [B, L] array of 0 and 1: {e}") from None
    mask = mask[None] if mask.ndim == 1 else mask
    if mask.ndim != 2 or width is None or mask.shape != (n_rows, width):
        raise ValueError(
            f"attention_mask of shape {mask.shape} does not match input_ids "
            f"({n_rows} rows of {width if width is not None else 'different lengths'})")
    if mask.dtype.kind not in "biuf" or not np.isin(mask, (0, 1)).all():
        bad = np.unique(mask[~np.isin(mask, (0, 1))])[:5].tolist() if mask.dtype.kind in "biuf" else mask.dtype
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), got {bad}")
    m = mask.astype(bool)
    starts = (m[:, 1:] & ~m[:, :-1]).sum(axis=1) + m[:, 0]  # runs of 1 per row
    holes = np.flatnonzero(starts > 1)
    if holes.size:
        r = int(holes[0])
        first, last = np.flatnonzero(m[r])[[0, -1]]
        col = int(first + np.flatnonzero(~m[r, first:last])[0])
        raise ValueError(
            f"row {r} of attention_mask has padding inside the prompt (a 0 at column {col} between "
            "tokens): only left or right padding is supported, and a masked token would be dropped "
            "from the prompt. Remove such tokens from input_ids instead")
    return m


def prompt_ids(input_ids: Any, attention_mask: Any, vocab: int,
             tokenizer: Any = None) -> list[np.ndarray]:
    """The prompts of ``input_ids`` (padding removed) as int64 arrays, checked; raises before any
    work: ``TypeError`` for text without a tokenizer or non-integer ids, ``ValueError`` for empty
    rows, ids outside the vocabulary, or a mask that does not fit."""
    if _is_text(input_ids):
        input_ids = _tokenize(input_ids, tokenizer, attention_mask)
    if isinstance(input_ids, np.ndarray):
        input_ids = torch.from_numpy(input_ids) if input_ids.dtype.kind in "biuf" else list(input_ids)
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids.detach().cpu()
        if ids.ndim not in (1, 2):
            raise ValueError(f"input_ids must be [B, L] or [L], got shape {tuple(ids.shape)}")
        rows = [ids] if ids.ndim == 1 else list(ids)
    elif isinstance(input_ids, Sequence) and not isinstance(input_ids, (str, bytes)):
        if len(input_ids) and all(np.ndim(v) == 0 and not isinstance(v, (str, bytes))
                                  for v in input_ids):  # one list of ids
            rows = [list(input_ids)]
        else:
            rows = list(input_ids)
    else:
        raise TypeError(f"input_ids must be a LongTensor [B, L] or lists of token ids, got "
                        f"{type(input_ids).__name__}")
    if len(rows) == 0:
        raise ValueError("input_ids has no rows")
    if any(_is_text(r) for r in rows):
        raise TypeError(f"input_ids holds text, not token ids: {_TEXT_FIX}")
    if attention_mask is not None:
        widths = {len(r) for r in rows}
        m = _mask_rows(attention_mask, len(rows), widths.pop() if len(widths) == 1 else None)
        rows = [_row(r, i)[m[i]] if len(r) else _row(r, i) for i, r in enumerate(rows)]
    out = []
    for i, r in enumerate(rows):
        r = _row(r, i) if not isinstance(r, np.ndarray) else r
        if len(r) == 0:
            raise ValueError(
                f"row {i} of input_ids is an empty prompt: give at least one token (e.g. BOS)")
        if r.min() < 0 or r.max() >= vocab:
            raise ValueError(f"row {i} of input_ids has token ids outside 0..{vocab - 1} "
                             f"(e.g. {int(r[(r < 0) | (r >= vocab)][0])}): the target has {vocab} logits")
        out.append(r.astype(np.int64))
    return out
