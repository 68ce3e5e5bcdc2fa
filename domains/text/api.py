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

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch

from speculate.rng import as_rng
from speculate.rounds import Round, rounds
from speculate.stats import Stats
from speculate.verify import RULES

from .drafts import ModelDraft, NgramDraft, make_draft
from .feature_draft import FeatureDraft
from .head_drafts import EagleDraft, MedusaDraft
from .heads import MedusaHeads
from .inputs import EncoderInputs, decoder_prompts, encoder_inputs, eos_ids, ids_of, is_int, prompt_ids
from .process import TextProcess, TokenBuffer
from .processors import Transforms
from .progress import progress_bar
from .runtime.encoder_decoder import (
    CachedSeq2Seq,
    check_seq2seq,
    decoder_length_limit,
    encode,
    is_encoder_decoder,
    reads_encoder,
    seq2seq_cache_bytes,
)
from .runtime.kv_cache import (
    CachedModel,
    CacheMemoryError,
    available_memory,
    cache_bytes_by_device,
    check_eval_mode,
    execution_device,
    length_limits,
    model_vocab_size,
)
from .runtime.lean_llama import LeanLlama, static_target
from .runtime.lean_seq2seq import LeanSeq2Seq, lean_seq2seq
from .runtime.pick import check_materialised, pick_runtime, unwrapped
from .runtime.transformers_api import forward_params
from .runtime.transformers_cache import TransformersCacheModel
from .settings import Settings, resolve
from .streaming import StreamEvent, stream_events, streamer_feed
from .strings import StopStrings, decode

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
    and cost; default 4, or with ``tree=`` the tree's depth, and for Medusa heads at most their
    number). ``verify``: ``"block"`` (Sun et al. 2024, never fewer tokens than token-wise in
    expectation), ``"token"`` (Leviathan et al.) or ``"greedy"``; temperature 0 always uses
    ``"greedy"``. ``cost_ratio``: with ``lookahead="auto"``, a fixed cost of a draft step relative
    to a target call instead of the measured one, so that the lookahead chosen each round (hence
    the tokens) depends on the seed alone and seeded runs are reproducible (see
    :func:`speculate.rounds.run`). ``tokenizer``, ``draft_tokenizer``: compared token by token
    with a draft model; with ``tokenizer``, :meth:`generate` also takes text. Models must be in
    eval mode (``.eval()``). ``verify_on_device``: draft and verify chains where the logits are
    (``speculate.verify.device``: no copy of the probabilities to the host, one transfer of counts
    per round); ``None`` (default) does so when the target is on a CUDA device; ``True`` forces it
    (on the CPU too: the same law, without the Numba kernels). ``cuda_graphs``: run Llama-architecture
    drafts, and a Llama target drafted by a model, ``"early-exit:N"`` or ``"ngram"``, in static
    steps over preallocated caches (``cuda_graphs.py``), recorded as CUDA graphs on a GPU and run
    eagerly on a CPU; :attr:`static_models` says which models do (a target whose static step fails
    the cache check keeps the general cache).

    Encoder-decoder targets (``AutoModelForSeq2SeqLM``: T5, BART, mBART, Marian, ...; Whisper) take
    as ``draft`` another encoder-decoder with the same vocabulary, a decoder that reads the target's
    encoder output (``WhisperForCausalLM``, distil-whisper style), ``"ngram"`` (over the decoder
    tokens, then the source ids) or ``"early-exit:N"`` (the first ``N`` decoder layers); see
    :meth:`generate` for their inputs.
    """

    def __init__(self, target: Any, draft: Any, lookahead: int | str | None = None, verify: str = "block",
                 *, cost_ratio: float | None = None, tokenizer: Any = None,
                 draft_tokenizer: Any = None, max_lookahead: int = 16, tree: Any = None,
                 verify_on_device: bool | None = None, cuda_graphs: bool = False) -> None:
        target = unwrapped(target, "target")  # a PeftModel's base model (adapters on), a compiled module's own
        if isinstance(draft, torch.nn.Module):
            draft = unwrapped(draft, "draft")
            check_materialised(draft, "draft")
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target must be a transformers causal LM, got {type(target).__name__}")
        check_materialised(target, "target")
        if not isinstance(verify, str) or verify not in RULES:
            raise ValueError(f"verify must be one of {RULES}, got {verify!r}")
        if lookahead is not None and lookahead != "auto" and (not is_int(lookahead) or lookahead < 0):
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
        on_target = isinstance(draft, (MedusaHeads, FeatureDraft))
        if isinstance(draft, torch.nn.Module) and not on_target:
            check_vocabularies(target, draft, tokenizer, draft_tokenizer)
        self.target = target
        # the position-indexed cache, or transformers' own cache when its probe refuses the model
        self._target_lm: CachedModel | CachedSeq2Seq | LeanSeq2Seq | LeanLlama | TransformersCacheModel = (
            lean_seq2seq(target) if self.seq2seq else pick_runtime(target, "target"))
        if on_target or tree is not None:
            self.draft = self._on_target_draft(draft, tree)
            spec = getattr(self.draft, "spec", None)
            if lookahead is None:  # a tree's depth; a Medusa chain has one token per head
                lookahead = spec.depth if spec is not None else (
                    min(4, draft.n_heads) if isinstance(self.draft, MedusaDraft) else 4)
            if isinstance(self.draft, MedusaDraft):  # a chain is at most one token per head
                if lookahead != "auto" and int(lookahead) > draft.n_heads:
                    raise ValueError(f"lookahead={lookahead} but the Medusa heads draft at most "
                                     f"{draft.n_heads} tokens (one per head); pass lookahead <= {draft.n_heads}")
                max_lookahead = min(int(max_lookahead), draft.n_heads)
        else:
            self.draft = make_draft(draft, target)
        lookahead = 4 if lookahead is None else lookahead
        self.lookahead = lookahead if lookahead == "auto" else int(lookahead)
        self.verify = verify
        self.cost_ratio = cost_ratio
        self.max_lookahead = max(int(max_lookahead), self.lookahead if self.lookahead != "auto" else 1)
        self.vocab = model_vocab_size(target)
        self.tokenizer = tokenizer
        if verify_on_device not in (None, True, False):
            raise ValueError(f"verify_on_device must be None, True or False, got {verify_on_device!r}")
        self.verify_on_device = verify_on_device
        if cuda_graphs not in (True, False):
            raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
        self.static_models: tuple[str, ...] = self._use_static() if cuda_graphs else ()

    def _use_static(self) -> tuple[str, ...]:
        """Switch the Llama-architecture models to static steps; the roles that run them."""
        roles = []
        lm = getattr(self.draft, "lm", None)
        if isinstance(lm, LeanLlama):
            lm.use_static()
            roles.append("draft")
        if not self.seq2seq and isinstance(self.draft, (ModelDraft, NgramDraft)):
            target_lm = static_target(self.target)
            if target_lm is not None:
                self._target_lm = target_lm
                roles.insert(0, "target")
        return tuple(roles)

    def _on_target_draft(self, draft: Any, tree: Any) -> MedusaDraft | EagleDraft:
        """The draft for Medusa heads or a feature draft (``tree``: chains, or a token tree)."""
        name = type(self.target).__name__
        if self.seq2seq:
            raise ValueError(f"{name} is an encoder-decoder: draft heads, feature drafts and token trees "
                             "are for decoder-only targets; pass a draft model, 'ngram' or 'early-exit:N'")
        if not isinstance(draft, (MedusaHeads, FeatureDraft)):
            raise ValueError(
                f"tree= needs a draft that proposes token trees: MedusaHeads or a FeatureDraft trained on "
                f"this target (domains.text.heads / feature_draft), got {type(draft).__name__}; draft models, "
                "'ngram' and 'early-exit:N' draft chains (tree=None)")
        if tree is not None:
            why = self._target_lm.tree_refusal()  # type: ignore[union-attr]
            if why is not None:
                raise ValueError(f"tree={tree!r}: {why}")
        if isinstance(draft, MedusaHeads):
            return MedusaDraft(draft, self.target, tree)
        return EagleDraft(draft, self.target, tree)

    def _models(self) -> list[tuple[Any, str]]:
        """The models this generator runs, with their role: the target, and a draft model if any."""
        out = [(self.target, "target")]
        if isinstance(self.draft, ModelDraft):
            out.append((self.draft.model, "draft"))
        return out

    def _structure(self, model: Any) -> tuple[bool, list[tuple[int, str]], int | None]:
        """Whether ``model`` reads an encoder, its length limits, and (if it reads one) the bytes of
        its caches per row and slot: read from its modules and config once per generator and dtype
        (walking the modules on every request shows on small models)."""
        seen = self.__dict__.setdefault("_structures", {})
        key = (id(model), next(model.parameters()).dtype)
        if key not in seen:
            reads = reads_encoder(model)
            seen[key] = (reads, decoder_length_limit(model) if reads else length_limits(model),
                         seq2seq_cache_bytes(model, 1, 1, 0) if reads else None)
        return seen[key]

    def _check_lengths(self, prompts: list[np.ndarray], n_new: int) -> None:
        """Refuse, before any work, sequences longer than a model can decode (learned positions,
        sliding window)."""
        lens = np.array([len(p) for p in prompts])
        r = int(np.argmax(lens))
        L = int(lens[r])
        total = L + n_new
        for model, role in self._models():
            for limit, why in self._structure(model)[1]:
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
            reads, _, unit = self._structure(model)
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
        max_new_tokens: int | None = None,
        temperature: float | None = None,
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
        generation_config: Any = None,
        logits_processor: Sequence[Any] | None = None,
        streamer: Any = None,
        batch_size: int | None = None,
        progress: bool | None = None,
        output_logprobs: bool = False,
        **settings: Any,
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
        (:class:`~speculate.domains.text.runtime.kv_cache.CacheMemoryError`) KV caches larger than the
        available memory. An exception during the rounds propagates with a note naming the phase,
        round and rows; the caches are released either way.

        Encoder-decoder targets: ``input_ids`` (with ``attention_mask``) are the encoder's input for
        text encoders, ``input_features`` ``[B, n_mels, frames]`` for speech encoders (Whisper); the
        encoder runs once per row. ``decoder_input_ids`` (optional, with
        ``decoder_attention_mask``; ragged lists allowed; one row is used for every row): each
        row's decoder prompt (e.g. Whisper's language and task tokens), by default the decoder start
        token. ``sequences`` then holds each row's decoder tokens, prompt first.

        Generation settings (keyword arguments win over ``generation_config``, a transformers
        ``GenerationConfig``; see :mod:`~speculate.domains.text.settings`): ``max_new_tokens``
        (default 128), ``temperature`` (default 1; 0 or ``do_sample=False``: greedy), ``top_k``,
        ``top_p``, ``min_p``, ``typical_p``, ``repetition_penalty``, ``no_repeat_ngram_size``,
        ``bad_words_ids``, ``min_new_tokens``, ``stop_strings`` (with a tokenizer),
        ``num_return_sequences`` (each prompt repeated, rows independent, prompt-major order) and
        ``logits_processor`` (transformers ``LogitsProcessor`` objects or callables
        ``(input_ids, scores) -> scores`` whose output depends only on the prefix and the scores:
        see :mod:`~speculate.domains.text.processors`). Text in: a string, a list of strings, or
        chat messages (a list of ``{"role", "content"}`` dicts, or a list of conversations) through
        the tokenizer's chat template; ``out.texts`` decodes the new tokens.

        ``streamer``: a transformers streamer (``TextStreamer``, ``TextIteratorStreamer``; one
        row): it receives the prompt, then each round's tokens, then ``end()``. ``batch_size``: run
        the prompts in chunks of that many rows (a progress bar on a terminal when tqdm is
        installed; ``progress`` True / False forces it on / off). :meth:`stream` yields the tokens
        as they are accepted.

        ``output_logprobs=True``: ``out.logprobs``, each new token's log-probability under the law it
        was drawn from (the target's after every setting; known at verification, so free of extra
        forward passes).

        ``executor`` / ``shards`` (either one): the seed-stable sharded run of
        :mod:`speculate.distributed` (one random stream per prompt; this generator is pickled with
        each shard: see ``speculate.distributed.generate_sharded`` to build it once per worker).
        """
        settings = _without_token_types(settings, self.target)
        if executor is not None or shards is not None:  # hook: speculate.distributed
            if self.seq2seq:
                raise ValueError("executor= / shards= (speculate.distributed) take decoder-only targets; "
                                 f"{type(self.target).__name__} is an encoder-decoder")
            extra = [n for n, v in (("generation_config", generation_config), ("logits_processor", logits_processor),
                                    ("streamer", streamer), ("batch_size", batch_size),
                                    ("output_logprobs", output_logprobs or None)) if v is not None]
            if extra or settings:
                raise ValueError(f"executor= / shards= take only temperature, top_k, top_p and eos_token_id; "
                                 f"drop {', '.join([*extra, *settings])}")
            from speculate.distributed.runners import generate_sharded

            rows = [p.tolist() for p in
                    prompt_ids(input_ids, attention_mask, self.vocab, self.tokenizer, self._pad_id())]
            return generate_sharded(self, rows, executor=executor, shards=shards, rows_per_stream=rows_per_stream,
                                    rng=rng, max_new_tokens=128 if max_new_tokens is None else max_new_tokens,
                                    temperature=1.0 if temperature is None else temperature, top_k=top_k,
                                    top_p=top_p, eos_token_id=eos_token_id)
        s = resolve(generation_config, logits_processor=logits_processor, max_new_tokens=max_new_tokens,
                    model_config=getattr(self.target, "generation_config", None),
                    temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
                    **_setting_kwargs(settings, self.target))
        request = dict(input_ids=input_ids, attention_mask=attention_mask, input_features=input_features,
                       decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)
        if output_logprobs not in (True, False):
            raise ValueError(f"output_logprobs must be True or False, got {output_logprobs!r}")
        if batch_size is not None:
            return self._generate_chunks(request, s, rng, streamer, batch_size, progress, output_logprobs)
        req = self._prepare(s, as_rng(rng), **request, logprobs=output_logprobs)
        feed = streamer_feed(streamer, req.tokens, self.tokenizer) if streamer is not None else None
        try:
            for event in self._events(req):
                if feed is not None:
                    feed.round(event)
        finally:
            if feed is not None:
                feed.end()
        return self._output(req)

    def stream(self, input_ids: Any = None, attention_mask: Any = None, max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
               eos_token_id: int | Sequence[int] | None = None, rng: int | np.random.Generator | None = 0,
               *, input_features: Any = None, decoder_input_ids: Any = None, decoder_attention_mask: Any = None,
               generation_config: Any = None, logits_processor: Sequence[Any] | None = None,
               streamer: Any = None, **settings: Any) -> Iterator[StreamEvent]:
        """:meth:`generate` as a stream: after every round, a
        :class:`~speculate.domains.text.streaming.StreamEvent` with each row's newly committed
        tokens (and their text, with a tokenizer; a character split across tokens is shown once
        complete). The arguments are :meth:`generate`'s but ``executor``, ``shards``,
        ``rows_per_stream``, ``batch_size`` and ``progress`` (a stream is one batch, in this process);
        they are checked at this call, the work starts at the first ``next()``. Stopping early
        (``break``, ``close()``) releases the caches.

        >>> for event in gen.stream("def fib(n):", max_new_tokens=32):      # doctest: +SKIP
        ...     print(event.texts[0], end="", flush=True)
        """
        s = resolve(generation_config, logits_processor=logits_processor, max_new_tokens=max_new_tokens,
                    model_config=getattr(self.target, "generation_config", None),
                    temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
                    **_setting_kwargs(settings, self.target))
        req = self._prepare(s, as_rng(rng), input_ids=input_ids, attention_mask=attention_mask,
                            input_features=input_features, decoder_input_ids=decoder_input_ids,
                            decoder_attention_mask=decoder_attention_mask)
        feed = streamer_feed(streamer, req.tokens, self.tokenizer) if streamer is not None else None
        return stream_events(self._events(req), req.tokens, self.tokenizer, feed)

    def _generate_chunks(self, request: dict[str, Any], s: Settings, rng: Any, streamer: Any,
                         batch_size: int, progress: bool | None, logprobs: bool = False) -> GenerationOutput:
        """:meth:`generate` over chunks of ``batch_size`` prompts, one random stream for all."""
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if streamer is not None:
            raise ValueError("streamer= takes one row; it cannot be combined with batch_size=")
        if self.seq2seq or request["input_features"] is not None or request["decoder_input_ids"] is not None:
            raise ValueError("batch_size= takes decoder-only prompts; split encoder-decoder requests yourself")
        prompts = prompt_ids(request["input_ids"], request["attention_mask"], self.vocab, self.tokenizer,
                             self._pad_id())
        rng = as_rng(rng)
        t0 = time.perf_counter()
        outs = []
        with progress_bar(len(prompts), "generate", enabled=progress, unit="prompt") as bar:
            for i in range(0, len(prompts), batch_size):
                chunk = [p.tolist() for p in prompts[i : i + batch_size]]
                req = self._prepare(s, rng, input_ids=chunk, logprobs=logprobs)
                for _ in self._events(req):
                    pass
                outs.append(self._output(req))
                bar.update(len(chunk))
        return GenerationOutput(
            sequences=[q for o in outs for q in o.sequences],
            prompt_lengths=[n for o in outs for n in o.prompt_lengths],
            stats=Stats.merge([o.stats for o in outs]), prefill_time=sum(o.prefill_time for o in outs),
            wall_time=time.perf_counter() - t0, tokenizer=self.tokenizer,
            logprobs=[x for o in outs for x in o.logprobs] if logprobs else None)

    def _pad_id(self) -> int | None:
        """The pad id to infer a missing ``attention_mask`` from (transformers' rule): the target's
        ``generation_config.pad_token_id``, else the tokenizer's; None when unknown or also an EOS id."""
        gc = getattr(self.target, "generation_config", None)
        pad = getattr(gc, "pad_token_id", None)
        if pad is None and self.tokenizer is not None:
            pad = getattr(self.tokenizer, "pad_token_id", None)
        if isinstance(pad, (list, tuple)):
            pad = pad[0] if pad else None
        if pad is None:
            return None
        eos = getattr(gc, "eos_token_id", None)
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return None if int(pad) in eos else int(pad)

    def _prepare(self, s: Settings, rng: np.random.Generator, *, input_ids: Any = None, attention_mask: Any = None,
                 input_features: Any = None, decoder_input_ids: Any = None,
                 decoder_attention_mask: Any = None, logprobs: bool = False) -> _Request:
        """Check a request and build its process (nothing allocated yet)."""
        t_start = time.perf_counter()
        cfg = s.sampling
        trees = getattr(self.draft, "spec", None) is not None
        # token trees: recursive rejection (the block rule has no tree form)
        verify = "greedy" if cfg.greedy else ("token" if trees else self.verify)
        if verify == "greedy" and not cfg.greedy:
            raise ValueError("verify='greedy' is exact only for temperature=0; use 'token' or 'block'")
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
            prompts = prompt_ids(input_ids, attention_mask, self.vocab, self.tokenizer, self._pad_id())
        n_ret = s.num_return_sequences
        if n_ret > 1:  # each prompt repeated: independent rows, prompt-major
            prompts = [p for p in prompts for _ in range(n_ret)]
            if enc is not None:
                enc = EncoderInputs({k: v.repeat_interleave(n_ret, 0) for k, v in enc.tensors.items()},
                                    None if enc.ids is None else [r for r in enc.ids for _ in range(n_ret)],
                                    enc.rows * n_ret)
        if s.eos_token_id is None:
            gc = getattr(self.target, "generation_config", None)
            eos = eos_ids(getattr(gc, "eos_token_id", None), self.vocab,
                          "the target's generation_config.eos_token_id")
        else:
            eos = eos_ids(s.eos_token_id, self.vocab, "eos_token_id")
        n_new = s.max_new_tokens
        # cache slots past the longest row: the padded columns of ragged blocks (a row that
        # needs fewer drafts than the block is wide) and the scoring block's own column
        k_max = self.lookahead if isinstance(self.lookahead, int) else self.max_lookahead
        spare = min(k_max, n_new) + 2
        if trees:  # a tree's nodes sit past the committed tokens while it is scored
            spare = max(spare, self.draft.spec.n_nodes + 2)
        if n_new > 0:
            self._check_lengths(prompts, n_new)
            source = 0 if enc is None else self._source_length(enc)
            self._check_memory(len(prompts), max(len(p) for p in prompts) + n_new, spare, source)
        tokens = TokenBuffer.from_prompts(prompts, extra=n_new)  # the loop gives no row more
        transforms = Transforms(cfg, s.before, s.user, s.min_new_tokens, eos)
        stop = StopStrings(self.tokenizer, s.stop_strings).hook(tokens) if s.stop_strings else None
        on_device = (self.verify_on_device if self.verify_on_device is not None
                     else execution_device(self.target).type == "cuda")
        process = TextProcess(target=self._target_lm, draft=self.draft, tokens=tokens, cfg=transforms,
                              eos=eos, vocab=self.vocab, stop=stop, on_device=on_device,
                              encode=None if enc is None else self._encoders(enc), want_logprobs=logprobs)
        return _Request(process, tokens, [len(p) for p in prompts], n_new, verify, rng, spare, Stats(), t_start)

    def _events(self, req: _Request) -> Iterator[Round]:
        """The rounds of ``req`` (a generator): caches filled at the first ``next()``, released when
        the rounds end, raise, or the caller stops early."""
        if req.n_new <= 0:
            return
        self._enter()
        try:
            req.process.start(spare=req.spare)
            yield from rounds(req.process, len(req.prompt_lengths), req.n_new, lookahead=self.lookahead,
                              verify=req.verify, rng=req.rng, max_lookahead=self.max_lookahead,
                              cost_ratio=self.cost_ratio, stats=req.stats)
        finally:
            try:
                req.process.release()
            finally:
                self._running = False

    def _enter(self) -> None:
        """Mark this generator running, or raise before touching its caches: one generator holds one
        set of model caches, so a second run (``generate`` inside its own ``stream`` loop, or another
        thread) would overwrite the first's."""
        with _RUNNING_LOCK:
            if self.__dict__.get("_running", False):
                raise RuntimeError(
                    "this SpeculativeGenerator is already running (a generate or stream call that has not "
                    "finished: a stream being iterated, or another thread); it holds one set of model caches, "
                    "so runs cannot overlap: finish or close() the stream first, or make one generator per "
                    "thread (they can share the models)")
            self._running = True

    def _output(self, req: _Request) -> GenerationOutput:
        t = req.tokens
        seqs = [t.ids[r, : t.n[r]].tolist() for r in range(len(req.prompt_lengths))]
        lp = None
        if req.process.want_logprobs:
            got = req.process.logprobs
            lp = [[] if got is None else got[r, p : t.n[r]].astype(float).tolist()
                  for r, p in enumerate(req.prompt_lengths)]
        return GenerationOutput(sequences=seqs, prompt_lengths=req.prompt_lengths, stats=req.stats,
                                prefill_time=req.process.prefill_time,
                                wall_time=time.perf_counter() - req.t_start, tokenizer=self.tokenizer,
                                logprobs=lp)


#: makes the running check and set of :meth:`SpeculativeGenerator._enter` one step across threads
_RUNNING_LOCK = threading.Lock()


class _Request(NamedTuple):
    process: TextProcess
    tokens: TokenBuffer
    prompt_lengths: list[int]
    n_new: int
    verify: str
    rng: np.random.Generator
    spare: int
    stats: Stats
    t_start: float


_SETTINGS = ("do_sample", "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
             "min_new_tokens", "stop_strings", "num_return_sequences")


def _without_token_types(given: dict[str, Any], model: Any) -> dict[str, Any]:
    """``given`` without ``token_type_ids`` (in ``**tokenizer(...)``: harmless for a model whose forward
    does not read them; refused for one that does, since they change its logits and are not passed)."""
    if "token_type_ids" not in given:
        return given
    if "token_type_ids" in forward_params(model):
        raise ValueError(f"{type(model).__name__} reads token_type_ids (they change its logits), which "
                         "speculative decoding does not pass to it; tokenize without them "
                         "(return_token_type_ids=False)")
    return {k: v for k, v in given.items() if k != "token_type_ids"}


def _setting_kwargs(given: dict[str, Any], model: Any) -> dict[str, Any]:
    given = _without_token_types(given, model)
    bad = [k for k in given if k not in _SETTINGS]
    if bad:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, bad))}; generation settings "
                        f"are: {', '.join(_SETTINGS)} (and generation_config=, logits_processor=)")
    return given
