"""A lean decoding loop for Llama-architecture drafts: the draft's weights and layers, without the
framework around them.

A draft step on CPU with a small model is mostly overhead: building masks and cache objects, output
dataclasses, hooks. For ``LlamaForCausalLM`` this module runs the model's own submodules (embedding,
rotary embedding, RMSNorms, q/k/v/o projections, MLP, head) around a KV cache of fixed tensors
indexed by position (gpt-fast style): writing a token at slot ``p`` overwrites whatever a rejected
draft left there, so rollback is just moving ``length`` back. Same interface as
:class:`speculate.domains.text.models.kv_cache.CachedModel`; :func:`lean_model` picks it when the model allows.

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

from speculate.verify.device import upload

from .cuda_graphs import StepGraphs
from .kv_cache import CachedModel
from .lean_cache import SlotCache, plain_weights
from .probe import probe, remembered

__all__ = ["STATIC_SLOTS", "STATIC_WIDTH", "LeanLlama", "lean_model", "static_target", "supports"]

STATIC_WIDTH = 16  #: the widest block a static step runs (wider ones, prefills, run the dynamic forward)
STATIC_SLOTS = 128  #: static buffers' capacity is a multiple of this


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


def static_target(model: Any) -> LeanLlama | None:
    """A :class:`LeanLlama` with static steps for a supported target whose logits it reproduces on
    the cache check (ragged rows, a rollback, one row), else None. Checked once per model, dtype
    and device."""
    if not supports(model):
        return None
    return _static(model) if remembered(model, "static", lambda: probe(model, _static)) is None else None


def _static(model: Any) -> LeanLlama:
    lm = LeanLlama(model)
    lm.use_static()
    return lm


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
        self.graphs: StepGraphs | None = None  # static steps (use_static)
        self._capture: bool | None = None  # use_static's choice (kept when the model changes device)
        self._weights: tuple[int, ...] = ()  # the weights' addresses when the buffers were allocated
        self._epoch = 0  # counts allocations (a freed buffer's address may come back for a new one)
        self._init_slots()

    def _alloc(self, batch: int, capacity: int) -> None:
        # rotary tables for slots 0 .. capacity-1, from the model's own rotary embedding (each entry is
        # inv_freq * position, so a table lookup gives the same numbers as computing it per call)
        self._epoch += 1  # new buffers and tables: graphs recorded on the old ones must not replay
        probe = torch.zeros(1, dtype=self.dtype, device=self.device_)
        cos, sin = self.core.rotary_emb(probe, torch.arange(capacity, device=self.device_)[None])
        self._cos, self._sin = cos[0], sin[0]  # [capacity, head_dim]
        super()._alloc(batch, capacity)

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty caches for ``batch`` rows of up to ``capacity`` tokens each plus ``spare`` slots (as
        ``CachedModel.reset``), in the model's current dtype and device: it may have moved since.
        Static steps (:meth:`use_static`) keep buffers of the same shape (stale slots are masked,
        never read), so graphs recorded for them replay in the next generation too, unless a weight
        has new storage (a move or a cast: recorded graphs read the old addresses) or the model is on
        another device (the static steps follow it)."""
        p = next(self.model.parameters())
        need = capacity + spare
        if self.graphs is not None:
            need = -(-need // STATIC_SLOTS) * STATIC_SLOTS  # fewer distinct shapes, fewer recordings
            weights = tuple(w.data_ptr() for w in self.model.parameters())  # what recorded graphs read
            if (self.k and self.k[0].shape[0] == batch and self.capacity == need
                    and (self.dtype, self.device_) == (p.dtype, p.device) and weights == self._weights):
                self.length = np.zeros(batch, np.int64)
                return
            self._weights = weights  # moved or cast weights: new buffers (a new epoch), graphs recorded anew
            if self.graphs.device != p.device:
                self.graphs = StepGraphs(self._step, p.device, self._capture)
        self.dtype, self.device_ = p.dtype, p.device
        self._reset_slots(batch, need)

    def use_static(self, on: bool = True, capture: bool | None = None) -> None:
        """Run blocks of up to :data:`STATIC_WIDTH` tokens as static steps (:meth:`_step`), recorded
        as CUDA graphs on a GPU (``capture`` None) or run eagerly (``capture`` False; the CPU)."""
        self.graphs = StepGraphs(self._step, self.device_, capture) if on else None
        self._capture = capture
        self.k, self.v, self.capacity = [], [], 0  # the next reset allocates for static steps

    def join_refusal(self) -> str | None:
        if self.graphs is not None:
            return "static steps (cuda_graphs=True) keep buffers of one shape: rows cannot join a running batch"
        return None

    def release(self) -> None:
        if self.graphs is None:  # static steps keep their buffers for the next generation
            self._release_slots()

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (local indices, increasing). Static steps move the kept rows
        to the front of the same buffers (recorded graphs read them there)."""
        if self.graphs is None:
            self._select_slots(keep)
            return
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device_)
        for t in (*self.k, *self.v):
            t[: len(keep)] = t.index_select(0, idx)
        self.length = self.length[keep]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
                valid: np.ndarray | None = None) -> torch.Tensor:
        """Logits ``[R, W, V]`` of ``tokens`` ``[R, W]`` written at slots ``start[r] + j``; token ``j`` of
        row ``r`` attends to slots ``0 .. start[r] + j``. ``last_only``: logits of the last column only.
        ``valid`` (as ``CachedModel.forward``) changes nothing: padded slots are simply overwritten."""
        R, W = tokens.shape
        start, top, s0, uniform = self._span(start, W)  # slots 0 .. top-1 are read
        dev = self.device_
        pos = upload(start, dev)[:, None] + torch.arange(W, device=dev)[None, :]  # [R, W]
        if self.graphs is not None and W <= STATIC_WIDTH:
            out = self.graphs(upload(tokens, dev), pos, self.k[0].shape[0], self._epoch)
            return out[:, -1:] if last_only else out
        if uniform and W == 1:
            mask = None  # one new token per row, all at the same slot: it sees every slot < top
        else:
            keys = torch.arange(top, device=dev)
            mask = keys[None, None, None, :] <= pos[:, None, :, None]  # [R, 1, W, top]
        rows, at = (None, None) if uniform else (torch.arange(R, device=dev)[:, None], pos)  # [R, 1], [R, W]
        return self._run(upload(tokens, dev), pos, mask, (s0, rows, at, top), last_only)

    def _step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The static step: logits ``[b, W, V]`` of ``tokens`` ``[b, W]`` at positions ``pos`` ``[b, W]``
        for the first ``b`` buffer rows, attending over every slot through a mask (slot <= position):
        fixed shapes and addresses, no host synchronisation (what a CUDA graph records)."""
        b = tokens.shape[0]
        slots = torch.arange(self.capacity, device=pos.device)
        mask = slots[None, None, None, :] <= pos[:, None, :, None]  # [b, 1, W, C]
        rows = torch.arange(b, device=pos.device)[:, None]  # [b, 1]
        return self._run(tokens, pos, mask, (0, rows, pos, None), False)  # all C slots: views of the buffers

    def _run(self, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
             at: tuple[int, torch.Tensor | None, torch.Tensor | None, int | None],
             last_only: bool) -> torch.Tensor:
        """The layers on ``tokens`` ``[R, W]`` at ``pos``; each layer's new keys and values are written
        where ``at = (s0, rows, pos, top)`` says (:meth:`SlotCache._write`) and attended to over slots
        ``0 .. top-1`` (None: every slot)."""
        R, W = tokens.shape
        s0, rows, wpos, top = at
        x = F.embedding(tokens, self.core.embed_tokens.weight)  # [R, W, D]
        cos, sin = self._cos[pos], self._sin[pos]  # [R, W, head_dim] each
        nq = self.n_heads * self.head_dim
        for i, layer in enumerate(self.layers):  # the modules' live weights: in-place training and dtype moves show
            attn, mlp, n1, n2 = layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm
            h = _rms_norm(x, n1.weight, n1.variance_epsilon)
            q = _linear(h, attn.q_proj).view(R, W, self.n_heads, self.head_dim).transpose(1, 2)  # [R, H, W, hd]
            k = _linear(h, attn.k_proj).view(R, W, self.n_kv, self.head_dim).transpose(1, 2)  # [R, Hkv, W, hd]
            v = _linear(h, attn.v_proj).view(R, W, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            K, V = self._write(i, k, v, s0, rows, wpos, R)  # [R, Hkv, C, hd]
            if top is not None:
                K, V = K[:, :, :top], V[:, :, :top]  # [R, Hkv, top, hd]
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
