"""The one key/value store of our own runtimes: per layer, keys and values ``[B, heads, capacity,
head_dim]`` indexed by slot, gpt-fast style. Row ``r``'s token at position ``p`` sits at slot ``p``;
rolling back is writing over stale slots; the buffers grow by doubling and keep what they hold.

:class:`SlotStore` is what the lean decoding loops (``lean_cache.SlotCache``: Llama, Whisper,
BART) and the EAGLE-style feature draft (:class:`FeatureCache`, one layer, slots per tree node)
write to. (The position-indexed cache over a model's own forward, ``kv_cache.CachedModel``, keeps
its tensors in transformers' ``DynamicLayer`` objects, which the model's attention writes itself.)

>>> import torch
>>> s = SlotStore(layers=1, heads=2, head_dim=4)
>>> s.alloc(batch=3, capacity=8)
>>> K, V = s.write(0, torch.ones(3, 2, 2, 4), torch.ones(3, 2, 2, 4), s0=5)   # slots 5, 6 of every row
>>> s.alloc(3, 16)                                                           # grown, content kept
>>> tuple(s.k[0].shape), float(s.k[0][:, :, 5:7].sum())
((3, 2, 16, 4), 48.0)
>>> s.move(torch.tensor([0]), torch.tensor([5]), torch.tensor([1]))          # row 0: slot 5 -> slot 1
>>> float(s.k[0][0, :, 1].sum())
8.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["FeatureCache", "SlotStore"]


class SlotStore:
    """Keys and values ``[B, heads, capacity, head_dim]`` per layer (``self.k``, ``self.v``)."""

    def __init__(self, layers: int = 0, heads: int = 0, head_dim: int = 0, dtype: torch.dtype = torch.float32,
                 device: Any = "cpu") -> None:
        self.n_cache_layers, self.kv_heads, self.head_dim = layers, heads, head_dim
        self.dtype, self.device_ = dtype, torch.device(device)
        self.k: list[torch.Tensor] = []  # per layer [B, heads, capacity, head_dim]
        self.v: list[torch.Tensor] = []
        self.capacity = 0

    def alloc(self, batch: int, capacity: int) -> None:
        """Buffers of ``capacity`` slots for ``batch`` rows; growing keeps what is stored."""
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        old_k, old_v = self.k, self.v
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device_) for _ in range(self.n_cache_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device_) for _ in range(self.n_cache_layers)]
        if old_k and old_k[0].shape[0] == batch:
            n = old_k[0].shape[2]
            for i in range(self.n_cache_layers):
                self.k[i][:, :, :n] = old_k[i]
                self.v[i][:, :, :n] = old_v[i]
        self.capacity = capacity

    def clear(self) -> None:
        """Drop the buffers."""
        self.k, self.v, self.capacity = [], [], 0

    def grow(self, capacity: int) -> None:
        """At least ``capacity`` slots (doubling), for all the rows the buffers hold."""
        if capacity > self.capacity and self.k:
            self.alloc(self.k[0].shape[0], max(capacity, 2 * self.capacity))

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor, s0: int, rows: torch.Tensor | None = None,
              pos: torch.Tensor | None = None, R: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer ``i``'s new keys and values ``[R, heads, W, head_dim]`` at slots ``s0 ..`` of every
        row (``pos`` None) or at ``pos`` ``[R, W]`` (``rows`` ``[R, 1]``); the layer's buffers of the first
        ``R`` rows (static steps' buffers may hold more)."""
        K, V = self.k[i], self.v[i]
        R = k.shape[0] if R is None else R
        if K.shape[0] != R:
            K, V = K[:R], V[:R]
        if pos is None:
            K[:, :, s0 : s0 + k.shape[2]] = k
            V[:, :, s0 : s0 + k.shape[2]] = v
        else:
            K[rows, :, pos] = k.transpose(1, 2)
            V[rows, :, pos] = v.transpose(1, 2)
        return K, V

    def select_rows(self, keep: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Keep only the rows ``keep`` (indices, increasing); their index tensor."""
        idx = torch.as_tensor(np.asarray(keep) if not isinstance(keep, torch.Tensor) else keep, dtype=torch.long,
                              device=self.device_)
        self.k = [t.index_select(0, idx) for t in self.k]
        self.v = [t.index_select(0, idx) for t in self.v]
        return idx

    def absorb(self, other: SlotStore) -> None:
        """Append ``other``'s rows after this store's (both grown to the larger capacity first)."""
        cap = max(self.capacity, other.capacity)
        for store in (self, other):
            if store.capacity < cap:
                store.alloc(store.k[0].shape[0], cap)
        self.k = [torch.cat([a, b.to(a.device, a.dtype)]) for a, b in zip(self.k, other.k, strict=True)]
        self.v = [torch.cat([a, b.to(a.device, a.dtype)]) for a, b in zip(self.v, other.v, strict=True)]

    def move(self, rows: Any, src: Any, dst: Any) -> None:
        """Copy slot ``src[j]`` of row ``rows[j]`` to slot ``dst[j]`` in every layer (all reads first)."""
        r, a, b = (torch.as_tensor(t, dtype=torch.long, device=self.device_) for t in (rows, src, dst))
        for K, V in zip(self.k, self.v, strict=True):
            K[r, :, b] = K[r, :, a]  # [M, heads, head_dim]
            V[r, :, b] = V[r, :, a]


class FeatureCache(SlotStore):
    """The feature draft's store: one layer of its columns' keys and values ``[B, n_heads, C, head_dim]``.

    The draft's two forms (modules; decoding, without autograd) order each head's key entries
    differently (the same attention), so a cache holds the keys of one form (``form``) and the
    other refuses it until :meth:`reset`."""

    def __init__(self, n_heads: int, head_dim: int, device: Any = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__(1, n_heads, head_dim, dtype, device)
        self.n_heads = n_heads
        self.form: str | None = None

    @property
    def device(self) -> torch.device:
        return self.device_

    @property
    def keys(self) -> torch.Tensor | None:
        return self.k[0] if self.k else None

    @property
    def values(self) -> torch.Tensor | None:
        return self.v[0] if self.v else None

    def claim(self, form: str) -> None:
        """Record that ``form`` ("modules" or "decoding") writes this cache; ``ValueError`` if the other did."""
        if self.form is not None and self.form != form:
            raise ValueError(f"this feature cache holds keys written by the draft's {self.form} form (with"
                             f"{'out' if self.form == 'decoding' else ''} autograd); the {form} form orders "
                             "them differently: reset the cache, or call the draft with autograd "
                             f"{'disabled' if self.form == 'decoding' else 'enabled'} throughout")
        self.form = form

    def reset(self, batch: int, capacity: int) -> None:
        """Empty buffers for ``batch`` rows of ``capacity`` slots."""
        self.clear()
        self.alloc(batch, capacity)
        self.form = None

    def release(self) -> None:
        self.clear()
        self.form = None

    def ensure_capacity(self, n: int) -> None:
        """Grow the buffers (zeros appended) to at least ``n`` slots."""
        assert self.k, "reset the cache first"
        self.grow(n)

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (indices or a boolean mask)."""
        keep = np.asarray(keep)
        self.select_rows(np.flatnonzero(keep) if keep.dtype == bool else keep)
