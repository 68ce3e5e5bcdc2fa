"""Which runtime decodes a model: speculate's position-indexed KV cache when its probe accepts the
model, else transformers' own cache (:class:`~.transformers_cache.TransformersCacheModel`), with a
warning saying why and what it costs. Only a model neither can decode exactly is refused."""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any

from .facts import check_eval_mode
from .kv_cache import CachedModel
from .lean_llama import lean_model
from .probe import probe, remembered
from .transformers_api import version_note
from .transformers_cache import MODES, TransformersCacheModel

__all__ = ["FallbackWarning", "check_materialised", "fast_path_refusal", "pick_runtime", "unwrapped"]


class FallbackWarning(UserWarning):
    """A model runs through transformers' own cache: exact, but slower than the fast path."""


def unwrapped(model: Any, role: str = "model") -> Any:
    """The transformers model inside a wrapper that computes the same function: a PEFT ``PeftModel``
    (its adapters are injected into the base model's modules, which run them: ``get_base_model()``)
    or a ``torch.compile`` wrapper (``_orig_mod``, the same modules uncompiled: speculate's cache
    needs per-row slots the compiled graph was not traced for). Anything else as given."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if type(model).__module__.startswith("peft") and callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            warnings.warn(f"the {role} is a torch.compile wrapper: speculate runs its uncompiled module "
                          "(the same weights and function; its cache writes per-row slots that the compiled "
                          "graph was not traced for)", UserWarning, stacklevel=3)
            model = model._orig_mod
    return model


def fast_path_refusal(model: Any) -> str | None:
    """Why speculate's position-indexed cache cannot decode ``model`` (None when it can): the
    probe of :func:`~speculate.domains.text.models.kv_cache.check_model`, once per model and setting."""
    return remembered(model, "cache", lambda: probe(model, CachedModel))


def check_materialised(model: Any, role: str = "model") -> None:
    """Refuse a model whose weights are on the ``meta`` device with nothing to bring them (no
    accelerate hook: not an offloaded ``device_map`` model), before any work."""
    meta = next((n for n, p in model.named_parameters() if p.device.type == "meta"), None)
    if meta is not None and not any("_hf_hook" in m.__dict__ for m in model.modules()):
        raise ValueError(
            f"the {role} ({type(model).__name__}) has weights on the meta device (e.g. {meta}): they were "
            "never loaded. Load real weights: from_pretrained(...) without device='meta', or "
            "model.to_empty(device=...) followed by load_state_dict(...)")


def pick_runtime(model: Any, role: str = "model", lean: bool = False) -> Any:
    """The runtime that decodes ``model`` (the ``role`` names it in messages): ``LeanLlama`` (with
    ``lean``, for a plain Llama) or :class:`CachedModel` when the position-indexed cache's probe
    accepts the model; else :class:`TransformersCacheModel` when its own probe (the same ragged rows
    and rollback against the uncached forward) passes, with a :class:`FallbackWarning`; else
    ``ValueError`` with both reasons. A model in training mode is refused first."""
    check_materialised(model, role)
    check_eval_mode(model, role)
    why = fast_path_refusal(model)
    if why is None:
        return lean_model(model) if lean else CachedModel(model)
    refusals = []
    for mode in MODES:  # transformers' cache, else no cache at all (recurrent and custom caches)
        make = partial(TransformersCacheModel, mode=mode)
        make.what = f"transformers' own cache ({mode} mode)"  # type: ignore[attr-defined]
        why_not = remembered(model, f"fallback-{mode}", lambda make=make: probe(model, make))
        if why_not is None:
            break
        refusals.append(f"{mode} mode: {why_not}")
    else:
        raise ValueError(f"the {role}: {why}; transformers' own cache cannot decode it exactly either "
                         f"({'; '.join(refusals)}) {version_note()}")
    slower = ("rolls back by slicing each row's keys and values" if mode == "cache" else
              "runs without a cache, feeding each row's whole sequence at every forward")
    warnings.warn(
        f"the {role}: {why}. It runs through transformers' own cache instead: exact, but slower than "
        f"the fast path: each forward runs once per group of rows at the same position and {slower} "
        "(measured on the embedded pair: 1.4x the fast path's time at batch 1, 3.7x at batch 8; "
        f"benchmarks/results/text_fallback.md). {version_note()}",
        FallbackWarning, stacklevel=3)
    return TransformersCacheModel(model, mode)
