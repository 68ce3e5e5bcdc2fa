"""What the text domain reads off a model: its decoder config, vocabulary, learned positions, device,
training mode, and whether two models share token ids.

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                   num_attention_heads=2, num_key_value_heads=2)
>>> model_vocab_size(LlamaForCausalLM(cfg)), length_limits(LlamaForCausalLM(cfg))   # RoPE: no position limit
(16, [])
"""

from __future__ import annotations

from typing import Any

import torch

from .transformers_api import execution_device

__all__ = ["MAX_VOCAB_PADDING", "check_eval_mode", "check_vocabularies", "encoder_width", "execution_device",
           "ids_of", "is_encoder_decoder", "length_limits", "max_positions", "model_vocab_size", "reads_encoder",
           "speech_encoder", "text_config"]

#: largest vocabulary difference treated as padding of one tokenizer's vocabulary
MAX_VOCAB_PADDING = 256


def ids_of(x: Any) -> set[int]:
    """A token id or a list of them (a config's ``eos_token_id``) as a set; empty for None."""
    if x is None:
        return set()
    return {int(v) for v in (x if isinstance(x, (list, tuple)) else [x])}


def text_config(config: Any) -> Any:
    """The decoder's config inside ``config`` (itself for a plain causal LM's config)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def model_vocab_size(model: Any) -> int:
    """Number of logits the model outputs (its output embedding rows, else ``config.vocab_size``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(text_config(model.config).vocab_size)


def max_positions(model: Any) -> int | None:
    """The number of positions a model with learned absolute position embeddings has, else None.

    GPT-2 (``n_positions``), OPT, GPT-Neo and the like look positions up in an embedding table of
    ``max_position_embeddings`` rows (OPT: 2 more, an offset): a position past it is an index
    error. Models whose positions are computed (RoPE, ALiBi, sinusoidal: Llama, Mistral, Qwen,
    GPT-NeoX, ...) have no such table; their ``max_position_embeddings`` is a training length,
    not a limit, and None is returned.
    """
    cfg = text_config(model.config)
    limit = next((v for v in (getattr(cfg, a, None) for a in ("n_positions", "max_position_embeddings"))
                  if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    if limit is None:
        return None
    get_inp = getattr(model, "get_input_embeddings", None)
    tokens = get_inp() if get_inp is not None else None
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and m is not tokens and limit <= m.num_embeddings <= limit + 2:
            return limit
    return None


def length_limits(model: Any) -> list[tuple[int, str]]:
    """The longest sequence (prompt plus new tokens) ``model`` can decode, with the reason: learned
    positions. (Sliding windows are masks over a cache that keeps every slot: no limit.)"""
    n = max_positions(model)
    return [] if n is None else [(n, f"{n} learned positions (config.max_position_embeddings / n_positions)")]


def check_eval_mode(model: Any, role: str = "model") -> None:
    """Raise ``ValueError`` when any module of ``model`` is in training mode.

    Dropout (and anything else a module does when ``training``) makes the logits random: the
    output law would not be the model's, and cached and uncached logits would differ. The check
    is made on every use, never remembered (``.eval()`` fixes it at once).
    """
    if not any(m.training for m in model.modules()):
        return
    drop = [n or "(root)" for n, m in model.named_modules()
            if m.training and isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
    if drop:
        what = (f"{len(drop)} dropout module(s) active, e.g. {drop[0]}: its logits would be random, so the "
                "output law would not be the model's")
    else:
        n = sum(m.training for m in model.modules())
        what = (f"{n} module(s) with training=True; none drops out, but a module may compute differently "
                "while training (normalisation statistics, training-only branches), and speculate decodes "
                "with the model's inference behaviour only")
    raise ValueError(
        f"the {role} ({type(model).__name__}) is in training mode ({what}); call {role}.eval() before "
        "generating (models from from_pretrained are in eval mode; models built from a config "
        "are not)"
    )


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


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` has an encoder of its own (``config.is_encoder_decoder``)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def reads_encoder(model: Any) -> bool:
    """Whether ``model``'s decoder has cross-attention: an encoder-decoder, or a decoder that reads
    another model's encoder output (``WhisperForCausalLM``)."""
    if is_encoder_decoder(model):
        return True
    if not isinstance(model, torch.nn.Module):
        return False
    return any(name.endswith(("encoder_attn", "EncDecAttention")) for name, _ in model.named_modules())


def speech_encoder(model: Any) -> bool:
    """Whether the encoder reads ``input_features`` (Whisper, Speech2Text) instead of token ids."""
    return getattr(model, "main_input_name", "input_ids") == "input_features"


def encoder_width(model: Any) -> int | None:
    """The width of the encoder output ``model`` produces (encoder-decoders) or reads (a decoder with
    cross-attention), from its config; None when the config does not say."""
    cfg = model.config
    for attr in ("d_model", "hidden_size"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None
