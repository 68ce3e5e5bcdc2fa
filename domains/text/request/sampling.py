"""Sampling transforms (temperature, top-k, top-p) shared by the target and the draft.

The generator applies :func:`probabilities` with the SAME settings to the target's and the draft's
logits before verification, so the verified tokens are distributed exactly as the target sampled
with those settings. The rules are those of Hugging Face's ``TemperatureLogitsWarper``,
``TopKLogitsWarper`` and ``TopPLogitsWarper`` applied in that order (ties at the top-k boundary are
kept; top-p keeps the smallest set of most likely tokens whose mass exceeds ``top_p``, at least
one), computed in float32 whatever the model's dtype, with a stable sort so that the result does
not depend on the batch a row is in.

``temperature=0`` means greedy decoding: the distribution is a point mass on the first argmax.
Below temperature 1 the logits are shifted by their maximum before the division (the same law),
so that a tiny temperature tends to the argmax instead of overflowing to inf (NaN after softmax).

>>> import torch
>>> from speculate.domains.text.request.sampling import SamplingConfig, probabilities
>>> logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
>>> [round(v, 3) for v in probabilities(logits, SamplingConfig(top_k=2))[0].tolist()]
[0.731, 0.269, 0.0, 0.0]
>>> probabilities(logits, SamplingConfig(temperature=0.0)).tolist()
[[1.0, 0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SamplingConfig", "probabilities", "transform_logits"]


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature, top-k, top-p, min-p and typical-p (transformers' warpers, in that order), validated.

    >>> SamplingConfig(temperature=0).greedy
    True
    >>> SamplingConfig(top_p=1.5)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be in (0, 1], got 1.5
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer))
                              or k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {k!r}")
        p = self.top_p
        if p is not None and (not _is_real(p) or not (0.0 < p <= 1.0)):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        # numpy scalars are accepted and stored as Python numbers
        object.__setattr__(self, "temperature", float(t) if not isinstance(t, int) else t)
        if k is not None:
            object.__setattr__(self, "top_k", int(k))
        if p is not None:
            object.__setattr__(self, "top_p", float(p) if not isinstance(p, int) else p)
        for name in ("min_p", "typical_p"):
            v = getattr(self, name)
            if v is not None and (not _is_real(v) or not (0.0 <= v <= 1.0)):
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
            if v is not None:
                object.__setattr__(self, name, float(v))

    @property
    def greedy(self) -> bool:
        """True when temperature is 0 (argmax decoding)."""
        return self.temperature == 0


def transform_logits(logits: torch.Tensor, cfg: SamplingConfig,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits after temperature, top-k, top-p, min-p and typical-p (removed tokens get ``-inf``), in ``dtype``.

    ``logits``: ``[..., V]`` of any float dtype and device. Not defined for greedy configs.
    """
    if cfg.greedy:
        raise ValueError("transform_logits is for temperature > 0; greedy uses argmax")
    x = logits.to(dtype)  # [..., V]
    if cfg.temperature > 1.0:
        x = x / cfg.temperature
    elif cfg.temperature < 1.0:
        # (x - max) / T: the same law, but a tiny T cannot overflow to inf (NaN after softmax);
        # the maximum stays 0 even when T underflows in ``dtype``
        z = x - x.amax(dim=-1, keepdim=True)
        x = torch.where(z == 0, z, z / cfg.temperature)
    V = x.shape[-1]
    if cfg.top_k is not None and cfg.top_k < V:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, -math.inf)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False, stable=True)  # [..., V]
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # [..., V]
        remove_sorted = cum <= (1.0 - cfg.top_p)
        remove_sorted[..., -1] = False  # keep at least the most likely token
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, -math.inf)
    if cfg.min_p is not None and cfg.min_p > 0.0:  # MinPLogitsWarper: below min_p x the top probability
        pr = x.softmax(dim=-1)
        x = x.masked_fill(pr < cfg.min_p * pr.amax(dim=-1, keepdim=True), -math.inf)
    if cfg.typical_p is not None and cfg.typical_p < 1.0:  # TypicalLogitsWarper
        logp = x.log_softmax(dim=-1)
        ent = -(logp * logp.exp()).nansum(dim=-1, keepdim=True)  # [..., 1]
        shifted = (-logp - ent).abs()
        sorted_s, order = torch.sort(shifted, dim=-1, stable=True)
        cum = x.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
        last = (cum < cfg.typical_p).sum(dim=-1, keepdim=True).clamp(max=V - 1)  # [..., 1]
        remove_sorted = sorted_s > sorted_s.gather(-1, last)
        remove_sorted[..., 0] = False
        x = x.masked_fill(torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted), -math.inf)
    return x


def probabilities(logits: torch.Tensor, cfg: SamplingConfig,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Probabilities ``[..., V]`` (float32 by default) of the next token under ``cfg``.

    Greedy (temperature 0): a one-hot vector on ``argmax(logits)`` (the first maximum, as
    ``torch.argmax`` and ``generate(do_sample=False)`` choose).
    """
    if cfg.greedy:
        top = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros(logits.shape, dtype=dtype, device=logits.device).scatter_(-1, top, 1.0)
    return transform_logits(logits, cfg, dtype).softmax(dim=-1)
