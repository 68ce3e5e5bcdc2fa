"""Generation settings of a request: a transformers ``GenerationConfig`` and keyword arguments,
resolved into one :class:`Settings` (keyword arguments win over the config's fields).

Read from either: ``max_new_tokens``, ``do_sample`` (False: greedy), ``temperature``, ``top_k``,
``top_p``, ``min_p``, ``typical_p``, ``repetition_penalty``, ``no_repeat_ngram_size``,
``bad_words_ids``, ``min_new_tokens``, ``stop_strings``, ``eos_token_id``,
``num_return_sequences``; plus the user's ``logits_processor`` list and a constraint
(``json_schema``, ``regex``, ``grammar`` or ``constraint``: keyword arguments only). Other fields of a config
that would change the law (beams, guidance, constraints, ...) are refused with a ``ValueError``.

>>> from transformers import GenerationConfig
>>> s = resolve(GenerationConfig(do_sample=True, top_p=0.9, repetition_penalty=1.3), temperature=0.7)
>>> s.sampling, len(s.before), s.max_new_tokens
(SamplingConfig(temperature=0.7, top_k=None, top_p=0.9, min_p=None, typical_p=None), 1, 128)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models.transformers_api import forward_params
from .inputs import is_int
from .sampling import SamplingConfig

__all__ = ["Settings", "resolve"]

#: GenerationConfig fields this generator cannot honour (beam search, guidance, ...), when set
UNSUPPORTED = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "guidance_scale": None,
    "sequence_bias": None, "force_words_ids": None, "constraints": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "epsilon_cutoff": None, "eta_cutoff": None, "top_h": None, "encoder_repetition_penalty": None,
    "exponential_decay_length_penalty": None, "watermarking_config": None, "max_time": None,
    "min_length": None, "max_length": None, "prompt_lookup_num_tokens": None,
}
MAX_NEW_TOKENS = 128


@dataclass
class Settings:
    """A request's settings: the warpers (``sampling``), the prefix processors (``before``: built
    in, ``user``: the caller's), and what ends rows and repeats prompts."""

    sampling: SamplingConfig
    before: list = field(default_factory=list)
    user: list = field(default_factory=list)
    min_new_tokens: int = 0
    max_new_tokens: int = MAX_NEW_TOKENS
    eos_token_id: Any = None  # None: the target's generation_config
    stop_strings: list[str] = field(default_factory=list)
    num_return_sequences: int = 1
    constraint: dict[str, Any] = field(default_factory=dict)  # json_schema= / regex= / grammar= (one, as given)


def _pick(name: str, given: dict[str, Any], config: Any, own: dict[str, Any]) -> Any:
    v = given.get(name)
    if v is not None:
        return v
    v = getattr(config, name, None) if config is not None else None
    return v if v is not None else own.get(name)


#: the settings a model's own ``generation_config`` contributes (where its checkpoint set them)
_OWN = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
        "no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "max_new_tokens")


def model_settings(model_config: Any) -> dict[str, Any]:
    """What a model's own ``generation_config`` sets: the fields of :data:`_OWN` whose values differ
    from transformers' ``GenerationConfig()`` defaults (``to_diff_dict``: what its checkpoint chose).
    Fields we do not support there (``max_length``, beams, ...) are ignored, not refused: they are
    the model's, not the caller's request."""
    if model_config is None or not hasattr(model_config, "to_diff_dict"):
        return {}
    diff = model_config.to_diff_dict()
    return {k: diff[k] for k in _OWN if diff.get(k) is not None}


def resolve(generation_config: Any = None, *, logits_processor: Sequence[Any] | None = None,
            model_config: Any = None, **given: Any) -> Settings:
    """The :class:`Settings` of a call, with transformers' precedence: the keyword arguments ``given``
    that are not None (names as in ``GenerationConfig``), then ``generation_config`` (the one the
    call passes), then what the model's own ``model_config`` sets (:func:`model_settings`), then
    our defaults (sampling at temperature 1, 128 new tokens)."""
    from transformers import (
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    gc = generation_config
    if gc is not None:
        if not hasattr(gc, "to_diff_dict"):
            raise TypeError(f"generation_config must be a transformers GenerationConfig, got {type(gc).__name__}")
        for name, default in UNSUPPORTED.items():
            v = getattr(gc, name, None)
            if v is not None and v != default and not (name == "max_length" and given.get("max_new_tokens")):
                hint = " (use max_new_tokens)" if name in ("max_length", "min_length") else ""
                raise ValueError(f"generation_config.{name}={v!r} is not supported by speculative decoding{hint}")
    own = model_settings(model_config)
    g = {k: _pick(k, given, gc, own) for k in (
        "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
        "no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "stop_strings", "eos_token_id",
        "num_return_sequences", "max_new_tokens")}
    t = g["temperature"] if g["temperature"] is not None else 1.0
    if g["do_sample"] is False:
        t = 0.0
    top_k = g["top_k"] if given.get("top_k") is not None or g["top_k"] != 0 else None  # config: 0 = off
    cfg = SamplingConfig(temperature=t, top_k=top_k, top_p=g["top_p"], min_p=g["min_p"],
                         typical_p=g["typical_p"])
    before: list = []
    rp = g["repetition_penalty"]
    if rp is not None and rp != 1.0:
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0, got {rp!r}")
        before.append(RepetitionPenaltyLogitsProcessor(float(rp)))
    ng = g["no_repeat_ngram_size"]
    if ng:
        if not is_int(ng) or ng < 1:
            raise ValueError(f"no_repeat_ngram_size must be an int >= 1, got {ng!r}")
        before.append(NoRepeatNGramLogitsProcessor(int(ng)))
    bw = g["bad_words_ids"]
    if bw:
        if not (isinstance(bw, (list, tuple)) and all(isinstance(w, (list, tuple)) and w and all(is_int(i) for i in w)
                                                      for w in bw)):
            raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, got {bw!r}")
        before.append(NoBadWordsLogitsProcessor([list(map(int, w)) for w in bw]))
    mn = g["min_new_tokens"] or 0
    if not is_int(mn) or mn < 0:
        raise ValueError(f"min_new_tokens must be an int >= 0, got {mn!r}")
    n_ret = g["num_return_sequences"] or 1
    if not is_int(n_ret) or n_ret < 1:
        raise ValueError(f"num_return_sequences must be an int >= 1, got {n_ret!r}")
    mx = g["max_new_tokens"] if g["max_new_tokens"] is not None else MAX_NEW_TOKENS
    if not is_int(mx) or mx < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {mx!r}")
    stops = g["stop_strings"] or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    if not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop_strings must be a string or a list of non-empty strings, got {stops!r}")
    user = list(logits_processor or [])
    constraint = {k: given[k] for k in CONSTRAINTS if given.get(k) is not None}
    if len(constraint) > 1:
        raise ValueError(f"give one of json_schema=, regex=, grammar=, constraint=; got {', '.join(constraint)}")
    return Settings(cfg, before, user, int(mn), int(mx), g["eos_token_id"], stops, int(n_ret), constraint)


#: what a request may be constrained by (``request/constraints.py``): a JSON schema, a regex, a Lark grammar
CONSTRAINTS = ("json_schema", "regex", "grammar", "constraint")


#: the generation settings ``generate`` and ``stream`` take as keyword arguments (beyond their named parameters)
SETTING_NAMES = ("do_sample", "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                 "min_new_tokens", "stop_strings", "num_return_sequences", *CONSTRAINTS)


def without_token_types(given: dict[str, Any], model: Any) -> dict[str, Any]:
    """``given`` without ``token_type_ids`` (in ``**tokenizer(...)``: harmless for a model whose forward
    does not read them; refused for one that does, since they change its logits and are not passed)."""
    if "token_type_ids" not in given:
        return given
    if "token_type_ids" in forward_params(model):
        raise ValueError(f"{type(model).__name__} reads token_type_ids (they change its logits), which "
                         "speculative decoding does not pass to it; tokenize without them "
                         "(return_token_type_ids=False)")
    return {k: v for k, v in given.items() if k != "token_type_ids"}


def setting_kwargs(given: dict[str, Any], model: Any) -> dict[str, Any]:
    """``given`` checked against :data:`SETTING_NAMES` (``TypeError`` naming the unknown ones)."""
    given = without_token_types(given, model)
    bad = [k for k in given if k not in SETTING_NAMES]
    if bad:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, bad))}; generation settings "
                        f"are: {', '.join(SETTING_NAMES)} (and generation_config=, logits_processor=)")
    return given
