"""The text domain's front door: :class:`SpeculativeGenerator` (exact, batched speculative decoding for
transformers causal LMs). It checks its arguments, picks the target's model runtime (``models/``) and
the draft (``drafts/factory.py``), and hands each call to one of the four ways to run a request
(``generation.py``); it names no draft class and no runtime class.

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

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from speculate.verify import RULES

from .drafts.base import Draft
from .drafts.factory import make_draft
from .generation import run_chunked, run_plain, run_sharded, run_streamed
from .models.encoder_decoder import check_seq2seq
from .models.facts import check_vocabularies, is_encoder_decoder, model_vocab_size, reads_encoder
from .models.lean_llama import static_target
from .models.lean_seq2seq import lean_seq2seq
from .models.limits import ModelLimits
from .models.pick import check_materialised, pick_runtime, unwrapped
from .models.runtime import ModelRuntime
from .request.inputs import is_int, pad_id, prompt_ids
from .request.output import GenerationOutput
from .request.settings import Settings, resolve, setting_kwargs, without_token_types
from .request.streaming import StreamEvent

__all__ = ["GenerationOutput", "SpeculativeGenerator", "check_vocabularies"]


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
        if verify_on_device not in (None, True, False):
            raise ValueError(f"verify_on_device must be None, True or False, got {verify_on_device!r}")
        if cuda_graphs not in (True, False):
            raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
        self.seq2seq = reads_encoder(target)
        if self.seq2seq and not is_encoder_decoder(target):
            raise ValueError(
                f"{type(target).__name__} is a decoder that reads another model's encoder output; it "
                "cannot be the target on its own: use it as the draft of its encoder-decoder")
        if self.seq2seq:
            check_seq2seq(target, "target")
        self.target = target
        # the draft (drafts/factory.py: every kind, the generator names none)
        self.draft: Draft = make_draft(draft, target, tree=tree, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
        # the target's runtime: the position-indexed cache, or transformers' own cache when its probe refuses the model
        self._target_lm: ModelRuntime = lean_seq2seq(target) if self.seq2seq else pick_runtime(target, "target")
        if self.draft.spec is not None:  # token trees: the target scores every node in one forward
            why = self._target_lm.tree_refusal()
            if why is not None:
                raise ValueError(f"tree={tree!r}: {why}")
        limit = self.draft.lookahead_limit()
        if limit is not None:
            n, why = limit
            if lookahead is not None and lookahead != "auto" and int(lookahead) > n:
                raise ValueError(f"lookahead={lookahead} but {why}; pass lookahead <= {n}")
            max_lookahead = min(int(max_lookahead), n)
        lookahead = self.draft.default_lookahead() if lookahead is None else lookahead
        self.lookahead = lookahead if lookahead == "auto" else int(lookahead)
        self.verify = verify
        self.cost_ratio = cost_ratio
        self.max_lookahead = max(int(max_lookahead), self.lookahead if self.lookahead != "auto" else 1)
        self.vocab = model_vocab_size(target)
        self.tokenizer = tokenizer
        self.verify_on_device = verify_on_device
        self.limits = ModelLimits()  # the length and memory checks of each request
        self.static_models: tuple[str, ...] = self._use_static() if cuda_graphs else ()

    def _use_static(self) -> tuple[str, ...]:
        """Switch the Llama-architecture models to static steps; the roles that run them."""
        roles = ["draft"] if self.draft.use_static() else []
        if not self.seq2seq and self.draft.static_target:
            target_lm = static_target(self.target)
            if target_lm is not None:
                self._target_lm = target_lm
                roles.insert(0, "target")
        return tuple(roles)

    def models(self) -> list[tuple[Any, str]]:
        """The models this generator runs, with their role: the target, and the draft's if any."""
        return [(self.target, "target"), *self.draft.models()]

    def _settings(self, generation_config: Any, logits_processor: Any, settings: dict[str, Any],
                  **named: Any) -> Settings:
        return resolve(generation_config, logits_processor=logits_processor,
                       model_config=getattr(self.target, "generation_config", None), **named,
                       **setting_kwargs(settings, self.target))

    @torch.inference_mode()
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
        (:class:`~speculate.domains.text.models.kv_cache.CacheMemoryError`) KV caches larger than the
        available memory. An exception during the rounds propagates with a note naming the phase,
        round and rows; the caches are released either way.

        Encoder-decoder targets: ``input_ids`` (with ``attention_mask``) are the encoder's input for
        text encoders, ``input_features`` ``[B, n_mels, frames]`` for speech encoders (Whisper); the
        encoder runs once per row. ``decoder_input_ids`` (optional, with
        ``decoder_attention_mask``; ragged lists allowed; one row is used for every row): each
        row's decoder prompt (e.g. Whisper's language and task tokens), by default the decoder start
        token. ``sequences`` then holds each row's decoder tokens, prompt first.

        Generation settings (keyword arguments win over ``generation_config``, a transformers
        ``GenerationConfig``; see :mod:`~speculate.domains.text.request.settings`): ``max_new_tokens``
        (default 128), ``temperature`` (default 1; 0 or ``do_sample=False``: greedy), ``top_k``,
        ``top_p``, ``min_p``, ``typical_p``, ``repetition_penalty``, ``no_repeat_ngram_size``,
        ``bad_words_ids``, ``min_new_tokens``, ``stop_strings`` (with a tokenizer),
        ``num_return_sequences`` (each prompt repeated, rows independent, prompt-major order) and
        ``logits_processor`` (transformers ``LogitsProcessor`` objects or callables
        ``(input_ids, scores) -> scores`` whose output depends only on the prefix and the scores:
        see :mod:`~speculate.domains.text.request.processors`). Text in: a string, a list of strings, or
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
        each shard: see ``speculate.domains.text.generate_sharded`` to build it once per worker).
        """
        settings = without_token_types(settings, self.target)
        if executor is not None or shards is not None:  # one random stream per prompt (speculate.distributed)
            if self.seq2seq:
                raise ValueError("executor= / shards= (speculate.distributed) take decoder-only targets; "
                                 f"{type(self.target).__name__} is an encoder-decoder")
            extra = [n for n, v in (("generation_config", generation_config), ("logits_processor", logits_processor),
                                    ("streamer", streamer), ("batch_size", batch_size),
                                    ("output_logprobs", output_logprobs or None)) if v is not None]
            if extra or settings:
                raise ValueError(f"executor= / shards= take only temperature, top_k, top_p and eos_token_id; "
                                 f"drop {', '.join([*extra, *settings])}")
            pad = pad_id(self.target, self.tokenizer)
            rows = [p.tolist() for p in prompt_ids(input_ids, attention_mask, self.vocab, self.tokenizer, pad)]
            return run_sharded(self, rows, executor=executor, shards=shards, rows_per_stream=rows_per_stream,
                               rng=rng, max_new_tokens=128 if max_new_tokens is None else max_new_tokens,
                               temperature=1.0 if temperature is None else temperature, top_k=top_k,
                               top_p=top_p, eos_token_id=eos_token_id)
        s = self._settings(generation_config, logits_processor, settings, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id)
        request = dict(input_ids=input_ids, attention_mask=attention_mask, input_features=input_features,
                       decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)
        if output_logprobs not in (True, False):
            raise ValueError(f"output_logprobs must be True or False, got {output_logprobs!r}")
        if batch_size is not None:
            return run_chunked(self, request, s, rng, streamer, batch_size, progress, output_logprobs)
        return run_plain(self, s, rng, request, streamer, output_logprobs)

    def stream(self, input_ids: Any = None, attention_mask: Any = None, max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
               eos_token_id: int | Sequence[int] | None = None, rng: int | np.random.Generator | None = 0,
               *, input_features: Any = None, decoder_input_ids: Any = None, decoder_attention_mask: Any = None,
               generation_config: Any = None, logits_processor: Sequence[Any] | None = None,
               streamer: Any = None, **settings: Any) -> Iterator[StreamEvent]:
        """:meth:`generate` as a stream: after every round, a
        :class:`~speculate.domains.text.request.streaming.StreamEvent` with each row's newly committed
        tokens (and their text, with a tokenizer; a character split across tokens is shown once
        complete). The arguments are :meth:`generate`'s but ``executor``, ``shards``,
        ``rows_per_stream``, ``batch_size`` and ``progress`` (a stream is one batch, in this process);
        they are checked at this call, the work starts at the first ``next()``. Stopping early
        (``break``, ``close()``) releases the caches.

        >>> for event in gen.stream("def fib(n):", max_new_tokens=32):      # doctest: +SKIP
        ...     print(event.texts[0], end="", flush=True)
        """
        s = self._settings(generation_config, logits_processor, settings, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id)
        request = dict(input_ids=input_ids, attention_mask=attention_mask, input_features=input_features,
                       decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)
        return run_streamed(self, s, rng, request, streamer)
