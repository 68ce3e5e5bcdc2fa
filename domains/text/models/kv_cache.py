"""The position-indexed KV cache of the text domain: :class:`CachedModel` and its layers.

Caches are position-indexed per row (the layout of gpt-fast's static cache, batched): row ``r``
stores the keys and values of its committed tokens at slots ``0 .. length[r] - 1``; a forward pass
writes the new tokens of row ``r`` at slots ``start[r] + j`` and attends to slots
``<= start[r] + j`` through an explicit 4-D mask, with ``position_ids = start[r] + j``. Rolling
back a rejected block is therefore free (``length[r]`` simply does not advance past the kept
tokens, :func:`advance_length`; the stale slots are overwritten by the next round), prompts of
different lengths need no padding inside the cache, and rows with ragged acceptance never leave
holes. This works with any transformers causal LM that honours ``position_ids`` and a 4-D
``attention_mask`` (Llama, Mistral, Qwen2/3, Gemma, Phi-3, GPT-2, GPT-NeoX, ...), whatever its
layers attend to: sliding-window, chunked and full-attention layers get their own masks over the
same slots (``attention_masks.py``), and recurrent layers (Mamba, Mamba2, short convolutions, gated
delta nets) keep per-row states that roll back to the last kept token (``recurrent.py``). A forward
is told which columns each row really feeds (``valid``; the rest are padding of a ragged block)
and :meth:`CachedModel.keep` commits the kept tokens. :func:`check_model` verifies all of it once
per model by comparing cached logits, after a rollback too, with uncached ones. Llama drafts run
in the leaner loop of ``lean_llama.py``, which keeps the same interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer

from .attention_masks import RECURRENT, alibi_from_slots, layer_plan, masks, tree_masks
from .facts import check_eval_mode, max_positions, text_config
from .probe import probe, remembered
from .recurrent import RecurrentLayers
from .recurrent_mixers import find_mixers, unknown_recurrent
from .transformers_api import cache_kwarg, execution_device, forward_params, version_note

__all__ = ["CachedModel", "advance_length", "check_model"]

# --------------------------------------------------------------------------------------------
# KV cache: one preallocated buffer per layer, written at per-row positions


class _Slots:
    """Where the current forward writes, shared by every layer of one cache."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.kv_len = 0  # keys returned to attention: slots [0, kv_len)
        self.uniform: int | None = None  # common start slot when all rows start together
        self.index: torch.Tensor | None = None  # [R, 1, W, 1] slot of each new token otherwise


class _RowLayer(DynamicLayer):
    """A cache layer of shape [B, H, capacity, D] written at per-row slots (see module doc)."""

    def __init__(self, slots: _Slots) -> None:
        super().__init__()
        self.slots = slots

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        B, H, _, Dk = key_states.shape
        Dv = value_states.shape[-1]
        C = self.slots.capacity
        self.keys = key_states.new_zeros(B, H, C, Dk)  # [B, H, C, Dk]
        self.values = value_states.new_zeros(B, value_states.shape[1], C, Dv)  # [B, H, C, Dv]
        self.is_initialized = True

    def _grow(self) -> None:
        C = self.slots.capacity
        if self.keys.shape[2] >= C:
            return
        k = self.keys.new_zeros(*self.keys.shape[:2], C, self.keys.shape[3])
        v = self.values.new_zeros(*self.values.shape[:2], C, self.values.shape[3])
        k[:, :, : self.keys.shape[2]] = self.keys
        v[:, :, : self.values.shape[2]] = self.values
        self.keys, self.values = k, v

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._grow()
        s = self.slots
        W = key_states.shape[2]
        if s.uniform is not None:
            self.keys[:, :, s.uniform : s.uniform + W] = key_states
            self.values[:, :, s.uniform : s.uniform + W] = value_states
        else:
            idx = s.index.to(self.keys.device)  # [R, 1, W, 1]; a model spread over devices
            self.keys.scatter_(2, idx.expand(-1, key_states.shape[1], -1, key_states.shape[3]),
                               key_states.to(self.keys.dtype))
            self.values.scatter_(2, idx.expand(-1, value_states.shape[1], -1,
                                               value_states.shape[3]),
                                 value_states.to(self.values.dtype))
        return self.keys[:, :, : s.kv_len], self.values[:, :, : s.kv_len]

    def get_seq_length(self) -> int:
        # with a common start, transformers builds the causal mask itself from this query offset
        s = self.slots
        return s.uniform if s.uniform is not None else s.kv_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        s = self.slots
        return (s.uniform + query_length if s.uniform is not None else s.kv_len), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("position-indexed caches roll back by length, not by crop")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.keys = self.keys[indices]
            self.values = self.values[indices]


class CachedModel:
    """A transformers causal LM plus its position-indexed KV cache for a batch of rows.

    ``length[r]`` counts the tokens of row ``r`` whose keys and values (and recurrent states) are
    correct in the cache: slots ``0 .. length[r] - 1``. :meth:`forward` writes new tokens from per-row
    start slots and returns their logits without changing ``length``; :meth:`keep` then commits the
    tokens the caller keeps. A model the cache cannot serve is refused at construction with a
    ``ValueError`` naming the family and the reason (an attention implementation other than sdpa
    or eager, unknown layer types, recurrent layers no implementation rolls back).

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                   num_attention_heads=2, num_key_value_heads=2)
    >>> lm = CachedModel(LlamaForCausalLM(cfg).eval())
    >>> lm.reset(batch=2, capacity=8)
    >>> lm.forward(torch.tensor([[1, 2, 3], [4, 5, 0]]), np.array([0, 0]), valid=np.array([3, 2])).shape
    torch.Size([2, 3, 16])
    >>> lm.keep(np.array([3, 2])); lm.length.tolist()
    [3, 2]
    """

    def __init__(self, model: Any) -> None:
        name = type(model).__name__
        impl = getattr(model.config, "_attn_implementation", "eager") or "eager"
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"{name}: attention implementation {impl!r} is not supported by speculate's text "
                "domain: load the model with attn_implementation='sdpa' or 'eager'"
            )
        cfg = text_config(model.config)
        self.plan = layer_plan(model, cfg, name)
        unknown = unknown_recurrent(model)
        if unknown:
            raise ValueError(
                f"{name} has recurrent layers ({', '.join(unknown)}) that speculate's text domain cannot "
                "roll back to the last accepted token (supported: Mamba, Mamba2, LFM2 short "
                "convolutions, Qwen3-Next gated delta nets)")
        mixers = find_mixers(model)
        if not mixers and any(t in RECURRENT - {"mlp", "moe"} for t in self.plan.types):
            raise ValueError(f"{name} has layers of types {sorted(set(self.plan.types))} but no recurrent "
                             "mixer speculate's text domain knows how to roll back")
        self.recurrent = RecurrentLayers(mixers)
        # plain full-attention models at a common start build their own causal mask (none for one
        # token); everything else gets explicit masks (per layer type) and models with no attention
        # layers none at all
        self.own_mask = self.plan.plain and not self.recurrent
        self.model = model
        self.max_pos = max_positions(model)  # learned positions: padded columns are clamped to it
        self.float_mask = impl == "eager"
        self.n_layers = int(cfg.num_hidden_layers)
        params = forward_params(model)
        self._has_logits_to_keep = "logits_to_keep" in params
        self._cache_kw = cache_kwarg(model)  # "cache" from transformers 5.24, "past_key_values" before
        self._attends = bool(self.plan.kinds) and self._cache_kw is not None
        self.length = np.zeros(0, np.int64)
        self.slots = _Slots(0)
        self.cache: Cache | None = None
        self.capture = False  # keep the features (the output embedding's input) of every forward
        self.features: torch.Tensor | None = None  # [R, W, H] (W = 1 with last_only)

    @property
    def device(self) -> torch.device:
        return execution_device(self.model)

    def tree_refusal(self) -> str | None:
        """Why this model cannot score a token tree in one forward, or None when it can.

        A tree's nodes sit at slots that are not their positions: models whose position
        information comes from the slot (ALiBi biases) or from the order of the inputs
        (recurrent layers, which would need a state per branch) cannot be fed one.
        """
        name = type(self.model).__name__
        if self.recurrent or any(t in RECURRENT - {"mlp", "moe"} for t in self.plan.types):
            return (f"{name} has recurrent layers: a token tree would need one state per branch; "
                    "draft chains (tree=None) instead")
        module = __import__("sys").modules.get(type(self.model).__module__)
        if getattr(module, "build_alibi_tensor", None) is not None:
            return (f"{name} uses ALiBi position biases, computed from cache slots, and a tree's nodes "
                    "do not sit at the slots of their positions; draft chains (tree=None) instead")
        return None

    @torch.inference_mode()
    def move(self, rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy the keys and values of slot ``src[i]`` of row ``rows[i]`` (local index) to slot
        ``dst[i]``: commits the accepted path of a token tree, whose nodes were written at the
        slots of their tree index, to the slots of their positions. All reads happen first."""
        if not len(rows) or self.cache is None:
            return
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False):
                continue
            dev = layer.keys.device
            r, a, b = (torch.as_tensor(x, dtype=torch.long, device=dev) for x in (rows, src, dst))
            layer.keys[r, :, b] = layer.keys[r, :, a]  # [M, H, D]
            layer.values[r, :, b] = layer.values[r, :, a]

    def reset(self, batch: int, capacity: int, spare: int = 0) -> None:
        """Empty caches for ``batch`` rows of up to ``capacity`` tokens each, plus ``spare`` slots.

        ``capacity`` is the longest sequence a row will hold. The ``spare`` slots take the padded
        columns of ragged blocks (a row with fewer drafts than the block is wide), whose outputs
        are never used; the buffers also grow by themselves if a forward writes past them.
        """
        self.slots = _Slots(capacity + spare)
        self.cache = Cache(layers=[_RowLayer(self.slots) for _ in range(self.n_layers)])
        self.length = np.zeros(batch, np.int64)
        self.recurrent.reset()

    def release(self) -> None:
        """Free the cache buffers (the next :meth:`reset` allocates new ones)."""
        self.cache = None
        self.slots = _Slots(0)
        self.length = np.zeros(0, np.int64)
        self.recurrent.release()

    def ensure_capacity(self, capacity: int) -> None:
        """Grow the buffers (lazily, at the next forward) to hold ``capacity`` tokens per row."""
        self.slots.capacity = max(self.slots.capacity, capacity)

    def join_refusal(self) -> str | None:
        """Why this cache cannot take rows from another (:meth:`absorb`); None when it can."""
        if self.recurrent:
            return f"{type(self.model).__name__} has recurrent layers: their states do not join a running batch"
        return None

    @torch.inference_mode()
    def absorb(self, other: CachedModel) -> None:
        """Append the rows of ``other`` (the same model's cache, filled separately) after this cache's:
        continuous batching admits new requests this way between rounds."""
        why = self.join_refusal() or other.join_refusal()
        if why is not None:
            raise NotImplementedError(why)
        assert self.cache is not None and other.cache is not None, "reset both caches first"
        cap = max(self.slots.capacity, other.slots.capacity)
        self.slots.capacity = other.slots.capacity = cap
        B, N = len(self.length), len(other.length)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            have = [getattr(x, "is_initialized", False) for x in (mine, theirs)]
            if not any(have):
                continue
            ref = mine if have[0] else theirs
            for layer, rows, ok in ((mine, B, have[0]), (theirs, N, have[1])):
                if ok:
                    layer._grow()
                else:  # no forward wrote it yet (one-token prompts): empty rows
                    layer.keys = ref.keys.new_zeros(rows, *ref.keys.shape[1:2], cap, ref.keys.shape[3])
                    layer.values = ref.values.new_zeros(rows, *ref.values.shape[1:2], cap, ref.values.shape[3])
                    layer.dtype, layer.device, layer.is_initialized = ref.keys.dtype, ref.keys.device, True
            mine.keys = torch.cat([mine.keys, theirs.keys.to(mine.keys.device)])
            mine.values = torch.cat([mine.values, theirs.values.to(mine.values.device)])
        self.length = np.concatenate([self.length, other.length])

    @torch.inference_mode()
    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (local indices, increasing) in the cache."""
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        assert self.cache is not None
        self.cache.batch_select_indices(idx)
        self.recurrent.select(np.asarray(keep, np.int64))
        self.length = self.length[keep]

    @torch.inference_mode()
    def keep(self, n: np.ndarray) -> None:
        """Commit ``n[r]`` more tokens of row ``r`` (written by the forwards since the last commit)."""
        n = np.asarray(n, dtype=np.int64)
        if self.recurrent:
            self.recurrent.keep(n)
        self.length += n

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, start: np.ndarray, last_only: bool = False,
        valid: np.ndarray | None = None, positions: np.ndarray | None = None,
        see: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Logits ``[R, W, V]`` of ``tokens`` ``[R, W]`` written at slots ``start[r] + j``.

        Token ``j`` of row ``r`` attends to slots ``0 .. start[r] + j`` of its row (a window of them in
        sliding-window layers). ``valid[r]``: how many of row ``r``'s columns are tokens it really
        feeds (default all; the rest pad a ragged block and never advance a recurrent state). With
        ``last_only`` only the last column's logits are computed (``[R, 1, V]``). When every row
        starts at the same slot (always at batch 1) a plain full-attention model builds its usual
        causal mask (none for one token), otherwise it gets explicit 4-D masks.

        A token tree (:meth:`tree_refusal` says which models take one): ``positions`` int64 ``[R, W]``
        (default: the slots) and ``see`` bool ``[R, W, W]``, column ``j`` attending to the prefix
        (slots before ``start[r]``) and to the columns ``i`` with ``see[r, j, i]``
        (:func:`~speculate.domains.text.models.attention_masks.tree_masks`). With ``capture`` set, the
        features (the output embedding's input) are kept in ``features``.
        """
        W = tokens.shape[1]
        dev = self.device
        start = np.asarray(start, dtype=np.int64)
        s = self.slots
        top = int(start.max()) + W
        if top > s.capacity:
            s.capacity = top
        s.kv_len = top
        offs = torch.arange(W, device=dev)
        start_t = torch.as_tensor(start, device=dev)
        pos = start_t[:, None] + offs[None, :]  # [R, W] slots (and positions) of the tokens
        # With learned positions, the padded columns of a ragged block (whose outputs are never
        # used and whose slots are overwritten before any kept token reads them) may lie past the
        # table: clamp their position ids. Kept tokens never reach it (generate checks lengths).
        if positions is not None:
            pos_ids = torch.as_tensor(positions, device=dev)
        else:
            pos_ids = pos
        pos_ids = pos_ids if self.max_pos is None else pos_ids.clamp(max=self.max_pos - 1)
        uniform = bool((start == start[0]).all())
        if uniform:
            s.uniform, s.index = int(start[0]), None
        else:
            s.uniform, s.index = None, pos[:, None, :, None]  # [R, 1, W, 1]
        mask: Any = None
        if see is not None:
            dtype = next(self.model.parameters()).dtype if self.float_mask else None
            qpos = torch.as_tensor(positions, device=dev) if positions is not None else pos
            mask = tree_masks(self.plan, qpos, start_t, torch.as_tensor(see, device=dev), top, dtype)
        elif not self.plan.kinds or (self.own_mask and uniform):
            pass
        else:
            dtype = next(self.model.parameters()).dtype if self.float_mask else None
            mask = masks(self.plan, pos, top, dtype)
        kw: dict[str, Any] = {}
        if last_only and self._has_logits_to_keep:
            kw["logits_to_keep"] = 1
        if self._attends:
            kw.update({self._cache_kw: self.cache, "use_cache": True})
        else:
            kw["use_cache"] = False
        with contextlib.ExitStack() as stack:
            if isinstance(mask, torch.Tensor):
                stack.enter_context(alibi_from_slots(self.model))
            if self.recurrent:
                v = np.full(len(start), W, np.int64) if valid is None else np.asarray(valid, np.int64)
                stack.enter_context(self.recurrent.installed(start - self.length, v, W))
            if self.capture:
                stack.enter_context(_features_hook(self.model, self))
            out = self.model(input_ids=tokens.to(dev), attention_mask=mask, position_ids=pos_ids, **kw)
        logits = out.logits
        if last_only and not self._has_logits_to_keep:
            logits = logits[:, -1:]
        return logits


@contextlib.contextmanager
def _features_hook(model: Any, into: Any) -> Iterator[None]:
    """Keep the input of ``model``'s output embedding (its features ``[R, W, H]``) in ``into.features``
    during a forward."""
    head = model.get_output_embeddings()

    def hook(module: Any, args: tuple) -> None:
        into.features = args[0]

    handle = head.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def check_model(model: Any, role: str = "model") -> None:
    """Raise ``ValueError`` unless cached, ragged, position-indexed logits equal a full forward.

    A model in training mode is refused first (:func:`check_eval_mode`; never remembered). The
    comparison runs once per model object and setting (a few tiny forwards; the verdict is stored
    on the model, keyed by its class, dtype, device and attention implementation): two rows with
    different prompt lengths are decoded through :class:`CachedModel`, one of them rolled back
    past two tokens it had fed, with sliding windows and attention chunks shrunk to 3 tokens so the
    probe crosses them, and compared with the model's own uncached logits.
    """
    check_eval_mode(model, role)
    why = remembered(model, "cache", lambda: probe(model, CachedModel))  # raises (stores nothing) on non-finite logits
    if why is not None:
        raise ValueError(f"{why} {version_note()}")


def advance_length(lm: Any, pending: np.ndarray, fed: np.ndarray, n_used: np.ndarray,
                   n_accepted: np.ndarray) -> None:
    """Commit, in ``lm`` (a :class:`CachedModel` or ``LeanLlama``), the correct slots of a round.

    In the round, row ``r`` wrote from slot ``lm.length[r]`` the ``pending[r]`` committed tokens
    its cache lacked, then ``fed[r]`` drafted tokens; the verifier kept ``n_accepted[r]`` drafts and
    the row used ``n_used[r]`` outcomes. Correct afterwards: the pending tokens and the fed drafts
    that were kept and used, but not the last outcome used (it was never fed: its keys and values
    come with the next round's first forward). A row that used nothing does not move.
    """
    keep = np.minimum(np.minimum(fed, np.maximum(n_used - 1, 0)), n_accepted)
    lm.keep(np.where(n_used > 0, pending + keep, 0))
