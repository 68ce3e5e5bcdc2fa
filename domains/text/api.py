"""The text domain's public functions: SpeculativeGenerator (exact, batched speculative decoding for
transformers causal LMs), its GenerationOutput, and check_vocabularies.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from speculate.domains.text import SpeculativeGenerator
>>> def llama(layers, seed):
...     torch.manual_seed(seed)
...     cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
...                       num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
...     return LlamaForCausalLM(cfg).eval()
>>> gen = SpeculativeGenerator(llama(2, 0), llama(1, 1), lookahead=3, verify="block")
>>> out = gen.generate(torch.tensor([[5, 6, 7], [0, 8, 9]]), attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]),
...                    max_new_tokens=6, rng=0)
>>> [len(s) for s in out.sequences]      # prompt + 6 new tokens per row (left padding dropped)
[9, 8]
>>> out.stats.tokens_per_call >= 1.0
True
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from speculate.rng import as_rng
from speculate.rounds import run
from speculate.stats import Stats
from speculate.verify import RULES

from .drafts import ModelDraft, make_draft
from .kv_cache import (
    CachedModel,
    CacheMemoryError,
    available_memory,
    cache_bytes,
    check_eval_mode,
    check_model,
    length_limits,
    model_vocab_size,
)
from .process import TextProcess, TokenBuffer
from .sampling import SamplingConfig

__all__ = ["GenerationOutput", "SpeculativeGenerator", "check_vocabularies"]

#: largest vocabulary difference treated as padding of one tokenizer's vocabulary
MAX_VOCAB_PADDING = 256


@dataclass
class GenerationOutput:
    """The result of :meth:`SpeculativeGenerator.generate`.

    ``sequences[r]``: prompt tokens of row ``r`` (padding removed) followed by its new tokens.
    ``stats``: the round loop's :class:`speculate.Stats` (``acceptance_rate``, ``alpha``,
    ``tokens_per_call``, ``accepted_per_position`` (the accepted-length histogram),
    ``draft_time``, ``target_time``, ...). ``prefill_time`` and ``wall_time`` are in seconds.
    """

    sequences: list[list[int]]
    prompt_lengths: list[int]
    stats: Stats
    prefill_time: float
    wall_time: float

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


def _ids(x: Any) -> set[int]:
    if x is None:
        return set()
    return {int(v) for v in (x if isinstance(x, (list, tuple)) else [x])}


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _eos_ids(eos: Any, vocab: int, source: str) -> np.ndarray:
    """The EOS ids as a sorted int64 array, checked: ints (or a list of them) in ``0..vocab-1``."""
    if eos is None:
        return np.zeros(0, np.int64)
    if isinstance(eos, (torch.Tensor, np.ndarray)):
        arr = eos.detach().cpu().numpy() if isinstance(eos, torch.Tensor) else eos
        if arr.ndim > 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"{source} must be an int or a list of ints, got an array of "
                            f"shape {arr.shape} and dtype {arr.dtype}")
        vals = arr.reshape(-1).tolist()
    elif _is_int(eos):
        vals = [int(eos)]
    elif isinstance(eos, (list, tuple, set, frozenset)) and all(_is_int(v) for v in eos):
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


def check_vocabularies(target: Any, draft: Any, tokenizer: Any = None,
                       draft_tokenizer: Any = None) -> None:
    """Raise ``ValueError`` when ``draft`` cannot share ``target``'s token ids.

    Accepted: equal vocabularies, or one a padded prefix of the other (sizes within
    :data:`MAX_VOCAB_PADDING`, e.g. 32000 vs 32064). Rejected: different BOS/EOS ids in the
    configs, larger size differences, or (when both tokenizers are given) any token whose id
    differs between them.
    """
    Vt, Vd = model_vocab_size(target), model_vocab_size(draft)
    tc, dc = target.config, draft.config
    for name in ("bos_token_id", "eos_token_id"):
        a, b = _ids(getattr(tc, name, None)), _ids(getattr(dc, name, None))
        if a and b and a != b:
            raise ValueError(
                f"draft and target use different tokenizers: {name} is {sorted(b)} in the draft "
                f"and {sorted(a)} in the target; speculative decoding needs shared token ids"
            )
    if tokenizer is not None and len(tokenizer.get_vocab()) > Vt:
        raise ValueError(
            f"the tokenizer has {len(tokenizer.get_vocab())} tokens but the target only {Vt} logits")
    if tokenizer is not None and draft_tokenizer is not None:
        tv, dv = tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        bad = [t for t in set(tv) & set(dv) if tv[t] != dv[t]]
        only = [t for t, i in dv.items() if t not in tv and i < min(Vt, Vd)]
        if bad or only:
            ex = (bad or only)[0]
            raise ValueError(
                f"draft and target tokenizers differ (token {ex!r} has id {dv.get(ex)} in the "
                f"draft, {tv.get(ex)} in the target); speculative decoding needs shared token ids"
            )
    elif abs(Vt - Vd) > MAX_VOCAB_PADDING:
        raise ValueError(
            f"draft vocabulary ({Vd} ids) and target vocabulary ({Vt} ids) differ by more than "
            f"padding ({MAX_VOCAB_PADDING}): they likely use different tokenizers. Pass "
            "tokenizer= and draft_tokenizer= to check the vocabularies token by token"
        )


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


def _prompts(input_ids: Any, attention_mask: Any, vocab: int,
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


class SpeculativeGenerator:
    """Speculative decoding for a transformers causal LM, exact for every sampling setting.

    ``target``: any causal LM (``AutoModelForCausalLM``) whose forward honours ``position_ids`` and
    4-D attention masks (checked once). ``draft``: a smaller causal LM with the same tokenizer, or
    ``"ngram"`` / ``"ngram:N"`` (prompt lookup over the last ``N`` tokens, default 3), or
    ``"early-exit:N"`` (the target's first ``N`` layers and its head). ``lookahead``: drafts per
    round (an int, or ``"auto"`` to adapt it, up to ``max_lookahead``, to the measured acceptance
    and cost). ``verify``: ``"block"`` (Sun et al. 2024, never fewer tokens than token-wise in
    expectation), ``"token"`` (Leviathan et al.) or ``"greedy"``; temperature 0 always uses
    ``"greedy"``. ``cost_ratio``: with ``lookahead="auto"``, a fixed cost of a draft step relative
    to a target call instead of the measured one, so that the lookahead chosen each round (hence
    the tokens) depends on the seed alone and seeded runs are reproducible (see
    :func:`speculate.rounds.run`). ``tokenizer``, ``draft_tokenizer``: compared token by token
    with a draft model; with ``tokenizer``, :meth:`generate` also takes text. Models must be in
    eval mode (``.eval()``).
    """

    def __init__(self, target: Any, draft: Any, lookahead: int | str = 4, verify: str = "block",
                 *, cost_ratio: float | None = None, tokenizer: Any = None,
                 draft_tokenizer: Any = None, max_lookahead: int = 16) -> None:
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target must be a transformers causal LM, got {type(target).__name__}")
        if not isinstance(verify, str) or verify not in RULES:
            raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
        if lookahead != "auto" and (not _is_int(lookahead) or lookahead < 0):
            raise ValueError(f"lookahead must be an int >= 0 or 'auto', got {lookahead!r}")
        if not _is_int(max_lookahead) or max_lookahead < 1:
            raise ValueError(f"max_lookahead must be an int >= 1, got {max_lookahead!r}")
        if cost_ratio is not None and (
                isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float, np.number))
                or not 0.0 <= cost_ratio < float("inf")):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio!r}")
        check_model(target, "target")
        if isinstance(draft, torch.nn.Module):
            check_vocabularies(target, draft, tokenizer, draft_tokenizer)
        self.target = target
        self._target_lm = CachedModel(target)
        self.draft = make_draft(draft, target)
        self.lookahead = lookahead if lookahead == "auto" else int(lookahead)
        self.verify = verify
        self.cost_ratio = cost_ratio
        self.max_lookahead = max(int(max_lookahead), self.lookahead if self.lookahead != "auto" else 1)
        self.vocab = model_vocab_size(target)
        self.tokenizer = tokenizer

    def _models(self) -> list[tuple[Any, str]]:
        """The models this generator runs, with their role: the target, and a draft model if any."""
        out = [(self.target, "target")]
        if isinstance(self.draft, ModelDraft):
            out.append((self.draft.model, "draft"))
        return out

    def _check_lengths(self, prompts: list[np.ndarray], n_new: int) -> None:
        """Refuse, before any work, sequences longer than a model can decode (learned positions,
        sliding window)."""
        lens = np.array([len(p) for p in prompts])
        r = int(np.argmax(lens))
        L = int(lens[r])
        total = L + n_new
        for model, role in self._models():
            for limit, why in length_limits(model):
                if total > limit:
                    fix = (f"Lower max_new_tokens to {limit - L} or shorten the prompt" if limit > L
                           else f"Shorten the prompt to at most {limit - 1} tokens")
                    raise ValueError(
                        f"row {r}: its prompt ({L} tokens) plus max_new_tokens={n_new} makes {total} "
                        f"tokens, more than the {role} ({type(model).__name__}) can decode: it has "
                        f"{why}. {fix} (generate the longer rows separately)")

    def _check_memory(self, n_rows: int, capacity: int, spare: int) -> None:
        """Refuse, before anything is allocated, a batch whose KV caches (and token buffer) need
        more memory than the device they go to has available (:func:`available_memory`)."""
        need: dict[torch.device, list[tuple[str, int]]] = {}
        for model, role in self._models():
            b = cache_bytes(model, n_rows, capacity + spare)
            if b is not None:
                dev = next(model.parameters()).device
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
            fix = (f"Generate at most about {fit} rows per call, or fewer new tokens "
                   "(max_new_tokens)" if fit >= 1 else
                   "Not even one row fits: lower max_new_tokens")
            raise CacheMemoryError(
                f"not enough memory on {dev} for this call: {n_rows} rows of up to {capacity} "
                f"tokens need {total / gib:.3g} GiB ({detail}) but {avail[0] / gib:.3g} GiB is "
                f"available ({avail[1]}). {fix}")

    @torch.inference_mode()
    def generate(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        rng: int | np.random.Generator | None = 0,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` per row; each row stops at its first EOS.

        ``input_ids``: ``[B, L]`` integer tensor (with ``attention_mask`` marking padding, left or
        right) or lists of token ids; text (a string or a list of strings) when the generator was
        given ``tokenizer=``. ``eos_token_id``: ``None`` uses the target's
        ``generation_config.eos_token_id``; ``[]`` disables stopping. ``rng``: an int seed, a numpy
        Generator or None (fresh entropy); every random choice (draft samples and verification
        uniforms) comes from it.

        Bad input raises ``TypeError`` / ``ValueError`` naming the problem and the fix before any
        work: text without a tokenizer, non-integer ids, empty rows, ids or EOS ids outside the
        vocabulary, masks with holes or values other than 0/1, a model in training mode, a prompt
        plus ``max_new_tokens`` longer than a model's learned positions or sliding window, and
        (:class:`~speculate.domains.text.kv_cache.CacheMemoryError`) KV caches larger than the
        available memory. An exception during the rounds propagates with a note naming the phase,
        round and rows; the caches are released either way.
        """
        t_start = time.perf_counter()
        cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        verify = "greedy" if cfg.greedy else self.verify
        if verify == "greedy" and not cfg.greedy:
            raise ValueError("verify='greedy' is exact only for temperature=0; use 'token' or 'block'")
        rng = as_rng(rng)
        for model, role in self._models():  # .train() may have been called since __init__
            check_eval_mode(model, role)
        prompts = _prompts(input_ids, attention_mask, self.vocab, self.tokenizer)
        if eos_token_id is None:
            gc = getattr(self.target, "generation_config", None)
            eos = _eos_ids(getattr(gc, "eos_token_id", None), self.vocab,
                           "the target's generation_config.eos_token_id")
        else:
            eos = _eos_ids(eos_token_id, self.vocab, "eos_token_id")
        n_new = int(max_new_tokens)
        # cache slots past the longest row: the padded columns of ragged blocks (a row that
        # needs fewer drafts than the block is wide) and the scoring block's own column
        k_max = self.lookahead if isinstance(self.lookahead, int) else self.max_lookahead
        spare = min(k_max, n_new) + 2
        if n_new > 0:
            self._check_lengths(prompts, n_new)
            self._check_memory(len(prompts), max(len(p) for p in prompts) + n_new, spare)
        tokens = TokenBuffer.from_prompts(prompts, extra=n_new)  # the loop gives no row more
        process = TextProcess(target=self._target_lm, draft=self.draft, tokens=tokens, cfg=cfg,
                              eos=eos, vocab=self.vocab)
        stats, prefill = Stats(), 0.0
        if n_new > 0:
            try:
                process.start(spare=spare)
                prefill = process.prefill_time
                result = run(process, len(prompts), n_new, lookahead=self.lookahead,
                             verify=verify, rng=rng, max_lookahead=self.max_lookahead,
                             cost_ratio=self.cost_ratio,
                             keep_samples=False)  # the tokens live in the TokenBuffer
            finally:
                process.release()
            stats = result.stats
        seqs = [tokens.ids[r, : tokens.n[r]].tolist() for r in range(len(prompts))]
        return GenerationOutput(sequences=seqs, prompt_lengths=[len(p) for p in prompts],
                                stats=stats, prefill_time=prefill,
                                wall_time=time.perf_counter() - t_start)

