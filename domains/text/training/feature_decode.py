"""The feature draft's decoding form: its layer with the weights folded, for drafting (no autograd).

:class:`~speculate.domains.text.training.feature_draft.FeatureDraft` runs this form when it is called with a
cache and without autograd (what drafting does); training and teacher-forced calls run the modules.
Both compute the same function, up to float rounding (tests/text/test_text_heads.py); exactness
does not depend on it, because the verifier gets the law each draft was sampled from, which is
the one this form computed. At draft sizes on a CPU a step is mostly per-operation overhead, so
the form does fewer operations:

- each RMSNorm's weight (and the ``sqrt(H)`` of ``x / rms(x) = sqrt(H) x / sqrt(|x|^2 + H eps)``) is
  folded into the matrix after it, so a norm is a vector norm, a ``hypot`` and a division;
- each head's query and key columns are reordered so that the pairs rotate-half RoPE rotates
  together, ``(i, i + d/2)``, sit side by side: rotating is then one complex product with
  ``exp(i theta p)`` (a query-key product is the same in any common order of a head's columns; the
  draft's cache holds keys in this order, so a cache serves one form: :class:`FeatureCache`);
- the token half of ``fc`` is a table ``embed(v) W_e + b`` of every token ``v`` (when it holds at
  most ``TOKEN_TABLE_MAX`` numbers), so ``fc`` reads one row and half its matrix;
- the residual additions ride on ``addmm``; 2-D products on rows ``[R * W, H]``;
- RoPE is read as a slice of a table of ``exp(i theta p)`` for consecutive positions.

The folded weights are built once and rebuilt when a parameter of the draft changes (in-place
training, ``load_state_dict``, ``.to``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from speculate.verify.device import upload

from ..models.slots import FeatureCache

#: the largest token table (vocabulary x hidden size) built; larger vocabularies run the embedding and
#: the token half of ``fc`` at each step
TOKEN_TABLE_MAX = 1 << 22


def frozen_call(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` with its parameters detached: gradients reach ``x``, never the target."""
    if not torch.is_grad_enabled():  # drafting: a plain call (functional_call costs more than the layer)
        if "_hf_hook" in module.__dict__:  # device_map / offload: the hook brings the weights
            return module(x)
        if type(module) is torch.nn.Linear:  # without the module-call overhead
            return F.linear(x, module.weight, module.bias)
        if type(module) is torch.nn.Embedding and module.max_norm is None:
            return F.embedding(x, module.weight)
        return module(x)
    params = {n: p.detach() for n, p in module.named_parameters()}
    return torch.func.functional_call(module, params, (x,))


def _unit(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(|x|^2 + c^2)`` along the last axis: with ``c = sqrt(H eps)`` this is RMSNorm without
    its weight, over ``sqrt(H)`` (``x / sqrt(mean(x^2) + eps)``), in three operations."""
    return x / torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), c)


def _host(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()


def weights_key(draft: Any) -> tuple:
    """What identifies the draft's current weights: each parameter's storage, version and dtype (read
    from the submodules' own tables: this runs at every call of the decoding form through
    ``FeatureDraft.forward``, and once per round in ``EagleDraft``)."""
    mods = (*draft._modules.values(), draft._shared[0])  # and the target's token embedding (a table reads it)
    return tuple((p.data_ptr(), p._version, p.dtype) for m in mods for p in m._parameters.values() if p is not None)


class FoldedLayer:
    """The folded weights of one :class:`FeatureDraft` (``[in, out]`` layout), and its decoding step."""

    def __init__(self, draft: Any) -> None:
        self.key = weights_key(draft)
        self.draft = draft
        H, nh, d = draft.config["hidden_size"], draft.n_heads, draft.head_dim
        self.H, self.nh, self.d, self.eps = H, nh, d, draft.config["rms_norm_eps"]
        w = draft.fc.weight_t
        dt, ft = w.dtype, (torch.float64 if w.dtype == torch.float64 else torch.float32)
        with torch.no_grad():
            g = lambda t: t.detach().to(ft)  # noqa: E731
            s1 = math.sqrt(H) * g(draft.attn_norm.weight)[:, None]  # [H, 1]
            qkv = s1 * g(draft.qkv.weight_t)  # [H, 3H]
            half = torch.arange(d // 2, device=w.device)
            pairs = torch.stack([half, half + d // 2], 1).reshape(d)  # [d]: 0, d/2, 1, d/2 + 1, ...
            order = (torch.arange(nh, device=w.device)[:, None] * d + pairs).reshape(H)  # [H]
            q, k, v = qkv[:, :H], qkv[:, H : 2 * H], qkv[:, 2 * H :]
            self.w_fc, self.b_fc = w.detach(), draft.fc.bias.detach()  # [2H, H], [H]
            self.w_f, self.table = self.w_fc[:H], None  # [H, H]: the feature half
            embed = draft._shared[0]
            n = getattr(embed, "num_embeddings", 0)
            if 0 < n * H <= TOKEN_TABLE_MAX:  # [V, H]: embed(v) W_e + b
                e = frozen_call(embed, torch.arange(n, device=w.device)).to(ft)
                self.table = torch.addmm(g(self.b_fc), e, g(self.w_fc[H:])).to(dt)
            self.w_qkv = torch.cat([q[:, order], k[:, order], v], 1).to(dt).contiguous()  # [H, 3H]
            self.w_o = draft.proj.weight_t.detach()  # [H, H]
            self.w_gu = (math.sqrt(H) * g(draft.mlp_norm.weight)[:, None] * g(draft.gate_up.weight_t)).to(dt)
            self.w_down = draft.down.weight_t.detach()  # [I, H]
        self.I = self.w_down.shape[0]
        self.dt, self.dev = dt, w.device
        self.head_dt = draft._shared[1].weight.dtype  # the target's output embedding's
        self.c = torch.tensor(math.sqrt(H * self.eps), device=w.device, dtype=dt)  # [] (hypot's other side)
        self.ct = torch.float64 if dt == torch.float64 else torch.float32  # RoPE's real dtype (complex: 2x)
        self.rope = torch.zeros(0, dtype=torch.complex128 if dt == torch.float64 else torch.complex64)  # [P, 1, d/2]

    def _rope_at(self, pos: np.ndarray) -> torch.Tensor:
        """``exp(i theta p)`` ``[N, 1, d/2]`` (complex) at the positions ``pos`` ``[N]`` (a slice when
        they are consecutive)."""
        n = int(pos.max()) + 1
        if self.rope.shape[0] < n:
            m = max(n, 2 * self.rope.shape[0], 256)
            cos, sin = self.draft.rope(torch.arange(m, device=self.w_fc.device)[None], self.ct)  # [1, m, 1, 1, d]
            h = self.d // 2
            self.rope = torch.complex(cos[0, :, 0, :, :h], sin[0, :, 0, :, h:])  # [m, 1, d/2]
        p0 = int(pos[0])
        if len(pos) == 1 or bool((pos == p0 + np.arange(len(pos))).all()):
            return self.rope.narrow(0, p0, len(pos))
        return self.rope[upload(pos, self.rope.device)]

    def __call__(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor | np.ndarray,
                 cache: FeatureCache, slots: torch.Tensor | np.ndarray | None, visible: torch.Tensor | None = None,
                 keep: torch.Tensor | np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``FeatureDraft.forward`` returns with a cache (same arguments), from the folded weights.
        (Tensor methods such as ``narrow`` stand for slicing: Python indexing costs several times more.)"""
        if slots is None:
            raise ValueError("with a cache, pass slots [R, W] (and visible [R, W, C'], or None: causal)")
        embed, lm_head = self.draft._shared
        H, nh, d, dt, dev = self.H, self.nh, self.d, self.dt, self.dev
        R, W = tokens.shape
        N = R * W
        s = _host(slots)  # [R, W]
        if tokens.device != dev:
            tokens = tokens.to(dev)
        if features.dtype is not dt:
            features = features.to(dt)
        if self.table is not None:  # fc: the tokens' rows of the table, plus features @ W_f
            x = torch.addmm(self.table.index_select(0, tokens.reshape(N)), features.reshape(N, H), self.w_f)
        else:
            e = frozen_call(embed, tokens).to(dt)  # [R, W, H]
            x = torch.addmm(self.b_fc, torch.cat([features, e], dim=-1).view(N, 2 * H), self.w_fc)  # [N, H]
        y = torch.mm(_unit(x, self.c), self.w_qkv)  # [N, 3H]: q, k (pairs side by side), v
        qk = y.narrow(1, 0, 2 * H)
        if dt is not self.ct:
            qk = qk.to(self.ct)
        z = torch.view_as_complex(qk.view(N, 2 * nh, d // 2, 2))  # [N, 2nh, d/2]
        qk = torch.view_as_real(z * self._rope_at(_host(positions).reshape(N))).view(N, 2 * nh, d)  # rotated
        if dt is not self.ct:
            qk = qk.to(dt)
        k, v = qk.narrow(1, nh, nh), y.narrow(1, 2 * H, H).view(N, nh, d)  # [N, nh, d]
        if cache.form != "decoding":
            cache.claim("decoding")
        s0 = int(s[0, 0])
        top = s0 + 1 if N == 1 else int(s.max()) + 1
        cache.ensure_capacity(top if visible is None else max(top, visible.shape[-1]))
        ck, cv = cache.keys, cache.values
        if k.dtype is not ck.dtype:
            k, v = k.to(ck.dtype), v.to(ck.dtype)
        if R == 1 and (W == 1 or bool((s[0] == s0 + np.arange(W)).all())):  # one run of slots
            ck.select(0, 0).narrow(1, s0, W).copy_(k.transpose(0, 1))  # [nh, W, d]
            cv.select(0, 0).narrow(1, s0, W).copy_(v.transpose(0, 1))
        else:
            rows = upload(np.repeat(np.arange(R), W), dev)  # [N]
            st = upload(s.reshape(N), dev)
            ck[rows, :, st] = k  # [N, nh, d]
            cv[rows, :, st] = v
        # the query columns: every column, or column keep[r] of each row r
        kp = None if keep is None else _host(keep)
        Wq = W if kp is None else 1
        if kp is None or W == 1:
            pick, sq = None, s  # sq [R, Wq]: the query columns' slots
        elif bool((kp == W - 1).all()):
            pick, sq = slice(W - 1, None, W), s[:, W - 1 :]  # rows' last columns: a strided view
        else:
            pick, sq = upload(np.arange(R) * W + kp, dev), s[np.arange(R), kp][:, None]  # [R]
        q = qk.narrow(1, 0, nh) if pick is None else qk[pick].narrow(1, 0, nh)  # [R * Wq, nh, d]
        q = q.reshape(R, Wq, nh, d).transpose(1, 2)  # [R, nh, Wq, d]
        if visible is not None:
            C = visible.shape[-1]
            mask = visible.to(device=dev, dtype=torch.bool)  # [R, W, C]
            if kp is not None:
                mask = mask[torch.arange(R, device=dev), upload(kp, dev)][:, None]  # [R, 1, C]
            mask = mask[:, None]  # [R, 1, Wq, C]
        else:
            C = top  # causal over the slots: no mask where every query sits at the last slot
            mask = None if (N == 1 or bool((sq == top - 1).all())) else upload(
                (np.arange(C)[None, None, :] <= sq[:, :, None])[:, None], dev)  # [R, 1, Wq, C]
        a = F.scaled_dot_product_attention(q, ck.narrow(2, 0, C), cv.narrow(2, 0, C),
                                           attn_mask=mask)  # [R, nh, Wq, d]
        a = a.transpose(1, 2).reshape(R * Wq, H)
        if a.dtype is not dt:
            a = a.to(dt)
        x = torch.addmm(x if pick is None else x[pick], a, self.w_o)  # [R * Wq, H]
        gu = torch.mm(_unit(x, self.c), self.w_gu)  # [R * Wq, 2I]: gate, then up
        x = torch.addmm(x, F.silu(gu.narrow(1, 0, self.I)) * gu.narrow(1, self.I, self.I), self.w_down)
        logits = frozen_call(lm_head, x if self.head_dt is dt else x.to(self.head_dt))  # [R * Wq, V]
        return x.view(R, Wq, H), logits.view(R, Wq, -1)
