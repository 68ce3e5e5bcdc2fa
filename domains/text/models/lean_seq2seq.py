"""A lean decoding loop for Whisper and BART decoders: the target's (``WhisperForConditionalGeneration``,
``BartForConditionalGeneration``) or a distil-whisper draft's (``WhisperForCausalLM`` reading the
target's encoder), without the framework around them.

A decoder step of a small model on CPU is mostly overhead: cache objects, mask building, output
dataclasses, hooks (most of a draft step of the embedded speech pair). This loop runs
the model's own submodules' weights (token and position embeddings, layer norms, q/k/v/out
projections of self- and cross-attention, fc1/fc2, the output head) around fixed tensors indexed by
position, as ``lean_llama.py`` does for Llama: writing a token at slot ``p`` overwrites whatever a
rejected draft left there, so rollback is moving ``length`` back. Cross-attention keys and values are
computed once per row, at :meth:`LeanSeq2Seq.reset`, from the rows' encoder output, and follow the
rows through :meth:`LeanSeq2Seq.select`. The two layouts differ only where the flags of ``_Layout``
say: Whisper normalises before each block and after the last (pre-LN), BART after each block
(post-LN), scales its token embeddings, normalises them with the positions, offsets its position
table by 2, adds ``final_logits_bias`` and masks padded source tokens in cross-attention.

Same interface as :class:`~speculate.domains.text.models.encoder_decoder.CachedSeq2Seq` (``encoder`` set
before ``reset``); :func:`lean_seq2seq` picks it when the model allows and when it gives the
transformers forward's logits on the probe of :func:`~speculate.domains.text.models.encoder_decoder.check_seq2seq`
(ragged rows of different encoder inputs, a rollback, a dropped row), else the general cache.

>>> import numpy as np, torch
>>> from transformers import WhisperConfig, WhisperForConditionalGeneration
>>> from speculate.domains.text.models.encoder_decoder import encode
>>> cfg = WhisperConfig(vocab_size=20, d_model=16, encoder_layers=1, decoder_layers=1,
...                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
...                     decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=6,
...                     max_target_positions=12, decoder_start_token_id=1, pad_token_id=0)
>>> m = WhisperForConditionalGeneration(cfg).eval()
>>> lm = LeanSeq2Seq(m)
>>> lm.encoder = encode(m, {"input_features": torch.randn(2, 8, 12)})
>>> lm.reset(batch=2, capacity=8)
>>> lm.forward(torch.tensor([[1, 2, 3], [1, 5, 0]]), np.array([0, 0])).shape
torch.Size([2, 3, 20])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .encoder_decoder import CachedSeq2Seq, EncoderState, _decoder, probe_encoder
from .lean_cache import SlotCache, plain_weights
from .probe import probe, remembered

__all__ = ["LeanSeq2Seq", "lean_seq2seq", "supports"]


def _kinds() -> tuple[type, ...]:
    from transformers import BartForConditionalGeneration, WhisperForCausalLM, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration, WhisperForCausalLM, BartForConditionalGeneration


def supports(model: Any) -> bool:
    """Whether ``model`` is a Whisper or BART decoder this loop reproduces (in eval mode, on one
    device). Subclasses are not assumed to keep the forward."""
    if type(model) not in _kinds() or model.training:
        return False
    if not plain_weights(model):  # spread over devices or offloaded: the general cache
        return False
    impl = getattr(model.config, "_attn_implementation", "eager") or "eager"
    return impl in ("sdpa", "eager")


def lean_seq2seq(model: Any) -> Any:
    """A :class:`LeanSeq2Seq` for a supported model whose logits it reproduces on the probe, else the
    general :class:`CachedSeq2Seq`. The probe runs once per model, dtype and device."""
    if not supports(model):
        return CachedSeq2Seq(model)
    why = remembered(model, "lean", lambda: probe(model, LeanSeq2Seq, probe_encoder))
    return LeanSeq2Seq(model) if why is None else CachedSeq2Seq(model)


class LeanSeq2Seq(SlotCache):
    """A Whisper or BART decoder with a position-indexed self-attention cache and per-row cross-attention
    keys and values, for a batch of rows.

    ``length[r]``: decoder tokens of row ``r`` whose keys and values sit, correct, at slots
    ``0 .. length[r] - 1``. :meth:`forward` writes new tokens from per-row start slots and returns
    their logits without changing ``length``. ``encoder``: the rows' :class:`EncoderState`, set
    before :meth:`reset`.
    """

    def __init__(self, model: Any) -> None:
        if not supports(model):
            raise ValueError("LeanSeq2Seq needs a WhisperForConditionalGeneration, WhisperForCausalLM or "
                             f"BartForConditionalGeneration in eval mode on one device, got {type(model).__name__}")
        self.model = model
        self.dec = _decoder(model)
        self.layers = list(self.dec.layers)
        attn = self.layers[0].self_attn
        self.n_heads, self.head_dim, self.scaling = int(attn.num_heads), int(attn.head_dim), float(attn.scaling)
        self.lay = _layout(model, self.dec)
        self.max_pos = int(self.dec.embed_positions.weight.shape[0]) - self.lay.offset
        self.encoder: EncoderState | None = None
        self.n_cache_layers, self.kv_heads = len(self.layers), self.n_heads
        p = next(model.parameters())
        self.dtype, self.device_ = p.dtype, p.device
        self._init_slots()  # self-attention: per layer [R, H, capacity, hd]
        self.w: Any = None  # the weights as they are at each reset
        self.ck: list[torch.Tensor] = []  # per layer [R, H, S, hd]: cross-attention, once per row
        self.cv: list[torch.Tensor] = []
        self.src_mask: torch.Tensor | None = None  # [R, 1, 1, S] bool: source tokens (BART; None: all)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[R, W, m * D] -> [R, m * H, W, hd]"""
        R, W, _ = x.shape
        return x.view(R, W, -1, self.head_dim).transpose(1, 2)

    @torch.inference_mode()
    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty self-attention caches for ``batch`` rows (whose encoder state is already set) and
        their cross-attention keys and values."""
        if self.encoder is None or self.encoder.hidden.shape[0] != batch:
            raise RuntimeError("set the encoder state of every row before reset()")
        p = next(self.model.parameters())  # the model may have moved since
        self.dtype, self.device_ = p.dtype, p.device
        self.w, self.lay = _weights(self.model, self.dec), _layout(self.model, self.dec)  # buffers move as copies
        self._reset_slots(batch, capacity + spare)
        enc = self.encoder.hidden.to(p.device, p.dtype)  # [R, S, D]
        cross = [layer.encoder_attn for layer in self.layers]
        self.ck = [self._heads(F.linear(enc, a.k_proj.weight, a.k_proj.bias)) for a in cross]  # [R, H, S, hd]
        self.cv = [self._heads(F.linear(enc, a.v_proj.weight, a.v_proj.bias)) for a in cross]
        m = self.encoder.mask
        self.src_mask = None if m is None or not self.lay.source_mask else m.to(p.device).bool()[:, None, None, :]

    def join_refusal(self) -> str | None:
        return "an encoder-decoder's rows carry encoder states: they do not join a running batch"

    def release(self) -> None:
        """Free the caches and the encoder state."""
        self._release_slots()
        self.ck, self.cv, self.encoder, self.src_mask = [], [], None, None

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (local indices, increasing): caches and encoder states."""
        idx = self._select_slots(keep)
        self.ck, self.cv = [t.index_select(0, idx) for t in self.ck], [t.index_select(0, idx) for t in self.cv]
        assert self.encoder is not None
        self.encoder = self.encoder.select(idx)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, idx)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
                valid: np.ndarray | None = None) -> torch.Tensor:
        """Logits ``[R, W, V]`` of decoder ``tokens`` ``[R, W]`` written at slots ``start[r] + j``; token
        ``j`` of row ``r`` attends to slots ``0 .. start[r] + j`` and to the row's whole encoder output.
        ``last_only``: the last column's logits only. ``valid`` changes nothing: padded slots are
        overwritten."""
        R, W = tokens.shape
        start, top, s0, uniform = self._span(start, W)  # slots 0 .. top-1 are read
        dev = self.device_
        emb, table, head, weights = self.w
        lay = self.lay
        if uniform and top <= self.max_pos:  # every row at the same slots: slices, no index tensors
            pos = rows = None
            x = table[s0 + lay.offset : top + lay.offset]  # [W, D]
            # [W, top]: token j (slot s0 + j) sees slots <= s0 + j
            mask = None if W == 1 else torch.ones(W, top, dtype=torch.bool, device=dev).tril(s0)
        else:
            pos = torch.as_tensor(start, device=dev)[:, None] + torch.arange(W, device=dev)[None, :]  # [R, W]
            mask = torch.arange(top, device=dev)[None, None, None, :] <= pos[:, None, :, None]  # [R, 1, W, top]
            # padded columns past the table (rows near the last position) are never kept: clamp them
            x = table[pos.clamp(max=self.max_pos - 1) + lay.offset]  # [R, W, D]
            rows = torch.arange(R, device=dev)[:, None]  # [R, 1]
        e = F.embedding(tokens.to(dev), emb)  # [R, W, D]
        x = (e if lay.embed_scale == 1.0 else e * lay.embed_scale) + x
        if lay.embed_norm is not None:
            x = _norm(x, lay.embed_norm)
        D = x.shape[-1]
        pre = lay.pre_norm
        for i, (n1, qkv, o_, n2, cq, co, n3, f1, f2, act) in enumerate(weights):
            h = _norm(x, n1) if pre else x
            q, k, v = self._heads(F.linear(h, *qkv)).split(self.n_heads, dim=1)  # [R, H, W, hd] each
            q = q * self.scaling
            K, V = self._write(i, k, v, s0, rows, pos, R)  # slots s0 .. top-1, or per row at pos
            a = F.scaled_dot_product_attention(q, K[:, :, :top], V[:, :, :top],
                                               attn_mask=mask, scale=1.0)  # [R, H, W, hd]
            x = x + F.linear(a.transpose(1, 2).reshape(R, W, D), *o_)
            x, h = (x, _norm(x, n2)) if pre else (_norm(x, n1),) * 2
            q = self._heads(F.linear(h, *cq)) * self.scaling  # cross-attention: the row's source
            a = F.scaled_dot_product_attention(q, self.ck[i], self.cv[i], attn_mask=self.src_mask, scale=1.0)
            x = x + F.linear(a.transpose(1, 2).reshape(R, W, D), *co)
            x, h = (x, _norm(x, n3)) if pre else (_norm(x, n2),) * 2
            x = x + F.linear(act(F.linear(h, *f1)), *f2)
            if not pre:
                x = _norm(x, n3)
        if last_only:
            x = x[:, -1:]
        if lay.final_norm is not None:
            x = _norm(x, lay.final_norm)
        logits = F.linear(x, head)  # [R, W or 1, V]
        return logits if lay.logits_bias is None else logits + lay.logits_bias


@dataclass(frozen=True)
class _Layout:
    """Where the supported decoders differ."""

    pre_norm: bool  #: layer norm before each block (Whisper) or after its residual sum (BART)
    embed_scale: float  #: token embeddings times this (BART with scale_embedding: sqrt(d))
    offset: int  #: rows of the position table before position 0 (BART: 2)
    embed_norm: tuple[Any, ...] | None  #: a layer norm of embeddings + positions (BART)
    final_norm: tuple[Any, ...] | None  #: a layer norm after the last layer (Whisper)
    logits_bias: torch.Tensor | None  #: added to the logits (BART's final_logits_bias)
    source_mask: bool  #: cross-attention skips padded source tokens (text encoders)


def _layout(model: Any, dec: Any) -> _Layout:
    whisper = "Whisper" in type(model).__name__
    norm = getattr(dec, "layernorm_embedding", None)
    final = getattr(dec, "layer_norm", None)
    return _Layout(pre_norm=whisper,
                   embed_scale=1.0 if whisper else float(getattr(dec.embed_tokens, "embed_scale", 1.0)),
                   offset=int(getattr(dec.embed_positions, "offset", 0) or 0),
                   embed_norm=None if norm is None else _ln(norm), final_norm=None if final is None else _ln(final),
                   logits_bias=getattr(model, "final_logits_bias", None), source_mask=not whisper)


def _lin(m: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight, m.bias


def _ln(m: Any) -> tuple[Any, ...]:
    return m.normalized_shape, m.weight, m.bias, m.eps


def _qkv(a: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight and bias for q, k and v (Whisper's k_proj has no bias), concatenated again only
    when one of them has changed (a new tensor, or an in-place update: its version counter)."""
    parts = [t for t in (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.q_proj.bias, a.k_proj.bias,
                         a.v_proj.bias) if t is not None]
    try:
        key: Any = tuple((t.data_ptr(), t._version, t.dtype) for t in parts)
    except RuntimeError:  # inference tensors keep no version counter: concatenate every time
        key = None
    memo = a.__dict__.get("_speculate_qkv")
    if memo is None or key is None or memo[0] != key:
        kb = a.k_proj.bias if a.k_proj.bias is not None else torch.zeros_like(a.q_proj.bias)
        with torch.no_grad():
            fused = (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                     torch.cat([a.q_proj.bias, kb, a.v_proj.bias]))
        memo = (key, fused)
        a.__dict__["_speculate_qkv"] = memo
    return memo[1]


def _weights(model: Any, dec: Any) -> tuple[Any, ...]:
    """The parameters a forward reads, without a module attribute lookup per use: the modules' own
    Parameter objects (in-place training and dtype moves show), except q, k and v, concatenated
    into one projection when the loop is built and at every reset."""
    layers = tuple((_ln(la.self_attn_layer_norm), _qkv(la.self_attn), _lin(la.self_attn.out_proj),
                    _ln(la.encoder_attn_layer_norm),
                    _lin(la.encoder_attn.q_proj), _lin(la.encoder_attn.out_proj), _ln(la.final_layer_norm),
                    _lin(la.fc1), _lin(la.fc2), la.activation_fn) for la in dec.layers)
    return dec.embed_tokens.weight, dec.embed_positions.weight, model.get_output_embeddings().weight, layers


def _norm(x: torch.Tensor, ln: tuple[Any, ...]) -> torch.Tensor:
    """An ``nn.LayerNorm`` (its ``_ln`` tuple) without the module-call overhead."""
    return F.layer_norm(x, *ln)
