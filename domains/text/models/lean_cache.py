"""What the lean decoding loops (``lean_llama.py``, ``lean_seq2seq.py``) share: the slot store
(``slots.py``: per-layer key and value tensors indexed by position, gpt-fast style) with each row's
committed length, and whether a model may be run by a lean loop at all.

Row ``r``'s token at position ``p`` sits at slot ``p``; ``length[r]`` tokens of row ``r`` are
correct at slots ``0 .. length[r] - 1``. A forward writes new tokens at their slots and reads slots
up to its own; rolling back a rejected draft is not moving ``length`` forward (the stale slots are
overwritten next round). The buffers grow by doubling, keeping what they hold.
"""

from __future__ import annotations

import numpy as np
import torch

from .slots import SlotStore

__all__ = ["SlotCache", "modified", "plain_weights"]


def plain_weights(model: torch.nn.Module) -> bool:
    """Whether a lean loop may read ``model``'s weights directly instead of calling its modules:
    they all sit, materialised, on one device with nothing moving them (no ``meta`` tensor, no
    accelerate hook: ``device_map``, CPU or disk offload), and nothing changes what its modules
    compute (:func:`modified`: adapters, hooks, wrappers). Any other model runs through its own
    forward, which applies all of them."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1 or torch.device("meta") in devices:
        return False
    return not any("_hf_hook" in m.__dict__ for m in model.modules()) and modified(model) is None


def modified(model: torch.nn.Module) -> str | None:
    """What makes ``model`` compute something other than its transformers modules' own code, or
    None: a module from outside torch.nn and transformers (a PEFT / LoRA adapter layer, a custom
    layer), a ``torch.compile`` wrapper, a forward (pre-)hook on any module or a global one, or a
    ``forward`` replaced on an instance. A lean loop that reads the weights would skip all of them."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "a global forward hook is registered"
    for name, m in model.named_modules():
        where = name or "(root)"
        mod = type(m).__module__ or ""
        if not (mod.startswith("torch.nn.") or mod.startswith("transformers.")) or mod.startswith("torch._dynamo"):
            return f"{where} is a {type(m).__name__} from {mod} (an adapter, wrapper or custom layer)"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"{where} has a forward hook"
        if "forward" in m.__dict__:
            return f"{where} has its forward replaced"
    return None


class SlotCache(SlotStore):
    """A lean loop's cache: the store's keys and values ``[R, kv_heads, capacity, head_dim]`` per layer
    (``self.k``, ``self.v``), and ``length``, the committed tokens per row.

    A loop sets ``n_cache_layers``, ``kv_heads``, ``head_dim``, ``dtype`` and ``device_`` before
    the first :meth:`_alloc` (and ``dtype``, ``device_`` again at each reset: the model may have
    moved since).
    """

    def _init_slots(self) -> None:
        self.length = np.zeros(0, np.int64)
        self.clear()

    @property
    def device(self) -> torch.device:
        return self.device_

    def tree_refusal(self) -> str | None:
        """A lean loop scores chains (its mask is causal over the slots): token trees need the general cache."""
        return f"{type(self).__name__} (a lean decoding loop) scores chains only; token trees run on the general cache"

    def _alloc(self, batch: int, capacity: int) -> None:
        """Buffers of ``capacity`` slots for ``batch`` rows; growing keeps what is cached."""
        self.alloc(batch, capacity)

    def _reset_slots(self, batch: int, capacity: int) -> None:
        self.k, self.v = [], []
        self._alloc(batch, capacity)
        self.length = np.zeros(batch, np.int64)

    def _release_slots(self) -> None:
        self.clear()
        self.length = np.zeros(0, np.int64)

    def ensure_capacity(self, capacity: int) -> None:
        if capacity > self.capacity:  # all the rows the buffers hold (static steps may hold more)
            self._alloc(self.k[0].shape[0] if self.k else len(self.length), max(capacity, 2 * self.capacity))

    def _span(self, start: np.ndarray, W: int) -> tuple[np.ndarray, int, int, bool]:
        """A block of ``W`` tokens per row at slots ``start[r] + j``: ``(start, top, s0, uniform)`` (int64
        starts, the slots ``0 .. top-1`` it reads, row 0's start, whether every row starts there), the
        buffers grown to ``top`` slots."""
        start = np.asarray(start, dtype=np.int64)
        top = int(start.max()) + W
        if top > self.capacity:
            self.ensure_capacity(top)
        s0 = int(start[0])
        return start, top, s0, bool((start == s0).all())

    _write = SlotStore.write  # (layer, keys, values, s0, rows, pos, R): see SlotStore.write

    def keep(self, n: np.ndarray) -> None:
        """Commit ``n[r]`` more tokens of row ``r`` (as ``CachedModel.keep``)."""
        self.length += np.asarray(n, dtype=np.int64)

    def join_refusal(self) -> str | None:
        """Why this cache cannot take rows from another (:meth:`absorb`); None when it can."""
        return None

    def absorb(self, other: SlotCache) -> None:
        """Append the rows of ``other`` (the same model's cache, filled separately) after this cache's:
        continuous batching admits new requests this way between rounds."""
        why = self.join_refusal() or other.join_refusal()
        if why is not None:
            raise NotImplementedError(why)
        cap = max(self.capacity, other.capacity)
        for c in (self, other):
            if c.capacity < cap:
                c._alloc(len(c.length), cap)
        SlotStore.absorb(self, other)
        self.length = np.concatenate([self.length, other.length])

    def _select_slots(self, keep: np.ndarray) -> torch.Tensor:
        """Keep only the rows ``keep`` (local indices, increasing) of the buffers; their index tensor."""
        idx = self.select_rows(keep)
        self.length = self.length[keep]
        return idx
