"""Which cached slots each layer's queries see: full causal, sliding-window and chunked attention.

The position-indexed cache (``kv_cache.py``) keeps row ``r``'s keys and values at slots equal to
their positions, so a layer's mask is a function of a query's position ``p`` and a key's slot
``j`` alone, whatever the row:

- full attention: ``j <= p``;
- sliding window ``w`` (Mistral, Gemma 2/3, Cohere 2, GPT-OSS, ...; transformers' convention
  ``kv_idx > q_idx - sliding_window``): ``p - w < j <= p``. The cache keeps every slot and the
  window is a mask over it, so rolling back a rejected block stays free past the window;
- chunked (Llama 4): ``j <= p`` and ``j // c == p // c``.

Models whose layers differ (Gemma 2/3, Cohere 2, GPT-OSS, the hybrids) take a dict of masks keyed
by layer type (``config.layer_types``); :func:`layer_plan` reads which kinds a model has and how it
takes its masks, :func:`masks` builds them. ALiBi models (Bloom, Falcon with ``alibi=True``) build
their position biases from a 2-D padding mask; :func:`alibi_from_slots` lets them take the 4-D
masks (the bias of a key is its slope times its slot, which is its position).

>>> import torch
>>> plan = LayerPlan(types=("sliding_attention",), window=2, chunk=None, by_type=False)
>>> masks(plan, torch.tensor([[3, 4]]), top=5)[0, 0].int().tolist()    # queries at positions 3, 4
[[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ATTENTION", "RECURRENT", "LayerPlan", "alibi_from_slots", "layer_plan", "masks", "tree_masks"]

#: layer types whose layers attend through the KV cache, and the mask each needs
ATTENTION = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
             "attention": "full", "hybrid": "full"}
#: layer types whose layers do not attend (recurrent mixers, or no mixing at all): no mask
RECURRENT = {"linear_attention", "conv", "mamba", "mamba2", "recurrent", "mlp", "moe"}


@dataclass(frozen=True)
class LayerPlan:
    """The attention layers of a model: their types, window, chunk size, and how masks are passed."""

    types: tuple[str, ...]  #: one layer type per decoder layer (``config.layer_types`` or inferred)
    window: int | None  #: the sliding window (a query sees itself and ``window - 1`` earlier tokens)
    chunk: int | None  #: the attention chunk size of chunked layers
    by_type: bool  #: the model's forward takes a dict of masks keyed by layer type

    @property
    def kinds(self) -> set[str]:
        """The kinds of masks the layers need: a subset of full, sliding, chunked."""
        return {ATTENTION[t] for t in self.types if t in ATTENTION}

    @property
    def plain(self) -> bool:
        """Every layer is a full-attention layer (the model can build its own causal mask)."""
        return all(ATTENTION.get(t) == "full" for t in self.types)


def _positive_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _takes_mask_dict(model: Any) -> bool:
    """Whether the model's decoder forward accepts ``attention_mask`` as a dict of per-type masks
    (transformers' ``isinstance(causal_mask_mapping := attention_mask, dict)``)."""
    from transformers import PreTrainedModel

    for cls in {type(m) for m in model.modules() if isinstance(m, PreTrainedModel)}:
        try:
            src = inspect.getsource(inspect.unwrap(cls.forward))
        except (OSError, TypeError):
            continue
        if re.search(r"attention_mask\s*,\s*dict\s*\)", src):
            return True
    return False


def layer_plan(model: Any, config: Any, name: str) -> LayerPlan:
    """The :class:`LayerPlan` of ``model`` (``config``: its decoder config), or ``ValueError`` naming
    the family (``name``) and the layer type or mask scheme the cache cannot serve."""
    n = int(config.num_hidden_layers)
    if "local" in (getattr(config, "attention_layers", None) or ()):  # GPT-Neo
        raise ValueError(f"{name} has local attention layers that take their window from the key "
                         "length of the cache, not from positions: ragged rows cannot be masked")
    window = _positive_int(getattr(config, "sliding_window", None))
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    types = getattr(config, "layer_types", None)
    if types is None:  # Mistral, Starcoder2, Mixtral, Phi-3: every layer slides when a window is set
        types = ["sliding_attention" if window else "full_attention"] * n
    types = tuple(str(t) for t in types)
    unknown = sorted({t for t in types if t not in ATTENTION and t not in RECURRENT})
    if unknown:
        raise ValueError(f"{name} has layers of type {unknown}, which speculate's text domain does "
                         "not know how to cache and roll back")
    chunk = _positive_int(getattr(config, "attention_chunk_size", None))
    plan = LayerPlan(types=types, window=window, chunk=chunk, by_type=_takes_mask_dict(model))
    if "sliding" in plan.kinds and window is None:
        raise ValueError(f"{name} has sliding-window layers but no config.sliding_window")
    if "chunked" in plan.kinds and chunk is None:
        raise ValueError(f"{name} has chunked-attention layers but no config.attention_chunk_size")
    if len(plan.kinds) > 1 and not plan.by_type:
        raise ValueError(f"{name} mixes {sorted(plan.kinds)} attention layers but its forward takes one "
                         "attention mask for all of them (no dict of masks by layer type)")
    return plan


def masks(plan: LayerPlan, pos: torch.Tensor, top: int,
          float_dtype: torch.dtype | None = None) -> torch.Tensor | dict[str, Any]:
    """The masks of queries at positions ``pos`` ``[R, W]`` over slots ``0 .. top - 1``.

    Boolean ``[R, 1, W, top]`` (True: attend), or additive float masks in ``float_dtype`` (eager
    attention): one tensor, or a dict by layer type when ``plan.by_type``.
    """
    keys = torch.arange(top, device=pos.device)[None, None, None, :]
    p = pos[:, None, :, None]  # [R, 1, W, 1]
    return _by_kind(plan, keys <= p, p, keys, float_dtype)


def tree_masks(plan: LayerPlan, pos: torch.Tensor, start: torch.Tensor, see: torch.Tensor, top: int,
               float_dtype: torch.dtype | None = None) -> torch.Tensor | dict[str, Any]:
    """The masks of a block whose columns are not a chain (a token tree): column ``j`` of row ``r``
    sits at slot ``start[r] + j`` with position ``pos[r, j]`` and sees every slot before
    ``start[r]`` (the committed prefix, whose slots are their positions) and the block's columns
    ``i`` with ``see[r, j, i]`` (itself and its ancestors). Windows and chunks are taken on
    positions, so a node at depth d is as far from the prefix as the d-th token of a chain.
    Shapes and return as :func:`masks`; ``see`` bool ``[R, W, W]``.

    >>> plan = LayerPlan(types=("full_attention",), window=None, chunk=None, by_type=False)
    >>> see = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)  # two siblings of column 0
    >>> tree_masks(plan, torch.tensor([[2, 3, 3]]), torch.tensor([2]), see, top=5)[0, 0].int().tolist()
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    """
    R, W = pos.shape
    keys = torch.arange(top, device=pos.device)[None, :]  # [1, top]
    rel = keys - start[:, None]  # [R, top]: the key's column in the block (< 0: the prefix)
    inblock = (rel >= 0) & (rel < W)
    col = rel.clamp(0, W - 1)
    key_pos = torch.where(inblock, pos.gather(1, col), keys)  # [R, top]
    sees = see.gather(2, col[:, None, :].expand(R, W, top))  # [R, W, top]
    visible = ((rel < 0)[:, None, :] | (inblock[:, None, :] & sees))[:, None]  # [R, 1, W, top]
    return _by_kind(plan, visible, pos[:, None, :, None], key_pos[:, None, None, :], float_dtype)


def _by_kind(plan: LayerPlan, visible: torch.Tensor, p: torch.Tensor, k: torch.Tensor,
             float_dtype: torch.dtype | None) -> torch.Tensor | dict[str, Any]:
    """The masks of each kind of layer from the full-attention mask ``visible`` ``[R, 1, W, top]``,
    the queries' positions ``p`` ``[R, 1, W, 1]`` and the keys' ``k`` (broadcastable to it)."""
    made: dict[str, torch.Tensor] = {"full": visible}
    if "sliding" in plan.kinds:
        made["sliding"] = visible & (k > p - plan.window)
    if "chunked" in plan.kinds:
        made["chunked"] = visible & (k // plan.chunk == p // plan.chunk)
    if float_dtype is not None:
        low = torch.finfo(float_dtype).min
        made = {k: torch.zeros(m.shape, dtype=float_dtype, device=m.device).masked_fill_(~m, low)
                for k, m in made.items()}
    if not plan.by_type:
        (kind,) = plan.kinds or {"full"}
        return made[kind]
    out: dict[str, Any] = {t: None for t in RECURRENT}
    out.update({t: made[k] for t, k in ATTENTION.items() if k in made})
    return out


@contextlib.contextmanager
def alibi_from_slots(model: Any) -> Iterator[None]:
    """Let an ALiBi model whose biases come from a 2-D padding mask (``build_alibi_tensor`` of its
    modeling module: Bloom, Falcon) take a 4-D mask over the cache's slots.

    Its bias for the key at slot ``j`` is ``slope * (position of j)``; in the position-indexed cache a
    slot is its position, which is what ``build_alibi_tensor`` gives for a mask of ones over the
    slots. The function is swapped for the duration of the forward and behaves as before for 2-D
    masks.
    """
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, "build_alibi_tensor", None)
    if original is None:
        yield
        return

    def build_alibi_tensor(attention_mask: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if attention_mask.ndim == 4:
            R, T = attention_mask.shape[0], attention_mask.shape[-1]
            attention_mask = torch.ones(R, T, dtype=torch.long, device=attention_mask.device)
        return original(attention_mask, *args, **kwargs)

    module.build_alibi_tensor = build_alibi_tensor
    try:
        yield
    finally:
        module.build_alibi_tensor = original
