"""What ``SpeculativeGenerator.generate`` accepts as a request, checked before any work.

Prompts are token ids (a ``[B, L]`` tensor or array with an ``attention_mask`` marking left or
right padding, or lists of ids of any lengths) or, with a tokenizer, text or chat messages
(through its chat template); EOS ids must lie in the
vocabulary. Encoder-decoder targets take encoder inputs (:func:`encoder_inputs`: token ids with
their mask for text encoders, ``input_features`` for speech encoders) and optional decoder prompts
(:func:`decoder_prompts`; default: the decoder start token). Everything else is refused with a
message that names the problem and the fix: text without a tokenizer, float or nested ids, masks
with holes or values other than 0/1, empty prompts, ids outside the vocabulary, the wrong kind of
encoder input for the family.

>>> prompt_ids(torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]), vocab=10)
[array([5, 6]), array([7, 8, 9])]
>>> eos_ids([2, 3], vocab=10, source="eos_token_id").tolist()
[2, 3]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..models.facts import speech_encoder
from .strings import chat_prompts, is_chat

__all__ = ["EncoderInputs", "decoder_prompts", "encoder_inputs", "eos_ids", "is_int", "pad_id", "prompt_ids"]


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
             tokenizer: Any = None, pad_token_id: int | None = None) -> list[np.ndarray]:
    """The prompts of ``input_ids`` (padding removed) as int64 arrays, checked; raises before any
    work: ``TypeError`` for text without a tokenizer or non-integer ids, ``ValueError`` for empty
    rows, ids outside the vocabulary, or a mask that does not fit.

    A ``[B, L]`` tensor (or array) of ids given without ``attention_mask`` is masked where it holds
    ``pad_token_id``, as transformers' ``generate`` infers it (the caller passes None when the pad id
    is unknown or is also an EOS id): left- or right-padded rows lose their padding; a pad id inside
    a row is a hole the mask check refuses."""
    if isinstance(input_ids, Mapping) and "input_ids" in input_ids:
        raise TypeError(
            f"input_ids is a tokenizer's whole output ({type(input_ids).__name__} with keys "
            f"{', '.join(map(repr, input_ids))}): pass it as keyword arguments, gen.generate(**batch, ...)")
    if _is_text(input_ids):
        input_ids = _tokenize(input_ids, tokenizer, attention_mask)
    elif is_chat(input_ids):  # chat messages: through the tokenizer's chat template
        input_ids = chat_prompts(input_ids, tokenizer)
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
    inferred = False
    if (attention_mask is None and pad_token_id is not None and isinstance(input_ids, torch.Tensor)
            and input_ids.ndim == 2 and not input_ids.is_floating_point()):
        pads = ids == int(pad_token_id)
        if bool(pads.any()):  # padded ids: the mask transformers' generate would infer
            attention_mask, inferred = (~pads).long(), True
    if len(rows) == 0:
        raise ValueError("input_ids has no rows")
    if any(_is_text(r) for r in rows):
        raise TypeError(f"input_ids holds text, not token ids: {_TEXT_FIX}")
    if attention_mask is not None:
        widths = {len(r) for r in rows}
        try:
            m = _mask_rows(attention_mask, len(rows), widths.pop() if len(widths) == 1 else None)
        except ValueError as e:
            if not inferred:
                raise
            raise ValueError(f"input_ids holds pad_token_id {pad_token_id} inside a row, not only as left or "
                             f"right padding (the attention_mask inferred from it: {e}); pass attention_mask "
                             "yourself (or set generation_config.pad_token_id to the real pad id)") from None
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


# --------------------------------------------------------------------------------------------
# encoder-decoder requests


@dataclass
class EncoderInputs:
    """What the encoders of an encoder-decoder request read, checked."""

    tensors: dict[str, torch.Tensor]  #: ``input_ids`` + ``attention_mask`` [B, S], or ``input_features`` [B, F, T]
    ids: list[np.ndarray] | None  #: each row's source ids without padding (text encoders), for prompt lookup
    rows: int  #: B


def _features(model: Any, input_features: Any) -> torch.Tensor:
    name, cfg = type(model).__name__, model.config
    if isinstance(input_features, np.ndarray):
        input_features = torch.from_numpy(input_features)
    if not isinstance(input_features, torch.Tensor):
        raise TypeError(f"input_features must be a float tensor [B, n_mels, frames] (from {name}'s "
                        f"feature extractor), got {type(input_features).__name__}")
    f = input_features.detach()
    f = f[None] if f.ndim == 2 else f
    if f.ndim != 3 or not f.is_floating_point():
        raise ValueError(f"input_features must be a float tensor [B, n_mels, frames], got shape "
                         f"{tuple(f.shape)} and dtype {f.dtype}")
    mels = getattr(cfg, "num_mel_bins", None)
    if isinstance(mels, int) and f.shape[1] != mels:
        raise ValueError(f"input_features has {f.shape[1]} feature bins but {name} reads "
                         f"num_mel_bins={mels}")
    src = getattr(cfg, "max_source_positions", None)
    if getattr(cfg, "model_type", "") == "whisper" and isinstance(src, int) and f.shape[2] != 2 * src:
        raise ValueError(f"input_features has {f.shape[2]} frames but {name} reads exactly "
                         f"{2 * src} (2 x max_source_positions): pad or cut the audio's features to "
                         "that length, as its feature extractor does")
    if not bool(torch.isfinite(f).all()):
        raise ValueError("input_features holds NaN or inf")
    return f


def encoder_inputs(model: Any, input_ids: Any, attention_mask: Any, input_features: Any,
                   tokenizer: Any = None) -> EncoderInputs:
    """The encoder inputs of a request to the encoder-decoder ``model``, checked before any work.

    Text encoders take ``input_ids`` (a ``[B, S]`` tensor or array, kept as given with its
    ``attention_mask``, or lists of ids, right-padded here; text with a tokenizer); speech encoders
    (Whisper) ``input_features``. Mixing the two, or giving the kind the encoder does not read, is a
    ``ValueError`` naming the family.
    """
    name = type(model).__name__
    if input_ids is not None and input_features is not None:
        raise ValueError(f"pass either input_ids (text encoders) or input_features (speech encoders), "
                         f"not both: {name} has one encoder")
    if speech_encoder(model):
        if input_ids is not None:
            raise ValueError(f"{name} has a speech encoder: pass input_features= (log-mel features "
                             "[B, n_mels, frames] from its feature extractor), not input_ids; a "
                             "decoder prompt goes in decoder_input_ids=")
        if input_features is None:
            raise ValueError(f"{name} has a speech encoder: pass input_features= [B, n_mels, frames]")
        if attention_mask is not None:
            raise ValueError(f"attention_mask goes with input_ids; {name} reads every frame of "
                             "input_features (drop attention_mask)")
        f = _features(model, input_features)
        return EncoderInputs({"input_features": f}, None, int(f.shape[0]))
    if input_features is not None:
        raise ValueError(f"{name} has a text encoder: pass input_ids= (and attention_mask=), not "
                         "input_features")
    if input_ids is None:
        raise ValueError(f"{name} is an encoder-decoder: pass the encoder's token ids as input_ids= "
                         "(and attention_mask=)")
    enc = model.get_encoder().get_input_embeddings()
    vocab = int(enc.weight.shape[0])
    rows = prompt_ids(input_ids, attention_mask, vocab, tokenizer)
    if isinstance(input_ids, (torch.Tensor, np.ndarray)) and np.ndim(input_ids) == 2:
        ids = torch.as_tensor(np.asarray(input_ids.detach().cpu() if isinstance(input_ids, torch.Tensor)
                                         else input_ids), dtype=torch.long)
        mask = (torch.ones_like(ids) if attention_mask is None else
                torch.as_tensor(np.asarray(attention_mask.detach().cpu() if isinstance(attention_mask, torch.Tensor)
                                           else attention_mask)).long().reshape(ids.shape))
    else:  # lists of ids: right-padded (positions start at 0 in every row)
        pad = getattr(model.config, "pad_token_id", None)
        pad = pad if is_int(pad) and 0 <= pad < vocab else 0
        S = max(len(r) for r in rows)
        ids = torch.full((len(rows), S), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), S), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.from_numpy(r)
            mask[i, : len(r)] = 1
    return EncoderInputs({"input_ids": ids, "attention_mask": mask}, rows, len(rows))


def decoder_prompts(model: Any, decoder_input_ids: Any, decoder_attention_mask: Any, rows: int,
                    vocab: int) -> list[np.ndarray]:
    """Each row's decoder prompt, checked: ``decoder_input_ids`` (ragged lists, or a ``[B, L]``
    tensor with ``decoder_attention_mask``; one row is repeated for every row), else the model's
    decoder start token (``generation_config.decoder_start_token_id``, then the config's)."""
    name = type(model).__name__
    if decoder_input_ids is None:
        if decoder_attention_mask is not None:
            raise ValueError("decoder_attention_mask goes with decoder_input_ids")
        gc = getattr(model, "generation_config", None)
        start = getattr(gc, "decoder_start_token_id", None)
        start = start if start is not None else getattr(model.config, "decoder_start_token_id", None)
        start = start[0] if isinstance(start, (list, tuple)) and start else start
        if not is_int(start) or not 0 <= start < vocab:
            raise ValueError(f"{name} has no usable decoder_start_token_id ({start!r}): pass "
                             "decoder_input_ids= (each row's first decoder tokens)")
        return [np.array([int(start)], np.int64) for _ in range(rows)]
    try:
        prompts = prompt_ids(decoder_input_ids, decoder_attention_mask, vocab)
    except (ValueError, TypeError) as e:
        raise type(e)(f"decoder_input_ids: {e}") from None
    if len(prompts) == 1 and rows > 1:
        prompts = prompts * rows
    if len(prompts) != rows:
        raise ValueError(f"decoder_input_ids has {len(prompts)} rows but the encoder inputs have "
                         f"{rows}: give one decoder prompt per row (or one for all)")
    return prompts


def pad_id(target: Any, tokenizer: Any = None) -> int | None:
    """The pad id to infer a missing ``attention_mask`` from (transformers' rule): the target's
    ``generation_config.pad_token_id``, else the tokenizer's; None when unknown or also an EOS id."""
    gc = getattr(target, "generation_config", None)
    pad = getattr(gc, "pad_token_id", None)
    if pad is None and tokenizer is not None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    if pad is None:
        return None
    eos = getattr(gc, "eos_token_id", None)
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return None if int(pad) in eos else int(pad)
