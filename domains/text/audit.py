"""Audit any text sampler against the exact law of its target: oracles and adapters for
:func:`speculate.testing.audit` (``speculate audit`` on the command line: ``audit_cli.py``).

- :func:`text_oracle`: the exact law of the first ``m`` new tokens of a prompt under a model's
  generation settings, by enumeration (:func:`~speculate.domains.text.continuation_law.continuation_law`:
  float64, uncached forwards) through the project's :class:`~speculate.domains.text.request.processors.Transforms`:
  temperature, top-k, top-p, min-p, typical-p, repetition penalty, no-repeat n-grams, bad words,
  ``min_new_tokens``, EOS and the length. ``semantics="transformers"`` reads the settings as
  ``model.generate(**kwargs)`` does (the model's ``generation_config``, then transformers' own
  defaults: greedy unless ``do_sample=True``, ``top_k=50`` unless set); ``"speculate"`` as
  :meth:`SpeculativeGenerator.generate` does. Settings the enumeration cannot reproduce
  (guidance, watermarks, beams, sequence bias, epsilon / eta cutoffs, stop strings, constraints, ...)
  are refused with a ``ValueError`` before anything is sampled: audit those with a reference
  sampler instead (two-sample mode).
- :func:`hf_sampler`: a sampler over ``model.generate(**kwargs)`` with ANY keyword arguments (plain,
  ``assistant_model=``, ``prompt_lookup_num_tokens=``, ``assistant_early_exit=``,
  ``tokenizer=`` / ``assistant_tokenizer=``, ...): batched where transformers allows it (assisted
  generation is batch 1), padding after EOS removed (tokens after an EOS that are not padding are
  kept, so a sampler that runs past EOS shows up as an impossible outcome).
- :func:`speculate_sampler`: a sampler over our :class:`SpeculativeGenerator`.
- :func:`audit_generate` / :func:`audit_speculate`: the oracle, the sampler and the audit in one call.

>>> from speculate.domains.text.conformance import tiny_llama
>>> model = tiny_llama(vocab=6)
>>> report = audit_generate(model, [1, 2, 3], tokens=2, do_sample=True, top_k=3, tv=0.2, progress=False)
>>> report.verdict, report.cells
('consistent', 9)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from speculate.testing.audit import DEFAULT_AUDIT_ALPHA, DEFAULT_POWER, DEFAULT_TV, AuditReport, audit

from .continuation_law import continuation_law
from .models.facts import model_vocab_size
from .request.inputs import eos_ids
from .request.processors import Transforms
from .request.sampling import SamplingConfig
from .request.settings import SETTING_NAMES, Settings, resolve

__all__ = ["SAMPLER_ONLY", "TextLaw", "audit_generate", "audit_speculate", "hf_sampler", "speculate_sampler",
           "text_oracle"]

#: ``generate`` keyword arguments that choose HOW to sample, not the law: the oracle ignores them (the
#: audit's question is whether the sampler they choose keeps the target's law)
SAMPLER_ONLY = frozenset({
    "assistant_model", "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight", "tokenizer", "assistant_tokenizer",
    "pad_token_id", "bos_token_id", "use_cache", "cache_implementation", "return_dict_in_generate",
    "output_scores", "output_logits", "output_attentions", "output_hidden_states", "streamer", "synced_gpus",
    "custom_generate", "trust_remote_code", "disable_compile", "compile_config",
})

#: fields of transformers' merged generation config the enumeration cannot reproduce, with their neutral values
NOT_REPRODUCED = {
    "num_beams": (None, 1), "num_beam_groups": (None, 1), "penalty_alpha": (None,), "guidance_scale": (None, 1, 1.0),
    "sequence_bias": (None,), "force_words_ids": (None,), "constraints": (None,), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "epsilon_cutoff": (None, 0, 0.0), "eta_cutoff": (None, 0, 0.0), "top_h": (None,),
    "encoder_repetition_penalty": (None, 1, 1.0), "encoder_no_repeat_ngram_size": (None, 0),
    "exponential_decay_length_penalty": (None,), "watermarking_config": (None,), "min_length": (None, 0),
    "diversity_penalty": (None, 0, 0.0), "stop_strings": (None,), "num_return_sequences": (None, 1),
    "prefix_allowed_tokens_fn": (None,), "negative_prompt_ids": (None,),
}

MAX_ROWS = 200_000  #: prefixes the enumeration may have to score at the last depth


class TextLaw:
    """The exact law of the first ``horizon`` new tokens (``table``: {tokens: probability}) of
    ``prompt`` under ``settings`` (the effective settings, for reports)."""

    def __init__(self, table: dict[tuple[int, ...], float], horizon: int, prompt: list[int],
                 settings: dict[str, Any]) -> None:
        self.table, self.horizon, self.prompt, self.settings = table, horizon, prompt, settings

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"TextLaw({len(self.table)} outcomes of {self.horizon} tokens, {self.settings})"


# ----------------------------------------------------------------------------------- settings


def _hf_config(model: Any, generation_config: Any, kwargs: dict[str, Any], strict: bool = False) -> Any:
    """The generation config ``model.generate(generation_config, **kwargs)`` runs with: the call's
    settings, then the model's ``generation_config``, then transformers' defaults (transformers' own
    merge, ``_prepare_generation_config``). ``strict``: refuse keywords that are no generation setting."""
    prep = getattr(model, "_prepare_generation_config", None)
    if prep is None:
        raise TypeError(f"{type(model).__name__} has no transformers generate() (a GenerationMixin model is needed)")
    gc, rest = prep(copy.deepcopy(generation_config), **kwargs)
    if strict and rest:
        raise TypeError(f"generate(..., {', '.join(sorted(rest))}=...): not a generation setting the exact-law "
                        "oracle knows (the prompt is the prompt argument; sampler options are listed in SAMPLER_ONLY)")
    return gc


def _hf_settings(model: Any, tokens: int, generation_config: Any, logits_processor: Any,
                 kwargs: dict[str, Any]) -> Settings:
    from transformers import NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    law_kw = {k: v for k, v in kwargs.items() if k not in SAMPLER_ONLY}
    for k, v in law_kw.items():
        if k in NOT_REPRODUCED and v not in NOT_REPRODUCED[k]:
            raise ValueError(f"generate(..., {k}={v!r}): the exact-law oracle cannot reproduce {k}; audit this "
                             "setting against a reference sampler (two-sample mode: reference='plain')")
    gc = _hf_config(model, generation_config, {**law_kw, "max_new_tokens": tokens}, strict=True)
    for k, neutral in NOT_REPRODUCED.items():
        v = getattr(gc, k, None)
        if v not in neutral and not (k == "num_return_sequences" and v == 1):
            raise ValueError(f"the generation config sets {k}={v!r}, which the exact-law oracle cannot reproduce; "
                             "audit this setting against a reference sampler (two-sample mode)")
    sample = bool(gc.do_sample)
    t = float(gc.temperature if gc.temperature is not None else 1.0) if sample else 0.0
    top_k = gc.top_k if gc.top_k else None
    if top_k is not None and top_k >= model_vocab_size(model):
        top_k = None
    top_p = gc.top_p if gc.top_p is not None and gc.top_p < 1.0 else None
    typical = gc.typical_p if gc.typical_p is not None and gc.typical_p < 1.0 else None
    cfg = SamplingConfig(temperature=t, top_k=top_k, top_p=top_p, min_p=gc.min_p or None, typical_p=typical)
    before: list = []
    if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
        before.append(RepetitionPenaltyLogitsProcessor(float(gc.repetition_penalty)))
    if gc.no_repeat_ngram_size:
        before.append(NoRepeatNGramLogitsProcessor(int(gc.no_repeat_ngram_size)))
    if gc.bad_words_ids:
        before.append(NoBadWordsLogitsProcessor([list(map(int, w)) for w in gc.bad_words_ids]))
    return Settings(cfg, before, list(logits_processor or []), int(gc.min_new_tokens or 0), tokens,
                    gc.eos_token_id if gc.eos_token_id is not None else [])


def _speculate_settings(model: Any, tokens: int, generation_config: Any, logits_processor: Any,
                        kwargs: dict[str, Any]) -> Settings:
    bad = [k for k in kwargs if k not in (*SETTING_NAMES, "temperature", "top_k", "top_p", "eos_token_id")]
    if bad:
        raise TypeError(f"unexpected setting(s) {', '.join(map(repr, bad))} for SpeculativeGenerator.generate")
    s = resolve(generation_config, logits_processor=logits_processor,
                model_config=getattr(model, "generation_config", None), max_new_tokens=tokens, **kwargs)
    if s.stop_strings or s.constraint:
        what = "stop_strings" if s.stop_strings else ", ".join(s.constraint)
        raise ValueError(f"the exact-law oracle cannot reproduce {what}; audit against a reference sampler")
    if s.num_return_sequences != 1:
        raise ValueError("num_return_sequences: the audit draws one sequence per row; leave it at 1")
    if s.eos_token_id is None:
        s.eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return s


def _describe(s: Settings) -> dict[str, Any]:
    c = s.sampling
    d: dict[str, Any] = {"do_sample": not c.greedy}
    d.update({k: getattr(c, k) for k in ("temperature", "top_k", "top_p", "min_p", "typical_p")
              if getattr(c, k) is not None and not (c.greedy and k == "temperature")})
    for p in s.before:
        name = type(p).__name__
        d[name] = {k: v for k, v in vars(p).items() if isinstance(v, (int, float, list))}
    if s.min_new_tokens:
        d["min_new_tokens"] = s.min_new_tokens
    if s.user:
        d["logits_processor"] = [type(p).__name__ for p in s.user]
    d["eos_token_id"] = s.eos_token_id
    return d


def text_oracle(model: Any, prompt: Sequence[int], tokens: int, *, semantics: str = "transformers",
                generation_config: Any = None, logits_processor: Any = None, **settings: Any) -> TextLaw:
    """The exact law of the first ``tokens`` new tokens of ``prompt`` (token ids) under ``model``
    and ``settings``, read as ``model.generate(**settings)`` reads them (``semantics="transformers"``:
    greedy unless ``do_sample=True``; keys of :data:`SAMPLER_ONLY` are ignored) or as
    ``SpeculativeGenerator.generate`` does (``"speculate"``: sampling at temperature 1 by default).

    Refused (``ValueError`` / ``TypeError``): settings it cannot reproduce (:data:`NOT_REPRODUCED`,
    stop strings, constraints), unknown settings, a prompt that is not a non-empty list of ids in
    the vocabulary, ``tokens < 1``, and an enumeration over more than :data:`MAX_ROWS` prefixes
    (pass ``top_k`` or fewer tokens).
    """
    if semantics not in ("transformers", "speculate"):
        raise ValueError(f"semantics must be 'transformers' or 'speculate', got {semantics!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise ValueError(f"tokens (the horizon m) must be an int >= 1, got {tokens!r}")
    vocab = model_vocab_size(model)
    ids = _prompt(prompt, vocab)
    build = _hf_settings if semantics == "transformers" else _speculate_settings
    s = build(model, int(tokens), generation_config, logits_processor, dict(settings))
    eos = eos_ids(s.eos_token_id, vocab, "eos_token_id").tolist()
    cfg = s.sampling
    width = 1 if cfg.greedy else min(cfg.top_k or vocab, vocab)
    if width ** (int(tokens) - 1) > MAX_ROWS:
        raise ValueError(f"enumerating {tokens} tokens over {width} candidates per position would score up to "
                         f"{width ** (int(tokens) - 1):,} prefixes at the last depth (limit {MAX_ROWS:,}): pass "
                         "top_k (or a smaller --top-k) or fewer tokens")
    tr = Transforms(cfg, s.before, s.user, s.min_new_tokens, eos)
    table = continuation_law(model, ids, int(tokens), cfg, eos, transforms=tr)
    return TextLaw(table, int(tokens), ids, _describe(s))


def _prompt(prompt: Any, vocab: int) -> list[int]:
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.reshape(-1).tolist()
    a = np.asarray(prompt)
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
        raise TypeError(f"prompt must be a non-empty list of token ids, got {prompt!r:.80}")
    if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"prompt ids must be in 0..{vocab - 1}, got {a.min()}..{a.max()}")
    return a.tolist()


# ----------------------------------------------------------------------------------- samplers


def _strip(row: list[int], eos: set[int], pad: int | None) -> list[int]:
    """New tokens without the padding transformers appends after a row's EOS (anything else after an
    EOS is kept: a sampler that ran past EOS must be seen)."""
    for i, t in enumerate(row):
        if t in eos:
            rest = row[i + 1 :]
            return row[: i + 1] if all(x == pad or x in eos for x in rest) else row
    return row


def hf_sampler(model: Any, prompt: Sequence[int], tokens: int, *, batch_size: int | None = None,
               **generate_kwargs: Any) -> Any:
    """A sampler ``(n, seed) -> n lists of new token ids`` over ``model.generate(input_ids, **generate_kwargs)``
    with ``max_new_tokens=tokens``. Rows run ``batch_size`` at a time (default 256; 1 for assisted
    generation and prompt lookup, which transformers runs one row at a time); ``torch.manual_seed(seed)``
    seeds each call."""
    ids = _prompt(prompt, model_vocab_size(model))
    kw = dict(generate_kwargs)
    one = any(kw.get(k) is not None for k in ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit"))
    bs = int(batch_size) if batch_size is not None else (1 if one else 256)
    gc = _hf_config(model, kw.get("generation_config"), {k: v for k, v in kw.items() if k != "generation_config"})
    eos = set(eos_ids(gc.eos_token_id, model_vocab_size(model), "eos_token_id").tolist())
    pad = kw.pop("pad_token_id", None)
    pad = pad if pad is not None else gc.pad_token_id if gc.pad_token_id is not None else (min(eos) if eos else 0)

    @torch.inference_mode()
    def sample(n: int, seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        out: list[list[int]] = []
        for lo in range(0, n, bs):
            k = min(bs, n - lo)
            x = torch.tensor([ids] * k, device=model.device)
            seqs = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=tokens,
                                  pad_token_id=pad, **kw)
            out += [_strip(r, eos, pad) for r in seqs[:, len(ids):].tolist()]
        return out

    sample.batch_size = 16 if bs == 1 else bs  # sequences per audit call: a budget check, a bar step
    return sample


def speculate_sampler(generator: Any, prompt: Sequence[int], tokens: int, *, batch_size: int = 1024,
                      **settings: Any) -> Any:
    """A sampler ``(n, seed) -> n lists of new token ids`` over ``generator.generate`` (a
    :class:`SpeculativeGenerator`) with ``max_new_tokens=tokens`` and ``rng=seed``."""
    ids = _prompt(prompt, generator.vocab)

    def sample(n: int, seed: int) -> list[list[int]]:
        return generator.generate([ids] * n, max_new_tokens=tokens, rng=seed, **settings).new_tokens

    sample.batch_size = int(batch_size)
    return sample


_AUDIT_KW = ("tv", "alpha", "power", "n", "budget", "seed", "progress", "sequential")


def audit_generate(model: Any, prompt: Sequence[int], tokens: int = 3, *, reference: Any = None,
                   tv: float = DEFAULT_TV, alpha: float = DEFAULT_AUDIT_ALPHA, power: float = DEFAULT_POWER,
                   n: int | None = None, budget: float | None = None, seed: int = 0, progress: bool | None = None,
                   batch_size: int | None = None, **generate_kwargs: Any) -> AuditReport:
    """Audit ``model.generate(**generate_kwargs)`` (any variant: ``assistant_model=``,
    ``prompt_lookup_num_tokens=``, ...) against the exact law of ``model`` under the same settings
    (:func:`text_oracle`), or, with ``reference="plain"``, against plain ``generate`` with the same
    settings minus the sampler's own (:data:`SAMPLER_ONLY`): two-sample mode, for settings the
    oracle cannot reproduce. ``reference`` may also be any sampler ``(n, seed) -> sequences``."""
    sampler = hf_sampler(model, prompt, tokens, batch_size=batch_size, **generate_kwargs)
    common = dict(tv=tv, alpha=alpha, power=power, n=n, budget=budget, seed=seed, progress=progress)
    if reference is None:
        law = text_oracle(model, prompt, tokens, semantics="transformers", **generate_kwargs)
        return audit(sampler, law, **common)
    if isinstance(reference, str):
        if reference != "plain":
            raise ValueError(f"reference must be 'plain' or a sampler, got {reference!r}")
        plain = {k: v for k, v in generate_kwargs.items() if k not in SAMPLER_ONLY or k == "pad_token_id"}
        reference = hf_sampler(model, prompt, tokens, **plain)
    return audit(sampler, reference=reference, horizon=tokens, **common)


def audit_speculate(generator: Any, prompt: Sequence[int], tokens: int = 3, *, tv: float = DEFAULT_TV,
                    alpha: float = DEFAULT_AUDIT_ALPHA, power: float = DEFAULT_POWER, n: int | None = None,
                    budget: float | None = None, seed: int = 0, progress: bool | None = None,
                    batch_size: int = 1024, **settings: Any) -> AuditReport:
    """Audit a :class:`SpeculativeGenerator` under ``settings`` (its ``generate`` keyword
    arguments) against the exact law of its target."""
    law = text_oracle(generator.target, prompt, tokens, semantics="speculate", **settings)
    sampler = speculate_sampler(generator, prompt, tokens, batch_size=batch_size, **settings)
    return audit(sampler, law, tv=tv, alpha=alpha, power=power, n=n, budget=budget, seed=seed, progress=progress)
