"""The one probe every runtime passes before it decodes a model, and the verdicts it leaves.

:func:`probe` runs the same short scenario through any runtime (``make(model)``) and compares each
logit it gets with the model's own uncached forward: two rows of different lengths (and, for an
encoder-decoder, different encoder inputs) prefilled ragged, a ragged block of three tokens, a
rollback of row 0 past two tokens it had fed, a block from a common start, a finished row dropped
(``select``), and one row alone fed blocks of one and two tokens from a common start (the model's own
causal mask). Sliding windows and attention chunks are shrunk to 3 tokens while it runs, so that it
crosses them. :func:`remembered` keeps each verdict per model object and setting.

>>> from speculate.domains.text.conformance import tiny_llama
>>> from speculate.domains.text.models.kv_cache import CachedModel
>>> probe(tiny_llama(), CachedModel) is None                  # a Llama decodes exactly in the cache
True
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from .facts import execution_device, is_encoder_decoder, max_positions, model_vocab_size, text_config

__all__ = ["CHECKS", "probe", "probe_window", "remembered"]

#: model object -> {tag: (setting, verdict)}: what :func:`remembered` stored (by the object itself,
#: so a copy of a model, shallow or deep, is checked on its own; dropped with the model)
CHECKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remembered(model: Any, tag: str, check: Callable[[], str | None]) -> str | None:
    """``check()``'s verdict (None, or why the model is refused) for ``model`` under ``tag``: computed
    once per model object and setting (class, dtype, device, attention implementation) and kept in
    :data:`CHECKS`; a check that raises stores nothing."""
    p = next(model.parameters())
    key = (type(model), p.dtype, p.device, getattr(model.config, "_attn_implementation", None))
    checks = CHECKS.setdefault(model, {})
    seen = checks.get(tag)
    if seen is None or seen[0] != key:
        seen = checks[tag] = (key, check())
    return seen[1]


@contextlib.contextmanager
def probe_window(model: Any, size: int = 3) -> Iterator[None]:
    """Shrink the model's sliding window and attention chunk to ``size`` tokens while probing, so that
    a short probe crosses them (the masks are built from the config at every forward)."""
    cfg = text_config(model.config)
    saved = []
    try:
        for attr in ("sliding_window", "attention_chunk_size"):
            v = getattr(cfg, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > size:
                try:
                    setattr(cfg, attr, size)
                except Exception:  # a read-only config field: probe with the real one
                    continue
                saved.append((attr, v))
        yield
    finally:
        for attr, v in saved:
            setattr(cfg, attr, v)


@torch.inference_mode()
def probe(model: Any, make: Callable[[Any], Any], encoder: Callable[[Any, torch.Generator], Any] | None = None
          ) -> str | None:
    """Why ``model`` cannot decode exactly in the runtime ``make(model)``, or None (see the module
    docstring). ``make.what`` (optional) names the runtime in the reason. ``encoder(model, g)``: for a
    decoder that reads an encoder, the two rows' encoder state (``encoder_decoder.probe_encoder``).
    ``ValueError`` when the model's own forward gives logits that are not finite (nothing to compare
    with)."""
    seq2seq = encoder is not None
    where = getattr(make, "what", None) or ("speculate's position-indexed encoder-decoder cache" if seq2seq
                                            else "speculate's position-indexed KV cache")
    name = type(model).__name__
    if not seq2seq:
        n_pos = max_positions(model)
        if n_pos is not None and n_pos < 12:
            return f"{name} has only {n_pos} positions; speculate's text domain needs at least 12"
    with probe_window(model):  # from the runtime's construction on: runtimes read the window there
        return _run(model, make, encoder, seq2seq, where, name)


def _run(model: Any, make: Callable[[Any], Any], encoder: Any, seq2seq: bool, where: str, name: str) -> str | None:
    """:func:`probe`'s scenario, with the windows shrunk."""
    try:
        lm = make(model)
    except ValueError as e:  # a family the runtime cannot serve: its own reason
        return str(e)
    n_pos = getattr(lm, "max_pos", None) if seq2seq else None
    if n_pos is not None and n_pos < 12:
        return f"{name} has only {n_pos} decoder positions; speculate's text domain needs at least 12"
    V = model_vocab_size(model)
    dev = execution_device(model)
    g = torch.Generator().manual_seed(0)
    a, b, alt = (torch.randint(0, V, (n,), generator=g) for n in (10, 10, 2))
    a_alt = torch.cat([a[:5], alt])  # row 0 feeds alt after a[:5], then rolls back to a[:5]
    state = encoder(model, g) if encoder is not None else None

    def full(r: int, seq: torch.Tensor) -> torch.Tensor:
        """Logits ``[L, V]`` of ``seq`` (row ``r``'s encoder input) by one uncached forward."""
        if state is None:
            return model(input_ids=seq[None].to(dev)).logits[0].float().cpu()
        hid = state.hidden[r : r + 1]
        if is_encoder_decoder(model):
            mask = None if state.mask is None else state.mask[r : r + 1]
            out = model(encoder_outputs=BaseModelOutput(last_hidden_state=hid), attention_mask=mask,
                        decoder_input_ids=seq[None].to(dev), use_cache=False)
        else:
            out = model(input_ids=seq[None].to(dev), encoder_outputs=hid, use_cache=False)
        return out.logits[0].float().cpu()

    one = None
    try:
        if state is not None:
            lm.encoder = state
        lm.reset(batch=2, capacity=12)
        # prefill 4 and 2 tokens (row 1's last two columns pad the block), then a ragged block of 3
        lm.forward(torch.stack([a[:4], torch.cat([b[:2], b[:2]])]), np.array([0, 0]), valid=np.array([4, 2]))
        lm.keep(np.array([4, 2]))
        x = lm.forward(torch.stack([a_alt[4:7], b[2:5]]), np.array([4, 2])).float().cpu()
        lm.keep(np.array([1, 3]))  # row 0 keeps a[4] only: both rows at slot 5
        y = lm.forward(torch.stack([a[5:8], b[5:8]]), np.array([5, 5])).float().cpu()
        lm.keep(np.array([2, 3]))  # rows at slots 7 and 8
        lm.select(np.array([1]))  # row 0 finishes: row 1 keeps its own caches (and encoder state)
        z = lm.forward(b[None, 8:10], np.array([8])).float().cpu()
        # one row: blocks of 1 and 2 tokens from a common start (the model's own causal mask)
        one = make(model)
        if state is not None:
            one.encoder = type(state)(state.hidden[:1], None if state.mask is None else state.mask[:1])
        one.reset(batch=1, capacity=12)
        one.forward(a[None, :4], np.array([0]))
        one.keep(np.array([4]))
        z1 = one.forward(a[None, 4:5], np.array([4]))
        one.keep(np.array([1]))
        z2 = one.forward(a[None, 5:7], np.array([5]))
        got = [x[0], x[1], y[0], y[1], z[0], torch.cat([z1, z2], dim=1)[0].float().cpu()]
        ref = [full(0, a), full(1, b), full(0, a_alt)]
        want = [ref[2][4:7], ref[1][2:5], ref[0][5:8], ref[1][5:8], ref[1][8:10], ref[0][4:7]]
    except Exception as e:  # an architecture that rejects position_ids, 4-D masks or the cache
        return f"{name} cannot run with {where}: {e!r}"
    finally:
        for runtime in (lm, one):
            if runtime is not None:
                runtime.release()
    if not all(bool(torch.isfinite(w).all()) for w in want):
        raise ValueError(
            f"{name} gives logits that are not finite (NaN or inf) on a plain forward pass: its "
            "weights hold NaN or its activations overflow (float16?); fix the model first")
    dtype = next(model.parameters()).dtype
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    for r, (gr, wr) in enumerate(zip(got, want, strict=True)):
        err = float((gr - wr).abs().max())
        if not err <= tol * (float(wr.abs().max()) + 1.0):
            hint = ("; its decoder takes positions or masks in a way the text domain does not know" if seq2seq
                    else "; it probably ignores position_ids or 4-D attention masks, which speculative decoding "
                    "of ragged batches needs" if getattr(make, "__name__", "") == "CachedModel" else "")
            return f"{name} gives different logits with {where} (max abs error {err:.3g}, check {r}){hint}"
    return None
