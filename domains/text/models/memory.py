"""How much memory the KV caches of a request need, and how much a device has: checked before
anything is allocated (:class:`CacheMemoryError` names the fix).

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> cache_bytes_by_device(LlamaForCausalLM(cfg), batch=3, capacity=10)
{device(type='cpu'): 7680}
"""

from __future__ import annotations

from typing import Any

import torch

from .attention_masks import ATTENTION
from .facts import execution_device, text_config

__all__ = ["CacheMemoryError", "available_memory", "cache_bytes", "cache_bytes_by_device", "layer_devices"]


class CacheMemoryError(MemoryError, ValueError):
    """The KV caches a ``generate`` call needs do not fit in the memory available for them.

    Raised before anything is allocated; a ``MemoryError`` and a ``ValueError``.
    """


def _attention_layers(cfg: Any) -> list[bool]:
    """Per decoder layer: whether it keeps keys and values (recurrent and MLP-only layers do not)."""
    n = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    if types is None or len(types) != n:
        return [True] * n
    return [t in ATTENTION for t in types]


def layer_devices(model: Any) -> list[torch.device]:
    """The device of each decoder layer (several with ``device_map``; else the model's device)."""
    n = int(text_config(model.config).num_hidden_layers)
    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name]
    if found:
        _, layers = min(found, key=lambda nm: nm[0].count("."))
        if all(next(iter(layer.parameters()), None) is not None for layer in layers):
            return [execution_device(layer) for layer in layers]
    return [execution_device(model)] * n


def cache_bytes_by_device(model: Any, batch: int, capacity: int) -> dict[torch.device, int]:
    """:func:`cache_bytes` split over the devices of the layers that hold them (a model spread with
    ``device_map`` keeps each layer's cache where the layer is); empty when unknown."""
    total = cache_bytes(model, batch, capacity)
    if total is None:
        return {}
    attn = _attention_layers(text_config(model.config))
    per = total // max(1, sum(attn))
    out: dict[torch.device, int] = {}
    for dev, a in zip(layer_devices(model), attn, strict=True):
        if a:
            out[dev] = out.get(dev, 0) + per
    return out


def cache_bytes(model: Any, batch: int, capacity: int) -> int | None:
    """Bytes of the keys and values of ``batch`` rows of ``capacity`` slots (as :class:`CachedModel`
    and ``LeanLlama`` allocate them), from the config and the parameters' dtype, for the layers that
    attend (``config.layer_types``: recurrent layers keep a state of a few vectors per row); None
    when the config does not say (no ``num_hidden_layers`` / ``num_attention_heads`` / ``hidden_size``).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
    ...                   num_attention_heads=4, num_key_value_heads=2)
    >>> cache_bytes(LlamaForCausalLM(cfg), batch=3, capacity=10)   # 2 layers x (K, V) x 3 x 2 x 8 x 10 x 4
    7680
    """
    cfg = text_config(model.config)
    try:
        layers = sum(_attention_layers(cfg))
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    item = next(model.parameters()).element_size()
    return 2 * layers * int(batch) * kv * head_dim * int(capacity) * item


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(device: Any) -> tuple[int, str] | None:
    """``(bytes, where the number comes from)`` free for new tensors on ``device``, or None when
    unknown: ``MemAvailable`` of ``/proc/meminfo`` for the CPU (Linux), ``torch.cuda.mem_get_info``
    plus the memory PyTorch's allocator holds unused for a CUDA device."""
    dev = torch.device(device)
    if dev.type == "cpu":
        n = _meminfo_available()
        return None if n is None else (n, "MemAvailable in /proc/meminfo")
    if dev.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(dev)
        held = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + held), f"torch.cuda.mem_get_info({dev}) + unused reserved memory"
    return None
