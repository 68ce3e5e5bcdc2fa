"""A lean decoding loop for Llama-architecture drafts: the draft's weights and layers, without the
framework around them.

A draft step on CPU with a small model is mostly overhead: building masks and cache objects, output
dataclasses, hooks. For ``LlamaForCausalLM`` this module runs the model's own submodules (embedding,
rotary embedding, RMSNorms, q/k/v/o projections, MLP, head) around a KV cache of fixed tensors
indexed by position (gpt-fast style): writing a token at slot ``p`` overwrites whatever a rejected
draft left there, so rollback is just moving ``length`` back. Same interface as
:class:`speculate.domains.text.kv_cache.CachedModel`; :func:`lean_model` picks it when the model allows.

The logits agree with the transformers forward to float rounding (tests/text/test_text_lean_llama.py);
exactness does not depend on it: the verifier uses the probabilities this loop computed, which
are the ones the drafts were sampled from.

>>> import numpy as np, torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                   num_attention_heads=2, num_key_value_heads=1)
>>> lm = LeanLlama(LlamaForCausalLM(cfg).eval())
>>> lm.reset(batch=2, capacity=8)
>>> lm.forward(torch.tensor([[1, 2, 3], [4, 5, 0]]), np.array([0, 0])).shape
torch.Size([2, 3, 16])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .kv_cache import CachedModel
from .lean_cache import SlotCache, plain_weights

__all__ = ["LeanLlama", "lean_model", "supports"]


def supports(model: Any) -> bool:
    """Whether ``model`` is a plain ``LlamaForCausalLM`` this loop reproduces."""
    from transformers import LlamaForCausalLM

    if type(model) is not LlamaForCausalLM or model.training:
        return False
    if not plain_weights(model):  # spread over devices or offloaded: the general cache
        return False
    cfg = model.config
    impl = getattr(cfg, "_attn_implementation", "eager") or "eager"
    return impl in ("sdpa", "eager") and getattr(cfg, "pretraining_tp", 1) == 1


def lean_model(model: Any) -> Any:
    """A :class:`LeanLlama` for a supported model, else the general ``CachedModel``."""
    return LeanLlama(model) if supports(model) else CachedModel(model)


class LeanLlama(SlotCache):
    """``LlamaForCausalLM`` decoding with a position-indexed KV cache for a batch of rows.

    ``length[r]``: tokens of row ``r`` whose keys and values sit, correct, at slots
    ``0 .. length[r] - 1``. :meth:`forward` writes new tokens from per-row start slots and returns
    their logits without changing ``length``.
    """

    def __init__(self, model: Any) -> None:
        if not supports(model):
            raise ValueError(f"LeanLlama needs a LlamaForCausalLM in eval mode, got {type(model).__name__}")
        self.model = model
        self.core = model.model
        attn = self.core.layers[0].self_attn
        self.head_dim, self.scaling = int(attn.head_dim), float(attn.scaling)
        cfg = model.config
        self.n_heads, self.n_kv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.layers = list(self.core.layers)
        self.n_cache_layers, self.kv_heads = len(self.layers), self.n_kv
        p = next(model.parameters())
        self.dtype, self.device_ = p.dtype, p.device
        self._init_slots()

    def _alloc(self, batch: int, capacity: int) -> None:
        # rotary tables for slots 0 .. capacity-1, from the model's own rotary embedding (each entry is
        # inv_freq * position, so a table lookup gives the same numbers as computing it per call)
        probe = torch.zeros(1, dtype=self.dtype, device=self.device_)
        cos, sin = self.core.rotary_emb(probe, torch.arange(capacity, device=self.device_)[None])
        self._cos, self._sin = cos[0], sin[0]  # [capacity, head_dim]
        super()._alloc(batch, capacity)

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty caches for ``batch`` rows of up to ``capacity`` tokens each plus ``spare`` slots (as
        ``CachedModel.reset``), in the model's current dtype and device: it may have moved since."""
        p = next(self.model.parameters())
        self.dtype, self.device_ = p.dtype, p.device
        self._reset_slots(batch, capacity + spare)

    def release(self) -> None:
        self._release_slots()

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (local indices, increasing)."""
        self._select_slots(keep)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
                valid: np.ndarray | None = None) -> torch.Tensor:
        """Logits ``[R, W, V]`` of ``tokens`` ``[R, W]`` written at slots ``start[r] + j``; token ``j`` of
        row ``r`` attends to slots ``0 .. start[r] + j``. ``last_only``: logits of the last column only.
        ``valid`` (as ``CachedModel.forward``) changes nothing: padded slots are simply overwritten."""
        R, W = tokens.shape
        start = np.asarray(start, dtype=np.int64)
        top = int(start.max()) + W  # slots 0 .. top-1 are read
        if top > self.capacity:
            self.ensure_capacity(top)
        dev = self.device_
        pos = torch.as_tensor(start, device=dev)[:, None] + torch.arange(W, device=dev)[None, :]  # [R, W]
        uniform = bool((start == start[0]).all())
        if uniform and W == 1:
            mask = None  # one new token per row, all at the same slot: it sees every slot < top
        else:
            keys = torch.arange(top, device=dev)
            mask = keys[None, None, None, :] <= pos[:, None, :, None]  # [R, 1, W, top]
        x = F.embedding(tokens.to(dev), self.core.embed_tokens.weight)  # [R, W, D]
        cos, sin = self._cos[pos], self._sin[pos]  # [R, W, head_dim] each
        rows = torch.arange(R, device=dev)[:, None]  # [R, 1]
        nq = self.n_heads * self.head_dim
        for i, layer in enumerate(self.layers):  # the modules' live weights: in-place training and dtype moves show
            attn, mlp, n1, n2 = layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm
            h = _rms_norm(x, n1.weight, n1.variance_epsilon)
            q = _linear(h, attn.q_proj).view(R, W, self.n_heads, self.head_dim).transpose(1, 2)  # [R, H, W, hd]
            k = _linear(h, attn.k_proj).view(R, W, self.n_kv, self.head_dim).transpose(1, 2)  # [R, Hkv, W, hd]
            v = _linear(h, attn.v_proj).view(R, W, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            if uniform:  # write slots start .. start+W-1 of every row
                s0 = int(start[0])
                self.k[i][:, :, s0 : s0 + W] = k
                self.v[i][:, :, s0 : s0 + W] = v
            else:  # per-row slots: [R, Hkv, W, hd] scattered at pos
                self.k[i][rows, :, pos] = k.transpose(1, 2)
                self.v[i][rows, :, pos] = v.transpose(1, 2)
            K, V = self.k[i][:, :, :top], self.v[i][:, :, :top]  # [R, Hkv, top, hd]
            a = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.n_kv != self.n_heads)  # [R, H, W, hd]
            x = x + _linear(a.transpose(1, 2).reshape(R, W, nq), attn.o_proj)
            h = _rms_norm(x, n2.weight, n2.variance_epsilon)
            x = x + _linear(mlp.act_fn(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj)
        if last_only:
            x = x[:, -1:]
        head = self.model.lm_head
        return F.linear(_rms_norm(x, self.core.norm.weight, self.core.norm.variance_epsilon), head.weight,
                        head.bias)  # [R, W or 1, V]


def _linear(x: torch.Tensor, m: Any) -> torch.Tensor:
    """``m(x)`` for an ``nn.Linear`` without the module-call overhead."""
    return F.linear(x, m.weight, m.bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: in float32, then back to the input dtype and scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
