"""An EAGLE-style feature draft that lives on a frozen target (Li et al., arXiv:2401.15077).

Column ``j`` of the draft reads the target's feature ``f`` at position ``p_j`` (the input of its
output embedding, see ``heads.target_features``) and the embedding of the next token
``x_{p_j+1}``: ``fc(concat(f, e)) -> one decoder layer -> f̂_{p_j+1}``, the predicted next feature,
and its logits are the target's own output embedding applied to ``f̂`` (law of ``x_{p_j+2}``).
Drafting feeds ``f̂`` back as the next column's feature. The token embedding and the output
embedding are the target's (frozen, shared, not saved); the draft owns ``fc`` and the layer
(pre-norm RMSNorm, multi-head attention with RoPE at the given positions, SiLU-gated MLP).

:class:`FeatureCache` is the draft's position-indexed KV cache: a column writes its key and value
at a given slot, then attends to the slots a boolean mask makes visible, so a caller drafts
chains (causal masks) or token trees level by level (tree masks), and commits an accepted tree
path with :meth:`FeatureCache.move`. Fresh drafts start as the target's head one step late
(``fc`` passes the feature through, the layer's output projections are zero).

>>> from speculate.domains.text.conformance import tiny_llama
>>> target = tiny_llama(vocab=16)
>>> draft = FeatureDraft.for_target(target)
>>> ids = torch.tensor([[1, 2, 3, 4]])
>>> feats, logits = target_features(target, ids)
>>> pos = torch.arange(3)[None]
>>> hidden, out = draft(feats[:, :-1], ids[:, 1:], pos)           # teacher forcing, causal
>>> hidden.shape, out.shape
(torch.Size([1, 3, 32]), torch.Size([1, 3, 16]))
>>> torch.allclose(out, logits[:, :-1], atol=1e-6)                # fresh: the target, one step late
True
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..models.facts import execution_device, text_config
from ..models.slots import FeatureCache
from .distill import acceptance, divergence_loss
from .feature_decode import FoldedLayer, frozen_call, weights_key
from .heads import (
    check_summary,
    fit_on_target,
    load_config,
    load_weights,
    output_weight,
    save_module,
    target_features,
    target_summary,
    training_data,
)

CONFIG_NAME, WEIGHTS_NAME = "feature_draft_config.json", "feature_draft.safetensors"


def rope_theta(config: Any) -> float:
    """The RoPE base of a config: ``rope_parameters["rope_theta"]``, ``rope_theta``, else 10000."""
    cfg = text_config(config)
    params = getattr(cfg, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):  # per layer type (Gemma 3)
        params = next(iter(params.values()))
    return float(params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0)


class Dense(torch.nn.Module):
    """A linear layer that keeps its weight as ``weight_t`` ``[in, out]``: ``x @ weight_t + bias``.

    The decoding form (``feature_decode``) multiplies by these ``[in, out]`` matrices directly, or
    folds them.
    Initialised as ``torch.nn.Linear`` (the same random draws); ``weight`` is the ``[out, in]`` view;
    checkpoints saved with ``weight`` load too.
    """

    def __init__(self, n_in: int, n_out: int, bias: bool = True) -> None:
        super().__init__()
        lin = torch.nn.Linear(n_in, n_out, bias=bias)
        self.weight_t = torch.nn.Parameter(lin.weight.detach().T.contiguous())  # [in, out]
        self.register_parameter("bias", lin.bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_t.T  # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _lin(x, self)

    def _load_from_state_dict(self, state: dict[str, Any], prefix: str, *args: Any) -> None:
        if f"{prefix}weight" in state:  # saved as torch.nn.Linear: [out, in]
            state[f"{prefix}weight_t"] = state.pop(f"{prefix}weight").T
        super()._load_from_state_dict(state, prefix, *args)


def _lin(x: torch.Tensor, m: Dense) -> torch.Tensor:
    """``m(x)`` without the module-call overhead (a draft step is mostly overhead on a CPU): the
    parameters are read from the module's own table (the live tensors, without the attribute
    fallback a module's parameters go through)."""
    p = m._parameters
    y = torch.matmul(x, p["weight_t"])
    b = p["bias"]
    return y if b is None else y + b


def _pick(t: torch.Tensor, keep: torch.Tensor | np.ndarray, dim: int) -> torch.Tensor:
    """Entry ``keep[r]`` of dimension ``dim`` for each row ``r`` (dimension 0) of ``t``, that
    dimension kept with size 1 (a slice when ``keep`` is on the host and every row keeps the last)."""
    n = t.shape[dim]
    if isinstance(keep, np.ndarray) and bool((keep == n - 1).all()):
        return t.narrow(dim, n - 1, 1)
    rows = torch.arange(t.shape[0], device=t.device)
    return t[(rows,) + (slice(None),) * (dim - 1) + (torch.as_tensor(keep, device=t.device),)].unsqueeze(dim)


class FeatureDraft(torch.nn.Module):
    """``fc(concat(feature, token embedding))`` -> one decoder layer -> next feature, logits.

    ``config``: hidden_size, vocab_size, n_heads, intermediate_size, rope_theta, rms_norm_eps and
    the target's family and depth. ``embed`` / ``lm_head``: the target's input and output
    embeddings, kept by reference (not submodules: ``state_dict`` holds the draft's own weights).
    """

    def __init__(self, config: dict[str, Any], embed: torch.nn.Module, lm_head: torch.nn.Module) -> None:
        super().__init__()
        self.config = dict(config)
        H, I, nh = config["hidden_size"], config["intermediate_size"], config["n_heads"]
        if H % nh:
            raise ValueError(f"hidden size {H} is not a multiple of n_heads {nh}")
        self.n_heads, self.head_dim = nh, H // nh
        self.fc = Dense(2 * H, H)
        self.attn_norm = torch.nn.RMSNorm(H, eps=config["rms_norm_eps"])
        self.qkv = Dense(H, 3 * H, bias=False)
        self.proj = Dense(H, H, bias=False)
        self.mlp_norm = torch.nn.RMSNorm(H, eps=config["rms_norm_eps"])
        self.gate_up = Dense(H, 2 * I, bias=False)
        self.down = Dense(I, H, bias=False)
        with torch.no_grad():  # start as the identity on the feature: the target, one step late
            self.fc.weight.zero_()
            self.fc.weight[:, :H].copy_(torch.eye(H))
            self.fc.bias.zero_()
            self.proj.weight.zero_()
            self.down.weight.zero_()
        self._shared = (embed, lm_head)  # a tuple: not registered, not saved

    def new_cache(self, batch: int = 0, capacity: int = 0) -> FeatureCache:
        """A :class:`FeatureCache` of this draft's shape, device and dtype, reset."""
        w = self.fc.weight
        cache = FeatureCache(self.n_heads, self.head_dim, w.device, w.dtype)
        cache.reset(batch, capacity)
        return cache

    def rope(self, positions: torch.Tensor | np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ``[R, W, 1, 1, head_dim]`` of rotate-half RoPE at ``positions`` ``[R, W]``
        (the sine's first half negated: ``rotate_half(x) * sin == x.roll(d / 2) * signed_sin``, the same
        numbers), on the draft's device."""
        positions = torch.as_tensor(positions, device=self.fc._parameters["weight_t"].device)
        ft = torch.float64 if dtype == torch.float64 else torch.float32
        d = self.head_dim
        inv = self.config["rope_theta"] ** (-torch.arange(0, d, 2, device=positions.device, dtype=ft) / d)
        ang = positions[..., None].to(ft) * inv  # [R, W, d/2]
        sin = ang.sin()
        cos = torch.cat([ang.cos()] * 2, dim=-1)[:, :, None, None]  # [R, W, 1, 1, d]
        sin = torch.cat([-sin, sin], dim=-1)[:, :, None, None]
        return cos.to(dtype), sin.to(dtype)

    def attention(self, x: torch.Tensor, positions: torch.Tensor | np.ndarray, cache: FeatureCache | None,
                  slots: torch.Tensor | np.ndarray | None, visible: torch.Tensor | None,
                  keep: torch.Tensor | np.ndarray | None = None) -> torch.Tensor:
        """The attention block's output ``[R, W, H]`` (``[R, 1, H]`` with ``keep``: only column
        ``keep[r]`` of each row queries; every column writes its key and value)."""
        R, W, H = x.shape
        qkv = _lin(x, self.qkv).view(R, W, 3, self.n_heads, self.head_dim)  # [R, W, 3, nh, d]
        cos, sin = self.rope(positions, x.dtype)  # [R, W, 1, 1, d]
        qk = qkv[:, :, :2]  # queries and keys rotated together
        qk = (qk * cos + qk.roll(self.head_dim // 2, dims=-1) * sin).permute(2, 0, 3, 1, 4)  # [2, R, nh, W, d]
        q, k = qk[0], qk[1]  # [R, nh, W, d]
        v = qkv[:, :, 2].transpose(1, 2)  # [R, nh, W, d]
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [R, nh, W, d]
            if keep is not None:
                y = _pick(y, keep, 2)  # [R, nh, 1, d]
        else:
            if slots is None:
                raise ValueError("with a cache, pass slots [R, W] (and visible [R, W, C'], or None: causal)")
            if cache.form != "modules":
                cache.claim("modules")
            s = torch.as_tensor(slots, device=x.device)
            top = int(s.max()) + 1
            cache.ensure_capacity(max(top, 0 if visible is None else visible.shape[-1]))
            rows = torch.arange(R, device=x.device)[:, None].expand(R, W)  # [R, W]
            cache.keys[rows, :, s] = k.transpose(1, 2).to(cache.dtype)  # [R, W, nh, d]
            cache.values[rows, :, s] = v.transpose(1, 2).to(cache.dtype)
            if visible is None:  # causal: each column sees the slots up to its own
                visible = torch.arange(top, device=x.device)[None, None, :] <= s[:, :, None]
            mask = visible.to(device=x.device, dtype=torch.bool)[:, None]  # [R, 1, W, C]
            if keep is not None:
                q, mask = _pick(q, keep, 2), _pick(mask, keep, 2)  # [R, nh, 1, d], [R, 1, 1, C]
            C = mask.shape[-1]
            y = F.scaled_dot_product_attention(q, cache.keys[:, :, :C], cache.values[:, :, :C],
                                               attn_mask=mask)  # [R, nh, W or 1, d]
        return _lin(y.transpose(1, 2).reshape(R, y.shape[2], H), self.proj)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor | np.ndarray,
                cache: FeatureCache | None = None, slots: torch.Tensor | np.ndarray | None = None,
                visible: torch.Tensor | None = None, keep: torch.Tensor | np.ndarray | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden [R, W, H], logits [R, W, V])`` of columns (feature at ``positions``, next token).

        Without ``cache``: causal attention over the ``W`` columns. With one: column ``j`` of row ``r``
        writes its key/value at slot ``slots[r, j]`` first, then attends to the slots ``s <
        visible.shape[-1]`` where ``visible[r, j, s]`` (``visible=None``: every slot up to ``slots[r,
        j]``, the causal case of chains). ``positions`` and ``slots`` as NumPy arrays (on the host)
        spare device syncs when the draft runs on an accelerator. ``keep`` ``[R]`` (a tensor, or a NumPy
        array on the host): return only column ``keep[r]`` of each row (``[R, 1, H]``, ``[R, 1, V]``;
        every column still writes its key and value), sparing the rest of the layer and the output
        embedding on columns nobody reads.

        With a cache and without autograd (drafting) the layer runs its decoding form, the same
        function from folded weights (:mod:`~speculate.domains.text.training.feature_decode`).
        """
        if cache is not None and not torch.is_grad_enabled():
            return self.folded()(features, tokens, positions, cache, slots, visible, keep)
        embed, lm_head = self._shared
        w = self.fc._parameters["weight_t"]
        e = frozen_call(embed, tokens.to(w.device)).to(w.dtype)  # [R, W, H]
        x = _lin(torch.cat([features.to(w.dtype), e], dim=-1), self.fc)  # [R, W, H]
        a = self.attention(self.attn_norm(x), positions, cache, slots, visible, keep)
        x = (x if keep is None else _pick(x, keep, 1)) + a  # [R, W or 1, H]
        gu = _lin(self.mlp_norm(x), self.gate_up)  # [R, W, 2I]: gate, then up
        half = gu.shape[-1] // 2
        x = x + _lin(F.silu(gu[..., :half]) * gu[..., half:], self.down)  # [R, W, H]
        return x, frozen_call(lm_head, x.to(lm_head.weight.dtype))

    def folded(self) -> Any:
        """The decoding form (a ``feature_decode.FoldedLayer``), rebuilt when a parameter changed."""

        f = self.__dict__.get("_folded")
        if f is None or f.key != weights_key(self):
            f = self.__dict__["_folded"] = FoldedLayer(self)
        return f

    @classmethod
    def for_target(cls, target: torch.nn.Module, n_heads: int | None = None,
                   intermediate_size: int | None = None) -> FeatureDraft:
        """A fresh draft for ``target``: its attention heads, MLP width and RoPE base by default."""
        cfg = text_config(target.config)
        H = target_summary(target)["hidden_size"]
        config = {**target_summary(target), "n_heads": n_heads or cfg.num_attention_heads,
                  "intermediate_size": intermediate_size or getattr(cfg, "intermediate_size", 4 * H),
                  "rope_theta": rope_theta(cfg), "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", 1e-6))}
        draft = cls(config, target.get_input_embeddings(), target.get_output_embeddings())
        w = output_weight(target)
        return draft.to(device=w.device, dtype=w.dtype)

    def check_target(self, target: torch.nn.Module) -> None:
        """``ValueError`` unless ``target`` has this config's hidden size and vocabulary."""
        check_summary(self.config, target, "feature draft weights",
                      "train a draft for it with train_feature_draft(target, texts)")
        if target.get_input_embeddings().weight.shape[1] != self.config["hidden_size"]:
            raise ValueError(f"the target's input embeddings have width "
                             f"{target.get_input_embeddings().weight.shape[1]}, not its hidden size "
                             f"{self.config['hidden_size']}: a feature draft needs them equal")

    def save_pretrained(self, folder: str | os.PathLike[str], dtype: torch.dtype | None = None) -> Any:
        """``feature_draft_config.json`` + ``feature_draft.safetensors`` (the draft's own weights)."""
        return save_module(self, folder, self.config, CONFIG_NAME, WEIGHTS_NAME, dtype)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], target: torch.nn.Module) -> FeatureDraft:
        """A saved draft on ``target`` (checked), on its device and dtype, in eval mode."""
        draft = cls(load_config(folder, CONFIG_NAME), target.get_input_embeddings(), target.get_output_embeddings())
        draft.check_target(target)
        return load_weights(draft, folder, WEIGHTS_NAME, target)


# --------------------------------------------------------------------------------------------
# acceptance and training


@torch.no_grad()
def feature_draft_acceptance(target: torch.nn.Module, draft: FeatureDraft, input_ids: torch.Tensor,
                             start: int = 0, temperature: float = 1.0, batch: int = 16) -> tuple[float, float]:
    """``(teacher_forced, rollout)`` mean acceptance over columns ``c >= start`` of ``input_ids`` [B, L].

    Teacher-forced: column ``c`` (true feature ``f_c``, token ``x_{c+1}``) against the target's
    law at ``c + 1``. Rollout: the draft's second step, column (``f̂_{c+1}`` from column ``c``,
    ``x_{c+2}``) seeing the true columns ``0..c`` through the cache, against the target at ``c + 2``.
    """
    sums, counts = np.zeros(2), np.zeros(2)
    for lo in range(0, input_ids.shape[0], batch):
        ids = input_ids[lo:lo + batch]
        feats, logits = target_features(target, ids)  # [b, L, H], [b, L, V]
        b, L = ids.shape
        W, dev = L - 1, draft.fc.weight.device
        pos = torch.arange(L, device=dev).expand(b, L)  # [b, L]
        cache = draft.new_cache(b, 2 * W - 1)
        causal = torch.ones(W, W, dtype=torch.bool, device=dev).tril().expand(b, W, W)
        hid, out = draft(feats[:, :-1], ids[:, 1:], pos[:, :-1], cache, pos[:, :-1], causal)  # [b, W, *]
        vis = torch.cat([torch.ones(W - 1, W, dtype=torch.bool, device=dev).tril(),
                         torch.eye(W - 1, dtype=torch.bool, device=dev)], dim=1)  # [W-1, 2W-1]
        _, out2 = draft(hid[:, :-1], ids[:, 2:], pos[:, 1:-1], cache, W + pos[:, :-2], vis.expand(b, -1, -1))
        for k, (p, q) in enumerate(((logits[:, 1:], out), (logits[:, 2:], out2))):
            a = acceptance(p[:, start:], q[:, start:], temperature)  # [b, W - k - start]
            sums[k] += float(a.sum())
            counts[k] += a.numel()
    tf, roll = sums / np.maximum(counts, 1)
    return float(tf), float(roll)


@dataclass
class FeatureDraftResult:
    """What :func:`train_feature_draft` did: acceptance teacher-forced (before/after) and of the
    draft's second step on its own feature (``alpha_rollout``, after; ``alpha_rollout_before``)."""

    draft: FeatureDraft
    losses: list[float]
    alpha_before: float
    alpha_after: float
    alpha_rollout: float
    seconds: float = 0.0
    alpha_rollout_before: float = float("nan")
    config: dict[str, Any] = field(default_factory=dict)


def train_feature_draft(target: torch.nn.Module, texts, *, tokenizer=None, steps: int = 400, batch_size: int = 16,
                        seq_len: int = 128, lr: float = 1e-3, feature_weight: float = 1.0, token_weight: float = 1.0,
                        divergence: str = "tv", noise: float = 0.0, self_distill: bool = True,
                        temperature: float = 1.0, rng: int | np.random.Generator | None = 0, eval_texts=None,
                        eval_batch: int = 32, log: Callable[[str], None] | None = None,
                        progress: bool | None = None, draft: FeatureDraft | None = None) -> FeatureDraftResult:
    """Train a feature draft (new, or ``draft`` in place) on a frozen ``target``, teacher-forced.

    Windows as in ``heads.train_heads`` (second half sampled from the target when
    ``self_distill``). Columns take features ``f_0..f_{L-2}`` (plus uniform noise in
    ``[-noise, noise]``, EAGLE's fix for exposure bias) and tokens ``x_1..x_{L-1}``; the loss is
    ``feature_weight * smooth_l1(f̂, f_{1..L-1}) + token_weight * divergence(target law at t + 1,
    draft logits at t)``. EAGLE weighs 1 and 0.1 with a cross-entropy token loss; here the token
    term is what acceptance measures (TV by default) and weights 1 and 1 gave the best
    acceptance on the embedded target (0.858 vs 0.767 for the first drafted token; weight 3 gained
    nothing there and lost on the second token), input noise 0.2 (features of RMS 1.3) a little
    more on the second token: see ``TUNING`` in ``benchmarks/text/train_heads.py``. Acceptance
    (:func:`feature_draft_acceptance`) is measured on ``eval_batch`` windows of ``eval_texts``
    (default ``texts``) whose second half the target samples, columns ``c >= seq_len // 2 - 1``.
    Train on windows as long as the contexts drafted from: attention over longer distances than
    trained on loses acceptance.
    """
    if steps < 0 or batch_size < 1 or seq_len < 4 or noise < 0:
        raise ValueError(f"need steps >= 0, batch_size >= 1, seq_len >= 4, noise >= 0; got {steps}, "
                         f"{batch_size}, {seq_len}, {noise}")
    gen, stream, eval_ids = training_data(target, texts, tokenizer, eval_texts, eval_batch, seq_len,
                                          divergence, temperature, rng)
    draft = draft if draft is not None else FeatureDraft.for_target(target)
    draft.check_target(target)
    say, t0 = log or (lambda s: None), time.perf_counter()
    dev = execution_device(target.get_output_embeddings())
    start = seq_len // 2 - 1

    def evaluate() -> tuple[float, float]:
        draft.eval()
        return feature_draft_acceptance(target, draft, eval_ids, start, temperature)

    before = evaluate()
    say(f"feature draft: alpha before = {before[0]:.4f} (rollout {before[1]:.4f})")
    g_noise = gen(5)

    def loss_of(ids: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        x = feats[:, :-1]  # [B, L-1, H]
        if noise:
            x = x + noise * (2 * torch.rand(x.shape, generator=g_noise, device=dev, dtype=x.dtype) - 1)
        pos = torch.arange(seq_len - 1, device=dev).expand(len(ids), -1)  # [B, L-1]
        hid, out = draft(x, ids[:, 1:], pos)  # [B, L-1, H], [B, L-1, V]
        return (feature_weight * F.smooth_l1_loss(hid, feats[:, 1:].to(hid.dtype))
                + token_weight * divergence_loss(logits[:, 1:], out, divergence, temperature).mean())

    losses = fit_on_target(draft, target, stream, gen, loss_of, steps=steps, batch_size=batch_size, seq_len=seq_len,
                           lr=lr, self_distill=self_distill, temperature=temperature, what="feature draft",
                           say=say, progress=progress)
    after = evaluate()
    say(f"feature draft: alpha after = {after[0]:.4f} (rollout {after[1]:.4f})")
    cfg = dict(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, feature_weight=feature_weight,
               token_weight=token_weight, divergence=divergence, noise=noise, self_distill=self_distill,
               temperature=temperature)
    return FeatureDraftResult(draft=draft, losses=losses, alpha_before=before[0], alpha_after=after[0],
                              alpha_rollout=after[1], seconds=time.perf_counter() - t0,
                              alpha_rollout_before=before[1], config=cfg)
