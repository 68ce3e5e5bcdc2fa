"""Our decoding inside transformers' own ``generate()``: ``custom_generate=speculate_decoding``.

transformers (5.x) accepts a callable ``custom_generate``: ``generate()`` prepares the inputs
(left-padded ``input_ids``, ``attention_mask``), the generation config, the logits processors
(its built-in ones, the caller's ``logits_processor``, then the warpers when ``do_sample``) and the
stopping criteria, puts the prompt into the ``streamer``, and then calls
``custom_generate(model, input_ids, logits_processor=..., stopping_criteria=...,
generation_config=..., **model_kwargs)`` for the decoding loop. It passes neither
``assistant_model`` nor ``streamer`` to the callable, so :func:`speculate_decoding` reads them from
the ``generate()`` call that invoked it.

>>> out = model.generate(**batch, assistant_model=draft, custom_generate=speculate_decoding,
...                      do_sample=True, top_p=0.9, max_new_tokens=128)        # doctest: +SKIP

runs the exact batched decoding of :class:`~speculate.domains.text.SpeculativeGenerator` (batch
> 1, block verification, automatic lookahead) and returns what ``generate()`` returns: the
``[B, W + G]`` tensor of the (left-padded) prompts and the new tokens, rows that ended early padded
with ``pad_token_id``; with ``return_dict_in_generate=True`` a ``GenerateDecoderOnlyOutput``
(``sequences`` only). Extra keyword arguments of ``generate()`` read here: ``draft=`` (instead of
``assistant_model``: a model, ``"ngram"`` or ``"early-exit:N"``; default ``"ngram"``),
``lookahead=`` (default 4), ``cost_ratio=`` (the draft's cost per step relative to the target's,
for ``lookahead="auto"``), ``verify=`` (default ``"block"``) and ``rng=`` (a seed; default: drawn
from torch's generator). What repeats: with the same seed (``rng=``, or ``torch.manual_seed``
before the call) and a fixed ``lookahead`` or ``lookahead="auto"`` with ``cost_ratio=``, the same
tokens; ``lookahead="auto"`` without ``cost_ratio`` picks each round's lookahead from measured
timings, so its tokens follow the same law but differ from run to run.

Beam search (``num_beams > 1``) is not sampling from the model's law and is refused, as are
``output_scores`` / ``output_logits`` / attentions / hidden states, before any work.

The processors are applied per row to its unpadded prefix (:mod:`~speculate.domains.text.request.processors`):
prefix-free settings, the repetition penalty (which plain ``generate()`` also applies without the
padding) and greedy decoding give exactly plain ``generate()``'s law / tokens.
Stopping criteria (stop strings, user criteria) are evaluated on each row's unpadded sequence after
each token, with ``scores=None``.

Encoder-decoder models (T5, BART, mBART, Marian): ``generate()`` hands the decoding loop the
decoder prompts as ``input_ids`` and the encoder's input as ``inputs_tensor`` (with its
``attention_mask``); the generator runs the encoder once per row itself, and the result is the
decoder sequences (``[B, W + G]``; ``GenerateEncoderDecoderOutput`` with
``return_dict_in_generate=True``), as plain ``generate()`` returns them. Whisper's own
``generate()`` (timestamps, language detection, long-form) is not this path: use
:class:`~speculate.domains.text.SpeculativeGenerator` with ``input_features=``.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import numpy as np
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from .api import SpeculativeGenerator
from .generation import prepare, run_fed
from .request.sampling import SamplingConfig
from .request.settings import Settings
from .request.streaming import streamer_feed

__all__ = ["speculate_decoding"]

_WARPERS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
            "TypicalLogitsWarper"}
_GENERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _generator(model: Any, draft: Any, lookahead: Any, verify: str,
               cost_ratio: float | None = None) -> SpeculativeGenerator:
    """One generator per (model, draft, lookahead, verify, cost_ratio), kept while the model lives
    (the model checks run once)."""
    per = _GENERATORS.setdefault(model, {})
    key = (id(draft) if not isinstance(draft, str) else draft, lookahead, verify, cost_ratio)
    hit = per.get(key)
    if hit is not None and (hit[0] is draft or isinstance(draft, str)):
        return hit[1]
    gen = SpeculativeGenerator(model, draft, lookahead=lookahead, verify=verify, cost_ratio=cost_ratio)
    per[key] = (draft, gen)
    return gen


def _settings(gc: Any, processors: Any, width: int) -> Settings:
    """The settings of a prepared ``generate()`` call: warpers from the config, the other processors
    kept in order (``MinNewTokensLength`` / ``MinLength`` become ``min_new_tokens``)."""
    greedy = not gc.do_sample
    top_k = gc.top_k if gc.top_k not in (None, 0) else None
    cfg = SamplingConfig(temperature=0.0 if greedy else (gc.temperature if gc.temperature is not None else 1.0),
                         top_k=top_k, top_p=gc.top_p, min_p=gc.min_p,
                         typical_p=gc.typical_p if gc.typical_p is not None and gc.typical_p < 1.0 else None)
    before, min_new = [], 0
    for p in processors or []:
        name = type(p).__name__
        if name in _WARPERS:
            continue
        if name == "MinNewTokensLengthLogitsProcessor":
            min_new = max(min_new, int(p.min_new_tokens))
        elif name == "MinLengthLogitsProcessor":
            min_new = max(min_new, int(p.min_length) - width)
        elif name == "RepetitionPenaltyLogitsProcessor" and isinstance(p.prompt_ignore_length, torch.Tensor):
            before.append(RepetitionPenaltyLogitsProcessor(p.penalty))  # per-row padding: none in our prefixes
        else:
            before.append(p)
    eos = gc.eos_token_id
    return Settings(cfg, before, [], min_new, int(gc.max_length) - width, [] if eos is None else eos, [], 1)


def _criteria_hook(criteria: list, tokens: Any, device: torch.device) -> Any:
    """``TextProcess.stop`` from transformers stopping criteria, on each row's unpadded sequence."""

    def stop(rows: np.ndarray, start: np.ndarray, n_used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n_used = np.array(n_used, dtype=np.int64)
        hit = np.zeros(len(rows), bool)
        for i, r in enumerate(rows.tolist()):
            s = int(start[i])
            for p in range(s, s + int(n_used[i])):
                seq = torch.as_tensor(tokens.ids[r, : p + 1], device=device)[None]
                if any(bool(torch.as_tensor(c(seq, None)).reshape(-1)[0]) for c in criteria):
                    n_used[i], hit[i] = p - s + 1, True
                    break
        return n_used, hit

    return stop


class _AfterPrompt:
    """A streamer that already received the prompt from ``generate()``: drop our first ``put``."""

    def __init__(self, streamer: Any) -> None:
        self.streamer, self.first = streamer, True

    def put(self, value: torch.Tensor) -> None:
        if self.first:
            self.first = False
            return
        self.streamer.put(value)

    def end(self) -> None:
        self.streamer.end()


def _generate_locals(depth: int = 8) -> dict[str, Any]:
    """``assistant_model`` and ``streamer`` of the ``generate()`` call up the stack (transformers does
    not pass them to a callable ``custom_generate``)."""
    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                break
            loc = frame.f_locals
            if frame.f_code.co_name == "generate" and "assistant_model" in loc and "streamer" in loc:
                return {"assistant_model": loc["assistant_model"], "streamer": loc["streamer"]}
        return {}
    finally:
        del frame


@torch.no_grad()
def speculate_decoding(model: Any, input_ids: torch.Tensor, logits_processor: Any = None,
                       stopping_criteria: Any = None, generation_config: Any = None,
                       synced_gpus: bool = False, streamer: Any = None, *, draft: Any = None,
                       lookahead: int | str = 4, verify: str = "block", rng: int | None = None,
                       cost_ratio: float | None = None, json_schema: Any = None, regex: Any = None,
                       grammar: Any = None, grammar_tokenizer: Any = None,
                       inputs_tensor: Any = None, **model_kwargs: Any) -> Any:
    """The decoding loop of ``model.generate(..., custom_generate=speculate_decoding)`` (see the
    module docstring)."""
    seen = _generate_locals()
    draft = draft if draft is not None else seen.get("assistant_model")
    streamer = streamer if streamer is not None else seen.get("streamer")
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    if seq2seq and (inputs_tensor is None or inputs_tensor.is_floating_point()):
        raise NotImplementedError(
            f"speculate_decoding serves text encoder-decoders through generate(); for "
            f"{type(model).__name__} with speech features use speculate.domains.text.SpeculativeGenerator"
            "(target, draft).generate(input_features=...)")
    gc = generation_config
    beams = getattr(gc, "num_beams", 1) or 1
    if beams > 1:  # generate() has already repeated every row num_beams times
        raise ValueError(f"speculate_decoding samples (or decodes greedily) from the model's law; beam search "
                         f"(num_beams={beams}) is not that: drop num_beams, or call generate() without "
                         "custom_generate for beam search")
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(gc, flag, False):
            raise ValueError(f"speculate_decoding does not return {flag.removeprefix('output_')} "
                             f"({flag}=True); drop it (SpeculativeGenerator.generate(output_logprobs=True) "
                             "gives each new token's log-probability under the target's processed law)")
    gen = _generator(model, draft if draft is not None else "ngram", lookahead, verify, cost_ratio)
    B, W = input_ids.shape
    s = _settings(gc, logits_processor, W)
    s.constraint = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
                    if v is not None}
    if len(s.constraint) > 1:
        raise ValueError(f"give one of json_schema=, regex=, grammar=; got {', '.join(s.constraint)}")
    # transformers' generate() drops tokenizer= before a custom_generate callable sees it: the
    # constraint's tokenizer comes as grammar_tokenizer=
    tokenizer = grammar_tokenizer if grammar_tokenizer is not None else seen.get("tokenizer")
    if s.constraint and tokenizer is not None:
        gen.tokenizer = tokenizer  # the constraint spells text with it
    mask = model_kwargs.get("attention_mask")
    seed = int(rng) if rng is not None else int(torch.randint(0, 2**62, (1,)).item())
    if seq2seq:  # input_ids: the decoder prompts; the encoder reads inputs_tensor
        enc_mask = torch.ones_like(inputs_tensor) if mask is None else mask
        req = prepare(gen, s, np.random.default_rng(seed), input_ids=inputs_tensor, attention_mask=enc_mask,
                           decoder_input_ids=input_ids,
                           decoder_attention_mask=model_kwargs.get("decoder_attention_mask"))
    else:
        mask = torch.ones_like(input_ids) if mask is None else mask
        req = prepare(gen, s, np.random.default_rng(seed), input_ids=input_ids, attention_mask=mask)
    others = [c for c in (stopping_criteria or [])
              if type(c).__name__ not in ("MaxLengthCriteria", "EosTokenCriteria")]
    if any(type(c).__name__ == "MaxTimeCriteria" for c in others):
        raise ValueError("max_time is not supported by speculate_decoding")
    if others:
        req.process.stop = _criteria_hook(others, req.tokens, input_ids.device)
    out = run_fed(gen, req, streamer_feed(_AfterPrompt(streamer), req.tokens) if streamer is not None else None)
    new = out.new_tokens
    G = max((len(t) for t in new), default=0)
    pad = getattr(gc, "_pad_token_tensor", None)
    pad = int(pad.reshape(-1)[0]) if isinstance(pad, torch.Tensor) else gc.pad_token_id
    pad = pad if pad is not None else (int(req.process.eos[0]) if len(req.process.eos) else 0)
    tail = torch.full((B, G), int(pad), dtype=input_ids.dtype)
    for r, t in enumerate(new):
        tail[r, : len(t)] = torch.as_tensor(t, dtype=input_ids.dtype)
    sequences = torch.cat([input_ids, tail.to(input_ids.device)], dim=1)
    if getattr(gc, "return_dict_in_generate", False):
        from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

        return (GenerateEncoderDecoderOutput if seq2seq else GenerateDecoderOnlyOutput)(sequences=sequences)
    return sequences
