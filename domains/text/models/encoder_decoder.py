"""Encoder-decoder models in the position-indexed cache: :class:`CachedSeq2Seq` and its probe.

An encoder-decoder (T5 / Flan-T5, BART / mBART, Marian, Whisper, and any ``AutoModelForSeq2SeqLM``
whose decoder takes its positions from one of the schemes below) decodes like a causal LM whose
layers also read a fixed memory per row, the encoder's output. So:

- the encoder runs once per row (:func:`encode`, before the first round); its output and the
  encoder's padding mask (:class:`EncoderState`) stay with the row, and follow it when finished
  rows are dropped (:meth:`CachedSeq2Seq.select`);
- the decoder's self-attention keys and values live in the position-indexed cache of
  ``kv_cache.py`` (row ``r``'s token at position ``p`` in slot ``p``; rollback by length, free);
- its cross-attention keys and values are computed once per row, by the first forward after
  :meth:`CachedSeq2Seq.reset`, and reused every round: the self-attention cache and a
  ``DynamicCache`` of cross-attention keys travel together in transformers' ``EncoderDecoderCache``,
  whose ``is_updated`` flags tell each layer to reuse them.

Decoders do not all take ``position_ids``, so when rows start at different slots (or a padded column
of a block lies past a table of learned positions) each row's positions are put in by scheme, for
the duration of one forward: learned or sinusoidal position tables (``decoder.embed_positions``:
BART, mBART, Marian, Whisper, Pegasus, M2M100, ...) are read at the rows' positions, and T5's
relative position bias is computed per row from slots (``compute_bias`` of the layers that own
one). When all rows start at the same slot (always at batch 1) the model runs unchanged with its
own causal mask. :func:`check_seq2seq` compares cached, ragged, rolled-back and row-selected
logits with full forward passes once per model, and refuses a model that does not match with a
``ValueError`` naming the family.

A decoder that reads another model's encoder (a distil-whisper draft, loaded as
``WhisperForCausalLM``) runs in the same cache, with the target's :class:`EncoderState`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from .attention_masks import LayerPlan, masks
from .facts import (
    check_eval_mode,
    encoder_width,
    execution_device,
    is_encoder_decoder,
    reads_encoder,
    speech_encoder,
)
from .kv_cache import _RowLayer, _Slots
from .probe import probe, remembered
from .transformers_api import cache_kwarg, forward_params

__all__ = [
    "CachedSeq2Seq",
    "EncoderState",
    "check_seq2seq",
    "decoder_layers_path",
    "decoder_length_limit",
    "encode",
    "encoder_width",
    "is_encoder_decoder",
    "reads_encoder",
    "seq2seq_cache_bytes",
    "speech_encoder",
]

_FULL = LayerPlan(types=("full_attention",), window=None, chunk=None, by_type=False)


@dataclass
class EncoderState:
    """The encoder output of every row, computed once per row and kept while the row decodes."""

    hidden: torch.Tensor  #: [B, S, D] the encoder's last hidden states
    mask: torch.Tensor | None  #: [B, S] 1 for source tokens, 0 for padding; None: every frame (speech)

    def select(self, idx: torch.Tensor) -> EncoderState:
        """The rows ``idx`` (a LongTensor of local indices)."""
        return EncoderState(self.hidden[idx.to(self.hidden.device)],
                            None if self.mask is None else self.mask[idx.to(self.mask.device)])


@torch.inference_mode()
def encode(model: Any, inputs: dict[str, torch.Tensor]) -> EncoderState:
    """Run ``model``'s encoder once over the batch ``inputs`` (``input_ids`` and ``attention_mask``,
    or ``input_features``), on the encoder's device."""
    enc = model.get_encoder()
    dev = execution_device(enc)
    dtype = next(enc.parameters()).dtype
    kw = {k: (v.to(dev, dtype) if v.is_floating_point() else v.to(dev)) for k, v in inputs.items()}
    out = enc(**kw)
    return EncoderState(out.last_hidden_state, kw.get("attention_mask"))


def _decoder(model: Any) -> Any:
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if dec is None:
        raise ValueError(f"{type(model).__name__} has no decoder (get_decoder())")
    return getattr(dec, "decoder", dec)  # WhisperForCausalLM: get_decoder() may be a wrapper


def decoder_layers_path(model: Any) -> list[str]:
    """Attribute path from ``model`` to its decoder's layer ``ModuleList`` (e.g.
    ``["model", "decoder", "layers"]``, T5: ``["decoder", "block"]``)."""
    dec = _decoder(model)
    name = next((n for n, m in model.named_modules() if m is dec), None)
    attr = next((a for a in ("layers", "block") if isinstance(getattr(dec, a, None), torch.nn.ModuleList)),
                None)
    if name is None or attr is None:
        raise ValueError(f"{type(model).__name__}: its decoder's layers are not one ModuleList "
                         "('layers' or 'block')")
    return [*name.split("."), attr] if name else [attr]


@dataclass(frozen=True)
class _Positions:
    """How the decoder takes positions: a table read at position + offset, or relative biases."""

    table: Any  #: the decoder's ``embed_positions`` module (an Embedding), or None
    offset: int  #: BART/mBART keep 2 rows before position 0
    biased: tuple[Any, ...]  #: T5-style attention modules that own a relative position bias

    @property
    def limit(self) -> int | None:
        """Positions the table has (None: computed or relative positions, no limit)."""
        if self.table is None or not hasattr(self.table, "weight"):
            return None
        return int(self.table.weight.shape[0]) - self.offset


def _positions(model: Any) -> _Positions:
    dec = _decoder(model)
    table = getattr(dec, "embed_positions", None)
    if table is not None and not isinstance(table, torch.nn.Embedding):
        table = None
    biased = tuple(m for m in dec.modules() if callable(getattr(m, "compute_bias", None))
                   and getattr(m, "has_relative_attention_bias", False)
                   and hasattr(m, "_relative_position_bucket"))
    if table is None and not biased:
        raise ValueError(
            f"{type(model).__name__}: speculate's text domain does not know how its decoder takes "
            "positions (no embed_positions table, no T5-style relative bias), so ragged rows "
            "cannot be decoded in one batch")
    return _Positions(table=table, offset=int(getattr(table, "offset", 0) or 0), biased=biased)


def decoder_length_limit(model: Any) -> list[tuple[int, str]]:
    """The longest decoder sequence (prompt plus new tokens) ``model`` can decode, with the reason."""
    n = _positions(model).limit
    return [] if n is None else [(n, f"{n} learned decoder positions")]


@contextlib.contextmanager
def _at_positions(scheme: _Positions, pos: torch.Tensor) -> Iterator[None]:
    """Give the decoder the positions ``pos`` ``[R, W]`` (per row) for one forward."""
    table = scheme.table
    try:
        if table is not None:  # replaces the table's own forward, which would index from the cache's
            # length and could run past the table on the padded columns of a ragged block
            def table_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
                w = table.weight
                return torch.nn.functional.embedding(pos.to(w.device) + scheme.offset, w)

            table.forward = table_forward
        for attn in scheme.biased:
            def bias(query_length: int, key_length: int, device: Any = None, *args: Any,
                     _a: Any = attn, **kwargs: Any) -> torch.Tensor:
                dev = _a.relative_attention_bias.weight.device
                p = pos.to(dev)
                rel = torch.arange(key_length, device=dev)[None, None, :] - p[:, :, None]  # [R, W, K]
                bucket = _a._relative_position_bucket(
                    rel, bidirectional=not _a.is_decoder, num_buckets=_a.relative_attention_num_buckets,
                    max_distance=_a.relative_attention_max_distance)
                return _a.relative_attention_bias(bucket).permute(0, 3, 1, 2)  # [R, H, W, K]

            attn.compute_bias = bias
        yield
    finally:
        if table is not None:
            table.__dict__.pop("forward", None)
        for attn in scheme.biased:
            attn.__dict__.pop("compute_bias", None)


class CachedSeq2Seq:
    """A decoder with cross-attention plus its caches for a batch of rows (see the module doc).

    The interface of :class:`~speculate.domains.text.models.kv_cache.CachedModel` (``reset``, ``forward``,
    ``keep``, ``select``, ``release``, ``length``), plus ``encoder``: the rows'
    :class:`EncoderState`, set before :meth:`reset` (by :func:`encode`, or shared with the target for
    a draft that reads the target's encoder) and selected with the rows.
    """

    def __init__(self, model: Any) -> None:
        name = type(model).__name__
        impl = getattr(model.config, "_attn_implementation", "eager") or "eager"
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"{name}: attention implementation {impl!r} is not supported by speculate's "
                             "text domain: load the model with attn_implementation='sdpa' or 'eager'")
        if not reads_encoder(model):
            raise ValueError(f"{name} has no cross-attention: it is not an encoder-decoder")
        self.model = model
        self.seq2seq = is_encoder_decoder(model)
        path = decoder_layers_path(model)
        layers = model
        for a in path:
            layers = getattr(layers, a)
        self.n_layers = len(layers)
        self.positions = _positions(model)
        self.max_pos = self.positions.limit
        self.float_mask = impl == "eager"
        self._has_logits_to_keep = "logits_to_keep" in forward_params(model)
        self._cache_kw = cache_kwarg(model) or "past_key_values"
        self.encoder: EncoderState | None = None
        self.length = np.zeros(0, np.int64)
        self.slots = _Slots(0)
        self.cache: EncoderDecoderCache | None = None

    @property
    def device(self) -> torch.device:
        return execution_device(self.model)

    def tree_refusal(self) -> str | None:
        """Token trees are for decoder-only targets."""
        return f"{type(self.model).__name__} is an encoder-decoder: token trees are for decoder-only targets"

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty caches for ``batch`` rows (whose encoder state is already set)."""
        if self.encoder is None or self.encoder.hidden.shape[0] != batch:
            raise RuntimeError("set the encoder state of every row before reset()")
        self.slots = _Slots(capacity + spare)
        own = Cache(layers=[_RowLayer(self.slots) for _ in range(self.n_layers)])
        self.cache = EncoderDecoderCache(own, DynamicCache())
        self.length = np.zeros(batch, np.int64)

    def release(self) -> None:
        """Free the caches and the encoder state."""
        self.cache, self.encoder = None, None
        self.slots = _Slots(0)
        self.length = np.zeros(0, np.int64)

    def ensure_capacity(self, capacity: int) -> None:
        self.slots.capacity = max(self.slots.capacity, capacity)

    @torch.inference_mode()
    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (local indices, increasing): caches and encoder states."""
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        assert self.cache is not None and self.encoder is not None
        self.cache.self_attention_cache.batch_select_indices(idx)
        self.cache.cross_attention_cache.batch_select_indices(idx)
        self.encoder = self.encoder.select(idx)
        self.length = self.length[keep]

    def keep(self, n: np.ndarray) -> None:
        """Commit ``n[r]`` more tokens of row ``r``."""
        self.length += np.asarray(n, dtype=np.int64)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
                valid: np.ndarray | None = None) -> torch.Tensor:
        """Logits ``[R, W, V]`` of decoder ``tokens`` ``[R, W]`` written at slots ``start[r] + j``
        (``valid`` is accepted for the interface: padded columns are never kept)."""
        W = tokens.shape[1]
        dev = self.device
        start = np.asarray(start, dtype=np.int64)
        s = self.slots
        top = int(start.max()) + W
        s.capacity = max(s.capacity, top)
        s.kv_len = top
        uniform = bool((start == start[0]).all()) and (self.max_pos is None or top <= self.max_pos)
        mask: Any = None
        pos = None
        if uniform:  # the model's own causal mask and positions (from the cache's length)
            s.uniform, s.index = int(start[0]), None
        else:
            pos = torch.as_tensor(start, device=dev)[:, None] + torch.arange(W, device=dev)[None, :]  # [R, W]
            s.uniform, s.index = None, pos[:, None, :, None]  # [R, 1, W, 1]
            dtype = next(self.model.parameters()).dtype if self.float_mask else None
            mask = masks(_FULL, pos, top, dtype)  # [R, 1, W, top]
            if self.max_pos is not None:
                pos = pos.clamp(max=self.max_pos - 1)  # padded columns past the table: never used
        enc = self.encoder
        assert enc is not None
        kw: dict[str, Any] = {self._cache_kw: self.cache, "use_cache": True}
        if last_only and self._has_logits_to_keep:
            kw["logits_to_keep"] = 1
        with _at_positions(self.positions, pos) if pos is not None else contextlib.nullcontext():
            if self.seq2seq:
                out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=enc.hidden),
                                 attention_mask=enc.mask, decoder_input_ids=tokens.to(dev),
                                 decoder_attention_mask=mask, **kw)
            else:
                out = self.model(input_ids=tokens.to(dev), attention_mask=mask,
                                 encoder_outputs=enc.hidden, **kw)
        logits = out.logits
        if last_only and logits.shape[1] > 1:
            logits = logits[:, -1:]
        return logits


def seq2seq_cache_bytes(model: Any, batch: int, capacity: int, source: int) -> int | None:
    """Bytes of the decoder's self-attention cache (``capacity`` slots) and cross-attention cache
    (``source`` encoder positions) for ``batch`` rows; None when the config does not say."""
    cfg = model.config
    try:
        path = decoder_layers_path(model)
        layers: Any = model
        for a in path:
            layers = getattr(layers, a)
        n = len(layers)
        width = int(getattr(cfg, "d_model", None) or cfg.hidden_size)
        inner = int(getattr(cfg, "d_kv", 0) or 0) * int(getattr(cfg, "num_heads", 0) or 0) or width
    except (AttributeError, TypeError, ValueError):
        return None
    item = next(model.parameters()).element_size()
    return 2 * n * int(batch) * inner * (int(capacity) + int(source)) * item


# --------------------------------------------------------------------------------------------
# the probe: cached, ragged, rolled-back and row-selected logits against full forward passes


def probe_encoder(model: Any, g: torch.Generator) -> EncoderState:
    """The encoder state of two rows of different encoder inputs (random encoder outputs for a decoder
    that reads another model's encoder), for :func:`~.probe.probe`."""
    p = next(model.parameters())
    if not is_encoder_decoder(model):
        D = encoder_width(model) or 32
        hidden = torch.randn(2, 5, D, generator=g).to(p.device, p.dtype)
        return EncoderState(hidden, None)
    if speech_encoder(model):
        cfg = model.config
        n = 2 * int(getattr(cfg, "max_source_positions", 1500))
        feats = torch.randn(2, int(cfg.num_mel_bins), n, generator=g)
        inputs = {"input_features": feats}
    else:
        V = int(model.get_encoder().get_input_embeddings().weight.shape[0])
        ids = torch.randint(0, V, (2, 6), generator=g)
        mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
        inputs = {"input_ids": ids, "attention_mask": mask}
    return encode(model, inputs)


@torch.inference_mode()
def check_seq2seq(model: Any, role: str = "model") -> None:
    """Raise ``ValueError`` unless ``model``'s cached decoder logits (ragged rows with different
    encoder inputs, a rollback, a dropped row) equal full forward passes; once per model and
    setting, like :func:`~speculate.domains.text.models.kv_cache.check_model`."""
    check_eval_mode(model, role)
    why = remembered(model, "seq2seq", lambda: probe(model, CachedSeq2Seq, probe_encoder))
    if why is not None:
        raise ValueError(why)
