"""The embedded digits pair: a class-conditional target denoiser and its distilled draft, for 8x8 images.

Both are :class:`MLPDenoiser` networks (residual MLP blocks on the flattened image, a sinusoidal
time embedding and a class embedding; label 10 = "no class", for classifier-free guidance),
predicting eps for ``DDPM(timesteps=1000)`` (the linear schedule) on scikit-learn's bundled
handwritten digits scaled to [-1, 1]. They were trained on this project's CPU machine by
``benchmarks/diffusion/train_digits.py`` (recipe, seed, losses: benchmarks/results/diffusion_train.md)
and ship in ``models/`` as safetensors (the target stored in float16, computed in float32).

Example:
    >>> from speculate.domains.diffusion.digits import load_digits_pair
    >>> sched, target, draft = load_digits_pair()
    >>> sched.timesteps, target.null_label, draft.width < target.width
    (1000, 10, True)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["MODELS", "NULL_LABEL", "MLPDenoiser", "load_digits_pair", "to_images"]

MODELS = Path(__file__).resolve().parent / "models"
NULL_LABEL = 10  #: the label that stands for "no class"


def _torch():
    import torch

    return torch


def MLPDenoiser(dim: int = 64, width: int = 512, blocks: int = 4, classes: int = 10, emb: int = 128) -> Any:
    """A residual-MLP eps-denoiser ``model(x[N, 1, 8, 8], t[N], labels[N]) -> [N, 1, 8, 8]`` (a torch module).

    x is flattened to ``dim``; ``t`` (ints 1..T) gets a sinusoidal embedding of ``emb`` numbers, the
    label (0..classes, ``classes`` = no class) a learned one; their sum conditions every block."""
    return _module()(dim, width, blocks, classes, emb)


_CLASS: Any = None


def _module():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    torch = _torch()
    nn = torch.nn

    class _MLPDenoiser(nn.Module):
        def __init__(self, dim, width, blocks, classes, emb):
            super().__init__()
            self.dim, self.width, self.n_blocks, self.classes, self.emb = dim, width, blocks, classes, emb
            self.null_label = classes
            self.inp = nn.Linear(dim, width)
            self.temb = nn.Linear(emb, width)
            self.cemb = nn.Embedding(classes + 1, width)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
                for _ in range(blocks))
            self.norm = nn.LayerNorm(width)
            self.out = nn.Linear(width, dim)
            half = emb // 2
            self.register_buffer("freqs", torch.exp(-math.log(10000.0) * torch.arange(half) / half), persistent=False)

        def config(self) -> dict:
            return dict(dim=self.dim, width=self.width, blocks=self.n_blocks, classes=self.classes, emb=self.emb)

        def forward(self, x, t, labels=None):
            if labels is None:
                labels = torch.full((x.shape[0],), self.null_label, dtype=torch.int64, device=x.device)
            a = t.to(x.dtype)[:, None] * self.freqs.to(x.dtype)[None]
            c = torch.nn.functional.silu(self.temb(torch.cat([torch.sin(a), torch.cos(a)], 1)) + self.cemb(labels))
            h = self.inp(x.reshape(x.shape[0], -1))
            for block in self.blocks:
                h = h + block(h + c)
            return self.out(self.norm(h)).reshape(x.shape)

    _CLASS = _MLPDenoiser
    return _CLASS


def load_digits_pair(folder: str | Path | None = None, device: Any = "cpu") -> tuple[Any, Any, Any]:
    """(sampler, target, draft): ``DDPM`` of the recipe and the two networks in eval mode, float32."""
    from safetensors.torch import load_file

    from .samplers import DDPM

    folder = MODELS if folder is None else Path(folder)
    cfg = json.loads((folder / "digits.json").read_text())
    nets = []
    for name in ("target", "draft"):
        net = MLPDenoiser(**cfg[name])
        state = {k: v.float() for k, v in load_file(str(folder / f"digits_{name}.safetensors")).items()}
        net.load_state_dict(state)
        nets.append(net.to(device).eval())
    s = cfg["sampler"]
    return DDPM(timesteps=s["timesteps"], schedule=s["schedule"], variance=s["variance"]), nets[0], nets[1]


def to_images(x: Any) -> Any:
    """Samples in [-1, 1] (the model's scale) as 8x8 grey levels 0..16, like the training data."""
    import numpy as np

    return np.clip((np.asarray(x) + 1.0) * 8.0, 0.0, 16.0).reshape(-1, 8, 8)
