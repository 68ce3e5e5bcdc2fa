"""The parts of transformers that speculate's text domain relies on beyond loading, configs,
tokenizers, ``forward`` and ``generate``, in one place, with the versions each was checked on.

Tested range: see :data:`TESTED` (the oldest version we claim, pinned by ``constraints-floor.txt``,
and the newest release, run by ``.ci/run``'s second step). When a release moves something listed
here, this module is where it is adapted.

What we rely on, release by release (the text README keeps the same table):

- the keyword a decoder's ``forward`` takes its cache by: ``past_key_values`` up to 5.23,
  ``cache`` from 5.24 (``past_key_values`` still accepted with a FutureWarning until 5.40):
  :func:`cache_kwarg`;
- ``Cache(layers=[...])`` with our own layer class (a ``DynamicLayer`` subclass with
  ``update``, ``get_seq_length``, ``get_mask_sizes``, ``batch_select_indices``): 5.23-5.24;
- ``DynamicCache`` built from per-layer key and value tensors and iterated back into them, its
  layers all plain ``DynamicLayer`` (the fallback runtime): 5.23-5.24;
- 4-D attention masks and ``position_ids`` honoured by ``forward``; ``logits_to_keep``;
- ``config.get_text_config(decoder=True)``, ``config.layer_types``, ``config._attn_implementation``;
- for the lean loops: ``LlamaForCausalLM``'s module tree and ``apply_rotary_pos_emb``; Whisper and
  BART decoders' module trees; ``EncoderDecoderCache`` and ``BaseModelOutput``;
- for recurrent layers: the Mamba, Mamba2, LFM2 and Qwen3-Next mixers' attributes and
  ``transformers.activations.ACT2FN``.

Every module of this folder (``models/``) may touch transformers' internals; nothing outside it
does, beyond loading, configs, tokenizers, ``forward`` and ``generate``. The one exception is
``generate()``'s own extension point, ``custom_generate.py``, which reads ``assistant_model`` and
``streamer`` from the ``generate()`` frame and ``generation_config._pad_token_tensor`` (5.23-5.24).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import transformers

__all__ = [
    "TESTED",
    "cache_from_tensors",
    "cache_kwarg",
    "cache_tensors",
    "execution_device",
    "forward_params",
    "installed",
    "output_cache",
    "state_kwarg",
    "version_note",
]

#: the transformers releases the text domain is tested on: the floor (``constraints-floor.txt``),
#: the pinned working set (``constraints.txt``) and the newest release checked when this was written
#: (``.ci/run`` also checks whatever release is newest on each run)
TESTED = {"floor": "5.23.0", "pinned": "5.23.0", "newest": "5.24.0"}


def installed() -> str:
    """The installed transformers version."""
    return transformers.__version__


def version_note() -> str:
    """One sentence for refusals: the installed transformers, the tested range, the working set."""
    return (f"(transformers {installed()} is installed; speculate is tested on transformers "
            f"{TESTED['floor']} to {TESTED['newest']}; `pip install -c constraints.txt -e .[text]` in "
            "speculate's repository installs the working set it is tested with)")


@functools.lru_cache(maxsize=256)
def _params(forward: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def forward_params(model: Any) -> frozenset[str]:
    """The names of ``model.forward``'s parameters (for a class's own forward: cached)."""
    fwd = getattr(type(model), "forward", None)
    return _params(fwd) if fwd is not None else _params(model.forward)


def cache_kwarg(model: Any) -> str | None:
    """The keyword ``model.forward`` takes a ``Cache`` by: ``"cache"`` (transformers >= 5.24),
    ``"past_key_values"`` (earlier releases), or None for a model that takes none.

    Checked on 5.23 (``past_key_values``) and 5.24 (``cache``; the old name still accepted with a
    FutureWarning until 5.40). The old name is never passed to a forward that has the new one.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
    ...                   num_attention_heads=2)
    >>> cache_kwarg(LlamaForCausalLM(cfg)) in ("cache", "past_key_values")
    True
    """
    params = forward_params(model)
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def state_kwarg(model: Any) -> str | None:
    """The keyword ``model.forward`` takes its decoding state by, recurrent models included:
    :func:`cache_kwarg`, else ``"cache_params"`` (Mamba-style models up to 5.23; from 5.24 they
    take ``cache``, the old name deprecated until 5.40)."""
    name = cache_kwarg(model)
    return name if name is not None else ("cache_params" if "cache_params" in forward_params(model) else None)


def output_cache(out: Any) -> Any:
    """The cache a forward returned: ``out.cache`` from transformers 5.24, ``out.past_key_values``
    (``out.cache_params`` for Mamba-style models) before."""
    for name in ("cache", "past_key_values", "cache_params"):
        value = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if value is not None:
            return value
    return None


def execution_device(module: Any) -> torch.device:
    """Where ``module`` computes (and its inputs and caches go): its first parameter's device, or
    for a model loaded with a ``device_map`` (accelerate hooks; weights offloaded to the CPU or
    disk sit on ``meta`` between calls) the execution device of its first hook.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
    ...                   num_attention_heads=2)
    >>> execution_device(LlamaForCausalLM(cfg))
    device(type='cpu')
    """
    first = next(module.parameters(), None)
    if first is not None and first.device.type != "meta" and "hf_device_map" not in module.__dict__:
        return first.device
    for m in module.modules():
        dev = getattr(m.__dict__.get("_hf_hook"), "execution_device", None)
        if dev is not None:
            return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return next((p.device for p in module.parameters() if p.device.type != "meta"), torch.device("cpu"))


def cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The per-layer ``(keys, values)`` ``[B, H, S, D]`` of a ``DynamicCache`` whose layers all keep
    every position (plain ``DynamicLayer``: no sliding window that evicts, no recurrent state), else
    None. Iterating a ``DynamicCache`` yields ``(keys, values, sliding window)`` per layer: 5.23-5.24."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    out = []
    for item in cache:
        k, v = item[0], item[1]
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4:
            return None
        out.append((k, v))
    return out


def cache_from_tensors(kv: list[tuple[torch.Tensor, torch.Tensor]] | None) -> Any:
    """A ``DynamicCache`` holding the per-layer ``(keys, values)`` ``kv`` (empty for None): its layers
    plain ``DynamicLayer`` objects (no config given, so none slides)."""
    from transformers import DynamicCache

    return DynamicCache() if kv is None else DynamicCache(kv)
