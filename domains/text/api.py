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
from .encoder_decoder import (
    CachedSeq2Seq,
    check_seq2seq,
    decoder_length_limit,
    encode,
    is_encoder_decoder,
    reads_encoder,
    seq2seq_cache_bytes,
)
from .inputs import EncoderInputs, decoder_prompts, encoder_inputs, eos_ids, ids_of, is_int, prompt_ids
from .kv_cache import (
    CachedModel,
    CacheMemoryError,
    available_memory,
    cache_bytes_by_device,
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

    ``sequences[r]``: prompt tokens of row ``r`` (padding removed) followed by its new tokens; for
    an encoder-decoder target, its decoder tokens (decoder start / ``decoder_input_ids``, then the
    new tokens).
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
        a, b = ids_of(getattr(tc, name, None)), ids_of(getattr(dc, name, None))
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

    Encoder-decoder targets (``AutoModelForSeq2SeqLM``: T5, BART, mBART, Marian, ...; Whisper) take
    as ``draft`` another encoder-decoder with the same vocabulary, a decoder that reads the target's
    encoder output (``WhisperForCausalLM``, distil-whisper style), ``"ngram"`` (over the decoder
    tokens, then the source ids) or ``"early-exit:N"`` (the first ``N`` decoder layers); see
    :meth:`generate` for their inputs.
    """

    def __init__(self, target: Any, draft: Any, lookahead: int | str = 4, verify: str = "block",
                 *, cost_ratio: float | None = None, tokenizer: Any = None,
                 draft_tokenizer: Any = None, max_lookahead: int = 16) -> None:
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target must be a transformers causal LM, got {type(target).__name__}")
        if not isinstance(verify, str) or verify not in RULES:
            raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
        if lookahead != "auto" and (not is_int(lookahead) or lookahead < 0):
            raise ValueError(f"lookahead must be an int >= 0 or 'auto', got {lookahead!r}")
        if not is_int(max_lookahead) or max_lookahead < 1:
            raise ValueError(f"max_lookahead must be an int >= 1, got {max_lookahead!r}")
        if cost_ratio is not None and (
                isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float, np.number))
                or not 0.0 <= cost_ratio < float("inf")):
            raise ValueError(f"cost_ratio must be finite and >= 0, got {cost_ratio!r}")
        self.seq2seq = reads_encoder(target)
        if self.seq2seq and not is_encoder_decoder(target):
            raise ValueError(
                f"{type(target).__name__} is a decoder that reads another model's encoder output; it "
                "cannot be the target on its own: use it as the draft of its encoder-decoder")
        if self.seq2seq:
            check_seq2seq(target, "target")
        else:
            check_model(target, "target")
        if isinstance(draft, torch.nn.Module):
            check_vocabularies(target, draft, tokenizer, draft_tokenizer)
        self.target = target
        self._target_lm: CachedModel | CachedSeq2Seq = (
            CachedSeq2Seq(target) if self.seq2seq else CachedModel(target))
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
            limits = decoder_length_limit(model) if reads_encoder(model) else length_limits(model)
            for limit, why in limits:
                if total > limit:
                    fix = (f"Lower max_new_tokens to {limit - L} or shorten the prompt" if limit > L
                           else f"Shorten the prompt to at most {limit - 1} tokens")
                    raise ValueError(
                        f"row {r}: its prompt ({L} tokens) plus max_new_tokens={n_new} makes {total} "
                        f"tokens, more than the {role} ({type(model).__name__}) can decode: it has "
                        f"{why}. {fix} (generate the longer rows separately)")

    def _check_memory(self, n_rows: int, capacity: int, spare: int, source: int = 0) -> None:
        """Refuse, before anything is allocated, a batch whose KV caches (and token buffer) need
        more memory than the device they go to has available (:func:`available_memory`).
        ``source``: encoder positions per row (encoder-decoders: their cross-attention caches)."""
        need: dict[torch.device, list[tuple[str, int]]] = {}
        for model, role in self._models():
            if reads_encoder(model):
                b = seq2seq_cache_bytes(model, n_rows, capacity + spare, source)
                per = {} if b is None else {next(model.parameters()).device: b}
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
            fix = (f"Generate at most about {fit} rows per call, or fewer new tokens "
                   "(max_new_tokens)" if fit >= 1 else
                   "Not even one row fits: lower max_new_tokens")
            raise CacheMemoryError(
                f"not enough memory on {dev} for this call: {n_rows} rows of up to {capacity} "
                f"tokens need {total / gib:.3g} GiB ({detail}) but {avail[0] / gib:.3g} GiB is "
                f"available ({avail[1]}). {fix}")

    def _source_length(self, enc: EncoderInputs) -> int:
        """Encoder positions per row (what the cross-attention caches hold)."""
        if "input_ids" in enc.tensors:
            return int(enc.tensors["input_ids"].shape[1])
        src = getattr(self.target.config, "max_source_positions", None)  # speech: after the convolutions
        return int(src) if isinstance(src, int) else int(enc.tensors["input_features"].shape[-1])

    def _encoders(self, enc: EncoderInputs) -> Any:
        """The process's encode step: the target's encoder once per row, its output handed to the
        target's cache and to the draft (which may run its own encoder on ``enc``)."""
        lm = self._target_lm

        def run_encoders() -> None:
            state = encode(self.target, enc.tensors)
            lm.encoder = state  # type: ignore[union-attr]
            hook = getattr(self.draft, "encode", None)
            if hook is not None:
                hook(enc, state)

        return run_encoders

    @torch.inference_mode()
    def generate(
        self,
        input_ids: Any = None,
        attention_mask: Any = None,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        rng: int | np.random.Generator | None = 0,
        executor: Any = None,
        shards: int | None = None,
        rows_per_stream: int = 1,
        *,
        input_features: Any = None,
        decoder_input_ids: Any = None,
        decoder_attention_mask: Any = None,
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

        Encoder-decoder targets: ``input_ids`` (with ``attention_mask``) are the encoder's input for
        text encoders, ``input_features`` ``[B, n_mels, frames]`` for speech encoders (Whisper); the
        encoder runs once per row. ``decoder_input_ids`` (optional, with
        ``decoder_attention_mask``; ragged lists allowed; one row is used for every row): each
        row's decoder prompt (e.g. Whisper's language and task tokens), by default the decoder start
        token. ``sequences`` then holds each row's decoder tokens, prompt first.

        ``executor`` / ``shards`` (either one): the seed-stable sharded run of
        :mod:`speculate.distributed` (one random stream per prompt; this generator is pickled with
        each shard: see ``speculate.distributed.generate_sharded`` to build it once per worker).
        """
        if (executor is not None or shards is not None) and self.seq2seq:
            raise ValueError("executor= / shards= (speculate.distributed) take decoder-only targets; "
                             f"{type(self.target).__name__} is an encoder-decoder")
        if executor is not None or shards is not None:  # hook: speculate.distributed
            from speculate.distributed.runners import generate_sharded

            rows = [p.tolist() for p in prompt_ids(input_ids, attention_mask, self.vocab, self.tokenizer)]
            return generate_sharded(self, rows, executor=executor, shards=shards, rows_per_stream=rows_per_stream,
                                    rng=rng, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                    top_p=top_p, eos_token_id=eos_token_id)
        t_start = time.perf_counter()
        cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        if not is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        verify = "greedy" if cfg.greedy else self.verify
        if verify == "greedy" and not cfg.greedy:
            raise ValueError("verify='greedy' is exact only for temperature=0; use 'token' or 'block'")
        rng = as_rng(rng)
        for model, role in self._models():  # .train() may have been called since __init__
            check_eval_mode(model, role)
        enc: EncoderInputs | None = None
        if self.seq2seq:
            enc = encoder_inputs(self.target, input_ids, attention_mask, input_features, self.tokenizer)
            prompts = decoder_prompts(self.target, decoder_input_ids, decoder_attention_mask, enc.rows,
                                      self.vocab)
        else:
            extra = [k for k, v in (("input_features", input_features), ("decoder_input_ids", decoder_input_ids),
                                    ("decoder_attention_mask", decoder_attention_mask)) if v is not None]
            if extra:
                raise ValueError(f"{type(self.target).__name__} is a decoder-only LM: {', '.join(extra)} "
                                 "belong to encoder-decoder targets; pass the prompt as input_ids")
            prompts = prompt_ids(input_ids, attention_mask, self.vocab, self.tokenizer)
        if eos_token_id is None:
            gc = getattr(self.target, "generation_config", None)
            eos = eos_ids(getattr(gc, "eos_token_id", None), self.vocab,
                           "the target's generation_config.eos_token_id")
        else:
            eos = eos_ids(eos_token_id, self.vocab, "eos_token_id")
        n_new = int(max_new_tokens)
        # cache slots past the longest row: the padded columns of ragged blocks (a row that
        # needs fewer drafts than the block is wide) and the scoring block's own column
        k_max = self.lookahead if isinstance(self.lookahead, int) else self.max_lookahead
        spare = min(k_max, n_new) + 2
        if n_new > 0:
            self._check_lengths(prompts, n_new)
            source = 0 if enc is None else self._source_length(enc)
            self._check_memory(len(prompts), max(len(p) for p in prompts) + n_new, spare, source)
        tokens = TokenBuffer.from_prompts(prompts, extra=n_new)  # the loop gives no row more
        process = TextProcess(target=self._target_lm, draft=self.draft, tokens=tokens, cfg=cfg,
                              eos=eos, vocab=self.vocab,
                              encode=None if enc is None else self._encoders(enc))
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

