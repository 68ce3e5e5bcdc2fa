"""The fallback runtime: a model speculate's position-indexed KV cache refuses runs through
transformers' own cache instead (:class:`TransformersCacheModel`).

It keeps the interface of :class:`~speculate.domains.text.models.kv_cache.CachedModel` (``reset``,
``forward``, ``keep``, ``select``, ``release``, ``ensure_capacity``, ``length``, ``capture`` /
``features``) with nothing but what any transformers causal LM offers: ``forward`` with a
``DynamicCache``, the model's own default positions and masks, no padding. Each row keeps its keys
and values as tensors ``[1, H, S, D]`` per layer; a forward groups the rows that start at the same
slot and feed the same number of tokens, stacks their keys and values into one ``DynamicCache``
(rows of equal length: no padding, no mask) and splits the result back. Rolling back is slicing a
row's tensors to its start. Two modes:

- ``"cache"``: as above (attention models whose cache layers keep every position);
- ``"recompute"``: no cache at all: each group feeds its rows' whole token sequences again (any
  model transformers can run: recurrent layers, sliding-window caches, custom caches).

Every path gives the logits of the model's own uncached forward on each row's tokens, so
verification stays exact. :func:`~speculate.domains.text.models.pick.pick_runtime` uses it (with a
warning saying why) only when the position-indexed cache's probe refuses a model, and checks it
with the same probe first.

>>> import numpy as np, torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                   num_attention_heads=2, num_key_value_heads=2)
>>> model = LlamaForCausalLM(cfg).eval()
>>> lm = TransformersCacheModel(model)
>>> lm.reset(batch=2, capacity=8)
>>> x = lm.forward(torch.tensor([[1, 2, 3], [4, 5, 0]]), np.array([0, 0]), valid=np.array([3, 2]))
>>> x.shape
torch.Size([2, 3, 16])
>>> torch.allclose(x[1, :2], model(input_ids=torch.tensor([[4, 5]])).logits[0], atol=1e-5)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .transformers_api import cache_from_tensors, cache_kwarg, cache_tensors, execution_device, output_cache

__all__ = ["TransformersCacheModel"]

MODES = ("cache", "recompute")


class TransformersCacheModel:
    """A causal LM decoded through transformers' own cache, rows grouped (see the module doc).

    ``length[r]``: the committed tokens of row ``r``. :meth:`forward` feeds tokens from per-row start
    slots (every slot before ``start[r]`` holds a token fed before: committed, or drafted earlier in
    the round) and returns their logits; :meth:`keep` commits.
    """

    def __init__(self, model: Any, mode: str = "cache") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.model = model
        self._kw = cache_kwarg(model)  # the forward's cache keyword, by transformers release
        if mode == "cache" and self._kw is None:
            raise ValueError(f"{type(model).__name__}.forward takes no cache keyword (cache / past_key_values)")
        self.mode = mode
        self.length = np.zeros(0, np.int64)
        self.capture = False  # keep the features (the output embedding's input) of every forward
        self.features: torch.Tensor | None = None  # [R, W, H]
        self._rows: list[_Row] = []

    @property
    def device(self) -> torch.device:
        return execution_device(self.model)

    def tree_refusal(self) -> str | None:
        return (f"{type(self.model).__name__} runs through transformers' own cache (speculate's "
                "position-indexed cache refused it), which cannot score a token tree in one forward; "
                "draft chains (tree=None) instead")

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        self._rows = [_Row() for _ in range(batch)]
        self.length = np.zeros(batch, np.int64)

    def release(self) -> None:
        self._rows = []
        self.length = np.zeros(0, np.int64)

    def ensure_capacity(self, capacity: int) -> None:
        """Nothing to do: the rows' tensors grow with each forward."""

    def select(self, keep: np.ndarray) -> None:
        self._rows = [self._rows[int(i)] for i in keep]
        self.length = self.length[keep]

    def keep(self, n: np.ndarray) -> None:
        self.length += np.asarray(n, dtype=np.int64)

    def move(self, rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        raise RuntimeError(self.tree_refusal())

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
        valid: np.ndarray | None = None, positions: np.ndarray | None = None,
        see: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Logits ``[R, W, V]`` of ``tokens`` ``[R, W]`` at slots ``start[r] + j`` (``[R, 1, V]`` with
        ``last_only``: each row's last valid column). Columns past ``valid[r]`` are not fed; their
        logits (and features) are zeros, never read."""
        if see is not None or positions is not None:
            raise RuntimeError(self.tree_refusal())
        R, W = tokens.shape
        start = np.asarray(start, dtype=np.int64)
        valid = np.full(R, W, np.int64) if valid is None else np.asarray(valid, np.int64)
        toks = tokens.cpu().numpy()
        for r in range(R):
            row = self._rows[r]
            s = int(start[r])
            if s > len(row.tokens):
                raise RuntimeError(f"internal: row {r} fed from slot {s} but holds {len(row.tokens)} tokens")
            row.tokens = np.concatenate([row.tokens[:s], toks[r, : valid[r]]])
        groups: dict[tuple[int, int], list[int]] = {}
        for r in range(R):
            if valid[r] > 0:
                groups.setdefault((int(start[r]), int(valid[r])), []).append(r)
        logits: torch.Tensor | None = None
        feats: torch.Tensor | None = None
        for (s, v), rs in groups.items():
            lg, ft = self._feed([self._rows[r] for r in rs], s, v)  # [G, v, V], [G, v, H] or None
            if logits is None:
                logits = lg.new_zeros(R, W, lg.shape[-1])  # [R, W, V]
            idx = torch.as_tensor(rs, device=lg.device)
            logits[idx, :v] = lg
            if ft is not None:
                if feats is None:
                    feats = ft.new_zeros(R, W, ft.shape[-1])  # [R, W, H]
                feats[idx, :v] = ft
        if logits is None:  # no row fed anything
            V = int(self.model.get_output_embeddings().weight.shape[0])
            logits = torch.zeros(R, W, V, device=self.device)
        if self.capture:
            self.features = feats
        if last_only:
            last = torch.as_tensor(np.maximum(valid - 1, 0), device=logits.device)
            return logits[torch.arange(R, device=logits.device), last][:, None]  # [R, 1, V]
        return logits

    def _feed(self, rows: list[_Row], start: int, v: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed each row's tokens ``start .. start + v`` (rows of one length): logits ``[G, v, V]``."""
        dev = self.device
        if self.mode == "cache":
            fresh = start == 0 or any(row.kv is None for row in rows)  # then feed the whole rows
            past = None if fresh else [
                (torch.cat([row.kv[i][0][..., :start, :] for row in rows]),  # [G, H, start, D]
                 torch.cat([row.kv[i][1][..., :start, :] for row in rows]))
                for i in range(len(rows[0].kv))]
            first = 0 if fresh else start
            ids = np.stack([row.tokens[first : start + v] for row in rows])  # [G, start + v - first]
            kw: dict[str, Any] = {self._kw: cache_from_tensors(past), "use_cache": True}
        else:  # recompute: the whole rows, no cache
            ids = np.stack([row.tokens[: start + v] for row in rows])  # [G, start + v]
            kw = {"use_cache": False}
        out, feats = self._call(torch.as_tensor(ids, device=dev), kw)
        if self.mode == "cache":
            kv = cache_tensors(output_cache(out))
            if kv is None:
                raise RuntimeError(f"{type(self.model).__name__} returned a cache whose layers do not keep "
                                   "every position: it runs in recompute mode")
            for g, row in enumerate(rows):
                row.kv = [(k[g : g + 1], w[g : g + 1]) for k, w in kv]  # [1, H, start + v, D]
        return out.logits[:, -v:], (feats[:, -v:] if feats is not None else None)

    def _call(self, ids: torch.Tensor, kw: dict[str, Any]) -> tuple[Any, torch.Tensor | None]:
        """``model(input_ids=ids, **kw)``, with the output embedding's input when ``capture``."""
        if not self.capture:
            return self.model(input_ids=ids, **kw), None
        got: list[torch.Tensor] = []
        handle = self.model.get_output_embeddings().register_forward_pre_hook(lambda m, a: got.append(a[0]))
        try:
            out = self.model(input_ids=ids, **kw)
        finally:
            handle.remove()
        return out, got[0]


class _Row:
    """One row: the tokens at its slots and (cache mode) its keys and values per layer."""

    __slots__ = ("kv", "tokens")

    def __init__(self) -> None:
        self.tokens = np.zeros(0, np.int64)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
