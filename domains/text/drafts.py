"""Drafts for text: a smaller causal LM, prompt lookup (n-gram), and early exit (self-speculation).

Every draft returns, for the active rows, a :class:`~speculate.domains.text.process.Drafted`:
``outcomes`` int64 ``[R, k]``, the draft probabilities ``q`` float32 ``[R, k, V]`` each outcome was
sampled from (after the same temperature/top-k/top-p as the target) or ``None`` for point-mass
drafts (n-gram, greedy, ``k == 0``), ``lengths`` int64 ``[R]`` (never more than ``need - 1``: a row
cannot use more drafts) and its own round ``state``, which the process hands back to its
``advance`` after verification. Verification is done by the round loop, never here.

- :class:`ModelDraft`: any transformers causal LM sharing the target's tokenizer; its vocabulary
  may be a padded prefix of the target's (or the reverse): ids the draft lacks get probability 0,
  ids the target lacks are never proposed.
- :class:`NgramDraft` (``"ngram"``): prompt lookup. The last ``n`` tokens (``n`` from ``max_n``
  down to ``min_n``) are searched earlier in the row; the continuation of the most recent match is
  proposed as a point mass (one-hot ``q``), which the residual rule keeps exact. No match: 0 drafts.
- :class:`EarlyExitDraft` (``"early-exit:N"``): the target's first ``N`` layers, final norm and
  head (:func:`early_exit_model`), sharing the target's weights (no copy), run as a
  :class:`ModelDraft` with its own cache.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numba as nb
import numpy as np
import torch

from speculate.distributions import Categorical

from .kv_cache import advance_length, check_model, model_vocab_size, text_config
from .lean_llama import lean_model
from .process import Drafted, TokenBuffer
from .sampling import SamplingConfig, probabilities

__all__ = ["EarlyExitDraft", "ModelDraft", "NgramDraft", "early_exit_model", "make_draft"]


def _sample(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``q`` ``[R, V]``, drawn with ``rng``."""
    return np.asarray(Categorical(probs=q, validate=False).sample(rng), dtype=np.int64)


class ModelDraft:
    """A draft language model with its own position-indexed KV cache.

    After each round its cache keeps the committed tokens it has seen; the tokens it has not seen
    (the verifier's last outcome, and the last draft when every draft was kept) are fed at the
    start of the next proposal, in the same forward pass as the first draft step. Its round state
    (``Drafted.state``) is ``(pending, fed)``: the tokens fed before the first draft step and the
    drafts fed after them.
    """

    def __init__(self, model: Any) -> None:
        check_model(model, "draft")
        self.model = model
        self.lm = lean_model(model)  # a lean loop for Llama drafts (draft steps are mostly overhead)
        self.vocab = model_vocab_size(model)
        cfg = text_config(model.config)
        # tokens the draft lacks (a padded-prefix vocabulary) are shown to it as this id
        unk = next((v for v in (getattr(cfg, "unk_token_id", None), getattr(cfg, "pad_token_id", None))
                    if isinstance(v, int) and 0 <= v < self.vocab), 0)
        self.unknown = unk

    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        B = len(tokens.n)
        self.lm.reset(B, capacity, spare)
        m = int(tokens.n.max()) - 1
        if m > 0:
            rows = np.arange(B, dtype=np.int64)
            block = self._known(tokens.block(rows, np.zeros(B, np.int64), m))
            self.lm.forward(torch.from_numpy(block), np.zeros(B, np.int64), last_only=True,
                            valid=tokens.n - 1)
            self.lm.keep(tokens.n - 1)

    def _known(self, block: np.ndarray) -> np.ndarray:
        """Token ids with those outside the draft's vocabulary replaced by ``self.unknown``."""
        return np.where(block < self.vocab, block, self.unknown)

    def release(self) -> None:
        self.lm.release()

    def select(self, keep: np.ndarray) -> None:
        self.lm.select(keep)

    def _probs(self, logits: torch.Tensor, cfg: SamplingConfig, vocab: int) -> torch.Tensor:
        """Draft probabilities over the target's ``vocab`` ids: ``[R, vocab]`` float32."""
        Vd = logits.shape[-1]
        if Vd > vocab:
            logits = logits[..., :vocab]
        elif Vd < vocab:
            pad = logits.new_full((*logits.shape[:-1], vocab - Vd), float("-inf"))
            logits = torch.cat([logits, pad], dim=-1)
        return probabilities(logits, cfg)

    def propose(
        self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray, cfg: SamplingConfig,
        rng: np.random.Generator, vocab: int,
    ) -> Drafted:
        R = len(rows)
        lengths = np.minimum(np.asarray(need, dtype=np.int64) - 1, k)  # a row uses no more drafts
        steps = int(lengths.max())  # = k in the round loop, which never asks for more
        if steps <= 0:  # nothing to draft: the unseen tokens wait for the next proposal
            none = np.zeros(R, np.int64)
            return Drafted(np.zeros((R, k), np.int64), None, none, (none, none))
        self.lm.ensure_capacity(int(tokens.n[rows].max()) + k + 2)
        start = self.lm.length.copy()  # [R]
        P = tokens.n[rows] - start  # [R] tokens not yet in the draft's cache (>= 1)
        W = int(P.max())
        block = self._known(tokens.block(rows, start, W))  # [R, W]
        logits = self.lm.forward(torch.from_numpy(block), start, valid=P)  # [R, W, Vd]
        dev = logits.device
        last = logits[torch.arange(R, device=dev), torch.as_tensor(P - 1, device=dev)]  # [R, Vd]
        outcomes = np.zeros((R, k), np.int64)
        q = None if cfg.greedy else np.zeros((R, k, vocab), np.float32)
        for i in range(steps):
            if cfg.greedy:  # argmax on the device; the greedy rule needs no draft probabilities
                outcomes[:, i] = self._argmax(last, vocab).cpu().numpy()
            else:
                qi = self._probs(last, cfg, vocab).cpu().numpy()  # [R, V]
                if not np.isfinite(qi.sum(axis=-1)).all():  # NaN logits make a whole row NaN
                    bad = rows[~np.isfinite(qi.sum(axis=-1))][:8].tolist()
                    raise ValueError(
                        f"the draft's logits are not finite (NaN or +inf) for rows {bad}: its "
                        "weights or activations overflowed or hold NaN; check the draft model "
                        "with a plain forward pass (float32 or bfloat16 instead of float16?)")
                q[:, i] = qi
                outcomes[:, i] = _sample(qi, rng)
            if i + 1 < steps:
                x = torch.from_numpy(outcomes[:, i : i + 1])  # [R, 1]
                last = self.lm.forward(x, start + P + i)[:, 0]  # [R, Vd]
        return Drafted(outcomes, q, lengths, (P, np.full(R, steps - 1, np.int64)))

    def _argmax(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """First argmax over the ids both models have: ``[R]``."""
        return logits[..., :vocab].argmax(dim=-1)

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray) -> None:
        """Keep in the cache the tokens of the round that were committed (``state`` from propose)."""
        pending, fed = state
        advance_length(self.lm, pending, fed, n_used, n_accepted)


@nb.njit(cache=True, nogil=True)
def _lookup(ids, n, rows, k, max_n, min_n):  # pragma: no cover - compiled
    """Per row: up to k tokens after the latest earlier match of its longest matching suffix."""
    R = rows.shape[0]
    out = np.zeros((R, k), np.int64)
    lengths = np.zeros(R, np.int64)
    for i in range(R):
        seq = ids[rows[i]]
        L = n[rows[i]]
        for g in range(min(max_n, L - 1), min_n - 1, -1):
            found = -1
            for s in range(L - g - 1, -1, -1):  # window seq[s:s+g], followed by seq[s+g]
                same = True
                for j in range(g):
                    if seq[s + j] != seq[L - g + j]:
                        same = False
                        break
                if same:
                    found = s + g
                    break
            if found >= 0:
                m = min(k, L - found)
                for j in range(m):
                    out[i, j] = seq[found + j]
                lengths[i] = m
                break
    return out, lengths


class NgramDraft:
    """Prompt lookup: propose the continuation of the latest earlier match of the last n tokens.

    >>> import numpy as np
    >>> from speculate.domains.text.process import TokenBuffer
    >>> from speculate.domains.text.sampling import SamplingConfig
    >>> buf = TokenBuffer.from_prompts([[5, 6, 7, 8, 5, 6]], extra=4)
    >>> need = np.array([10])                       # tokens the row still needs
    >>> d = NgramDraft(max_n=2).propose(np.array([0]), buf, 3, need, SamplingConfig(), None, 10)
    >>> d.outcomes[0, : d.lengths[0]].tolist(), d.q is None   # q None: point masses
    ([7, 8, 5], True)
    """

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not (1 <= min_n <= max_n):
            raise ValueError(f"ngram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        pass

    def release(self) -> None:
        pass

    def select(self, keep: np.ndarray) -> None:
        pass

    def propose(
        self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray, cfg: SamplingConfig,
        rng: np.random.Generator | None, vocab: int,
    ) -> Drafted:
        outcomes, lengths = _lookup(tokens.ids, tokens.n, np.asarray(rows, np.int64), int(k),
                                    self.max_n, self.min_n)
        lengths = np.minimum(lengths, np.asarray(need, dtype=np.int64) - 1)  # a row uses no more
        return Drafted(outcomes, None, lengths)  # None: point masses at the outcomes; no state

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray) -> None:
        pass


def _layer_path(model: Any) -> list[str]:
    """Attribute path to the decoder-layer ``ModuleList`` (e.g. ``["model", "layers"]``)."""
    n = int(text_config(model.config).num_hidden_layers)
    found = [name for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name]
    if not found:
        raise ValueError(
            f"early exit needs the {n} decoder layers of {type(model).__name__} as one ModuleList")
    return min(found, key=lambda s: s.count(".")).split(".")


def early_exit_model(target: Any, n_layers: int) -> Any:
    """A causal LM made of ``target``'s first ``n_layers`` layers plus its final norm and head.

    The parameters are the target's own tensors (shared, not copied): the result costs no memory
    and follows the target's device and dtype. The modules on the path to the layer list are
    shallow copies carrying a config with ``num_hidden_layers = n_layers``.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
    ...                   num_attention_heads=2, num_key_value_heads=2)
    >>> t = LlamaForCausalLM(cfg)
    >>> d = early_exit_model(t, 1)
    >>> len(d.model.layers), len(t.model.layers), d.lm_head.weight is t.lm_head.weight
    (1, 3, True)
    """
    path = _layer_path(target)
    owners = [target]
    for name in path[:-1]:
        owners.append(getattr(owners[-1], name))
    layers = getattr(owners[-1], path[-1])
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not (
            1 <= n_layers < len(layers)):
        raise ValueError(
            f"early-exit depth must be an integer in 1..{len(layers) - 1} for a target with "
            f"{len(layers)} layers, got {n_layers!r}"
        )
    cfg = copy.deepcopy(target.config)
    text = text_config(cfg)
    text.num_hidden_layers = n_layers
    types = getattr(text, "layer_types", None)
    if types is not None and len(types) != n_layers:
        try:
            text.layer_types = list(types)[:n_layers]
        except AttributeError:  # derived from num_hidden_layers (a property without a setter)
            pass
    # shallow copies of the modules down to the layer list; everything else is shared
    copies = []
    for mod in owners:
        c = copy.copy(mod)
        c._modules = dict(mod._modules)
        if hasattr(mod, "config"):
            c.config = text if mod.config is text_config(target.config) and mod is not target else cfg
        copies.append(c)
    for parent, child, name in zip(copies[:-1], copies[1:], path[:-1], strict=True):
        parent._modules[name] = child
    first = torch.nn.ModuleList(list(layers)[:n_layers])
    first.training = layers.training  # a new container starts in training mode; not its layers
    copies[-1]._modules[path[-1]] = first
    return copies[0]


class EarlyExitDraft(ModelDraft):
    """Self-speculation: the target's first ``n_layers`` layers, final norm and head as the draft
    (:func:`early_exit_model`, weights shared), with a KV cache of its own.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
    ...                   num_attention_heads=2, num_key_value_heads=2)
    >>> EarlyExitDraft(LlamaForCausalLM(cfg).eval(), 2).n_layers
    2
    """

    def __init__(self, target: Any, n_layers: int) -> None:
        super().__init__(early_exit_model(target, n_layers))
        self.n_layers = n_layers


_EARLY = re.compile(r"^early-exit:(\d+)$")
_NGRAM = re.compile(r"^ngram(?::(\d+))?$")


def make_draft(draft: Any, target: Any) -> ModelDraft | NgramDraft:
    """The draft object for ``draft`` (a model, ``"ngram"``, ``"ngram:N"`` or ``"early-exit:N"``)."""
    if isinstance(draft, str):
        m = _NGRAM.match(draft)
        if m:
            n = int(m.group(1) or 3)
            if n < 1:
                raise ValueError(f"{draft!r}: N in 'ngram:N' (the longest n-gram looked up) must be >= 1")
            return NgramDraft(max_n=n)
        m = _EARLY.match(draft)
        if m:
            return EarlyExitDraft(target, int(m.group(1)))
        raise ValueError(
            f"unknown draft {draft!r}: pass a causal LM, 'ngram', 'ngram:N' or 'early-exit:N'")
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        raise TypeError(
            f"draft must be a transformers causal LM or a string, got {type(draft).__name__}")
    return ModelDraft(draft)
