"""A smaller causal LM as the draft (:class:`ModelDraft`), and early exit (:class:`EarlyExitDraft`,
``"early-exit:N"``: the target's first ``N`` layers, final norm and head, weights shared).

A draft model shares the target's tokenizer; its vocabulary may be a padded prefix of the target's
(or the reverse): ids the draft lacks get probability 0, ids the target lacks are never proposed.
It has its own position-indexed KV cache (a lean loop for Llama drafts, transformers' own cache for
a model the position-indexed cache refuses).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any

import numpy as np
import torch

from speculate.distributions import Categorical
from speculate.verify.device import DeviceCategorical, draw, upload

from ..models.facts import check_vocabularies, model_vocab_size, reads_encoder, text_config
from ..models.kv_cache import advance_length
from ..models.pick import pick_runtime
from ..request.processors import Transforms, as_transforms
from ..request.sampling import SamplingConfig
from ..request.tokens import TokenBuffer
from .base import Draft, Drafted, DraftOptions, named_kind, refuse_tree

__all__ = ["EarlyExitDraft", "ModelDraft", "early_exit_model"]


def unknown_id(model: Any, vocab: int) -> int:
    """The id shown to a draft for tokens its vocabulary lacks (a padded-prefix vocabulary)."""
    cfg = text_config(model.config)
    return next((v for v in (getattr(cfg, "unk_token_id", None), getattr(cfg, "pad_token_id", None))
                 if isinstance(v, int) and 0 <= v < vocab), 0)


def _sample(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``q`` ``[R, V]``, drawn with ``rng``."""
    return np.asarray(Categorical(probs=q, validate=False).sample(rng), dtype=np.int64)


class ModelDraft(Draft):
    """A draft language model with its own position-indexed KV cache.

    After each round its cache keeps the committed tokens it has seen; the tokens it has not seen
    (the verifier's last outcome, and the last draft when every draft was kept) are fed at the
    start of the next proposal, in the same forward pass as the first draft step. Its round state
    (``Drafted.state``) is ``(pending, fed)``: the tokens fed before the first draft step and the
    drafts fed after them.
    """

    static_target = True  # a Llama target may run static steps beside it

    def __init__(self, model: Any) -> None:
        self.model = model
        # a lean loop for Llama drafts (draft steps are mostly overhead); transformers' own cache for a
        # model the position-indexed cache refuses
        self.lm = pick_runtime(model, "draft", lean=True)
        self.vocab = model_vocab_size(model)
        self.unknown = unknown_id(model, self.vocab)

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> ModelDraft | None:
        if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
            return None
        if reads_encoder(draft):
            raise ValueError(
                f"the draft {type(draft).__name__} reads an encoder's output but the target "
                f"{type(target).__name__} is a decoder-only LM: an encoder-decoder draft needs an "
                "encoder-decoder target")
        refuse_tree(draft, options)
        check_vocabularies(target, draft, options.tokenizer, options.draft_tokenizer)
        return cls(draft)

    def models(self) -> list[tuple[Any, str]]:
        return [(self.model, "draft")]

    def use_static(self) -> bool:
        """A Llama-architecture draft runs static steps (its lean loop); others keep their cache."""
        from ..models.lean_llama import LeanLlama

        if isinstance(self.lm, LeanLlama):
            self.lm.use_static()
            return True
        return False

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

    def join_refusal(self) -> str | None:
        join = getattr(self.lm, "join_refusal", None)
        return (f"the draft's runtime {type(self.lm).__name__} cannot take rows into a running batch"
                if join is None else join())

    def fresh(self) -> ModelDraft:
        twin = copy.copy(self)
        twin.lm = copy.copy(self.lm)  # the same model, caches of its own at reset
        return twin

    def absorb(self, other: Draft) -> None:
        self.lm.absorb(other.lm)  # type: ignore[attr-defined]

    def _probs(self, logits: torch.Tensor, cfg: SamplingConfig | Transforms, vocab: int,
               tokens: TokenBuffer | None = None, rows: np.ndarray | None = None,
               drafts: np.ndarray | None = None, first: int = 0) -> torch.Tensor:
        """Draft probabilities over the target's ``vocab`` ids: ``[R, vocab]`` float32, after every
        transform of ``cfg`` with each row's prefix (committed tokens, then ``drafts[:, :first]``)."""
        Vd = logits.shape[-1]
        if Vd > vocab:
            logits = logits[..., :vocab]
        elif Vd < vocab:
            pad = logits.new_full((*logits.shape[:-1], vocab - Vd), float("-inf"))
            logits = torch.cat([logits, pad], dim=-1)
        tr = as_transforms(cfg)
        if not tr.active:
            return tr.probs(logits[:, None], None, None, None)[:, 0]
        return tr.probs(logits[:, None], tokens, rows, drafts, first)[:, 0]

    def propose(
        self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray,
        cfg: SamplingConfig | Transforms, rng: np.random.Generator, vocab: int,
    ) -> Drafted:
        R = len(rows)
        prefixed = as_transforms(cfg).active  # transforms that read each position's prefix
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
        last = logits[torch.arange(R, device=dev), upload(P - 1, dev)]  # [R, Vd]
        if self.on_device and not prefixed:
            return self._on_device(last, start, P, lengths, steps, k, cfg, rng, vocab)
        outcomes = np.zeros((R, k), np.int64)
        q = None if cfg.greedy else np.zeros((R, k, vocab), np.float32)
        for i in range(steps):
            if cfg.greedy and not prefixed:  # argmax on the device; greedy needs no draft law
                outcomes[:, i] = self._argmax(last, vocab).cpu().numpy()
            elif cfg.greedy:  # the argmax of the processed logits (prefix: drafts before step i)
                outcomes[:, i] = self._probs(last, cfg, vocab, tokens, rows, outcomes, i).argmax(-1).cpu().numpy()
            else:
                qi = self._probs(last, cfg, vocab, tokens, rows, outcomes, i).cpu().numpy()  # [R, V]
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

    def _on_device(self, last: torch.Tensor, start: np.ndarray, P: np.ndarray, lengths: np.ndarray, steps: int,
                   k: int, cfg: SamplingConfig | Transforms, rng: np.random.Generator, vocab: int) -> Drafted:
        """Drafting where the draft's logits are (``on_device``, no prefix processors): each step's
        draft is drawn there (inverse CDF at a uniform from ``rng``, the uniform per row that
        Categorical.sample would take; the round's uniforms go up in one copy) and fed back without a
        trip to the host; the drafts come back once, at the end, and their laws stay on the device
        for its verification."""
        R = len(start)
        xs, qs = [], []
        # every step's uniforms in one upload: the numbers of one rng.random(R) per step, as the host path
        # draws them (so both paths give the same tokens, with one generator or one stream per row)
        u = None if cfg.greedy else upload(np.stack([rng.random(R) for _ in range(steps)]), last.device)
        for i in range(steps):
            if cfg.greedy:
                x = self._argmax(last, vocab)  # [R]
            else:
                qi = self._probs(last, cfg, vocab)  # [R, V]
                x = draw(qi.double(), u[i])
                qs.append(qi)
            xs.append(x)
            if i + 1 < steps:
                last = self.lm.forward(x[:, None], start + P + i)[:, 0]  # [R, Vd]
        outcomes = np.zeros((R, k), np.int64)
        outcomes[:, :steps] = torch.stack(xs, dim=1).cpu().numpy()  # the round's one transfer of drafts
        q = None
        if qs:
            qd = torch.stack(qs, dim=1)  # [R, steps, V]
            if steps < k:
                qd = torch.cat([qd, qd.new_full((R, k - steps, qd.shape[-1]), 1.0 / qd.shape[-1])], dim=1)
            q = DeviceCategorical(qd)
        return Drafted(outcomes, q, lengths, (P, np.full(R, steps - 1, np.int64)))

    def _argmax(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """First argmax over the ids both models have: ``[R]``."""
        return logits[..., :vocab].argmax(dim=-1)

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray, path: Any = None) -> None:
        """Keep in the cache the tokens of the round that were committed (``state`` from propose)."""
        pending, fed = state
        advance_length(self.lm, pending, fed, n_used, n_accepted)


def _layer_path(model: Any) -> list[str]:
    """Attribute path to the decoder-layer ``ModuleList`` (e.g. ``["model", "layers"]``)."""
    n = int(text_config(model.config).num_hidden_layers)
    found = [name for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name]
    if not found:
        raise ValueError(
            f"early exit needs the {n} decoder layers of {type(model).__name__} as one ModuleList")
    return min(found, key=lambda s: s.count(".")).split(".")


def _rebind_hook(copied: torch.nn.Module) -> None:
    """Point an accelerate hook's forward (``device_map``, offload) at ``copied`` instead of the
    module it was copied from: the shallow copy's ``forward`` is otherwise the original's, which
    would run all the target's layers instead of the copy's first few."""
    hook = copied.__dict__.get("_hf_hook")
    if hook is None or "forward" not in copied.__dict__:
        return
    inner = type(copied).forward.__get__(copied)

    def forward(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = hook.pre_forward(copied, *args, **kwargs)
        with torch.no_grad() if getattr(hook, "no_grad", False) else contextlib.nullcontext():
            out = inner(*args, **kwargs)
        return hook.post_forward(copied, out)

    copied.__dict__["_old_forward"] = inner
    copied.__dict__["forward"] = functools.update_wrapper(forward, inner)  # keeps the signature


def early_exit_model(target: Any, n_layers: int, path: list[str] | None = None) -> Any:
    """A causal LM made of ``target``'s first ``n_layers`` layers plus its final norm and head.

    ``path``: the attribute path to the layer list to cut (default: the decoder layers of a causal
    LM; an encoder-decoder passes its decoder's, :func:`decoder_layers_path`, and keeps its encoder).

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
    own_configs = path is not None  # an encoder-decoder: its decoder stack may have its own config
    path = path or _layer_path(target)
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
    for attr in ("decoder_layers", "num_decoder_layers"):  # encoder-decoders: the decoder's depth
        if isinstance(getattr(cfg, attr, None), int):
            setattr(cfg, attr, n_layers)
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
        _rebind_hook(c)
        if hasattr(mod, "config"):
            if mod is not target and mod.config is text_config(target.config):
                c.config = text
            elif mod is target or mod.config is target.config or not own_configs:
                c.config = cfg
            # else: a decoder stack's own config (T5's is_decoder=True copy) is kept
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

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> EarlyExitDraft | None:
        n = named_kind(draft, "early-exit", options)
        return None if n is None else cls(target, n)
