"""What the drafts that live on the target (Medusa heads, the EAGLE-style feature draft) share.

Both read the target's features (the input of its output embedding), which the target computes
anyway: :class:`~speculate.domains.text.process.TextProcess` keeps them from every forward
(prefill and verification) and hands the draft those of the positions each round commits
(``observe``), so drafting costs only the heads or the one-layer feature draft. Both propose a
chain (``tree=None``: verified by the block, token or greedy rule) or a token tree
(:mod:`~speculate.domains.text.drafts.trees`: static or dynamic shape, verified by the tree rule),
drawn from exactly the law handed to the verifier, after every generation setting.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from speculate import Categorical
from speculate.verify import Tree

from ..models.facts import execution_device, reads_encoder
from ..request.processors import Transforms, as_transforms
from ..request.sampling import SamplingConfig, probabilities
from ..request.tokens import TokenBuffer
from .base import Draft, Drafted, DraftedTree
from .trees import DynamicTree, StaticTree, as_tree_spec, grow_tree

__all__ = ["FeatureReader", "draw_depth", "refuse_encoder_decoder"]


def refuse_encoder_decoder(target: Any) -> None:
    """``ValueError`` for an encoder-decoder ``target``: drafts on the target are for decoder-only LMs."""
    if reads_encoder(target):
        raise ValueError(f"{type(target).__name__} is an encoder-decoder: draft heads, feature drafts and token "
                         "trees are for decoder-only targets; pass a draft model, 'ngram' or 'early-exit:N'")


@functools.lru_cache(maxsize=64)
def _chain(k: int) -> StaticTree:
    """The chain of depth ``k`` (one per depth, shared: its levels are planned once)."""
    return StaticTree(Tree.from_branching([1] * k).parent if k > 0 else np.array([-1], np.int64))


def _as_chain(tokens: np.ndarray, q: np.ndarray | None, valid: np.ndarray, k: int) -> Drafted:
    """A chain grown as a tree (node i = depth i) as a :class:`Drafted`: draft i was sampled from q at node i - 1."""
    R = len(tokens)
    out = np.zeros((R, k), np.int64)
    n = min(k, tokens.shape[1] - 1)
    out[:, :n] = tokens[:, 1 : n + 1]
    qq = None
    if q is not None:
        qq = np.zeros((R, k, q.shape[-1]), np.float32)
        qq[:, :n] = q[:, :n]
    return Drafted(out, qq, valid[:, 1:].sum(axis=1).astype(np.int64), None)


def draw_depth(logits: torch.Tensor, tr: Transforms, rng: np.random.Generator, out: np.ndarray,
                q: np.ndarray | None, d: int | slice) -> np.ndarray | None:
    """Draft depth ``d`` (or the depths of a slice) of every row from the draft's ``logits`` ``[R, V]``
    (``[R, depths, V]``): the argmax when greedy, else a draw from the law after the settings,
    recorded in ``q[:, d]`` (what the verifier gets; ``q=None``: not copied). Returns that law
    (None when greedy)."""
    x = logits.float()
    if tr.greedy:
        out[:, d] = x.argmax(-1).cpu().numpy()
        return None
    pr = probabilities(x, tr.cfg).cpu().numpy()  # [R, V] or [R, depths, V]
    try:  # one uniform per row, row-major; a row with NaN raises
        idx = Categorical(pr, validate=False).sample(rng)
    except ValueError:  # softmax rows are NaN only where a logit was NaN or +inf
        raise ValueError("the draft's logits are not finite (NaN or +inf): its weights or "
                         "activations overflowed or hold NaN") from None
    if q is not None:
        q[:, d] = pr
    out[:, d] = idx
    return pr


class FeatureReader(Draft):
    """What both drafts share: the tree shape, and the rows' features kept from ``observe``."""

    reads_features = True

    def __init__(self, target: Any, tree: Any, max_depth: int | None, what: str) -> None:
        """``max_depth``: the deepest level the draft can draft (the heads' count; None: any)."""
        dynamic = isinstance(tree, str) and tree == "dynamic"
        self.spec = DynamicTree(depth=min(4, max_depth or 4)) if dynamic else as_tree_spec(tree)
        if max_depth is not None and self.spec is not None and self.spec.depth > max_depth:
            raise ValueError(f"the tree is {self.spec.depth} levels deep but the {what} drafts at most "
                             f"{max_depth} levels; use a shallower tree")
        self.max_depth = max_depth if max_depth is not None else (self.spec.depth if self.spec else 1 << 30)
        self.device = execution_device(target)

    def propose(self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray,
                cfg: SamplingConfig | Transforms, rng: np.random.Generator, vocab: int) -> Drafted | DraftedTree:
        tr = as_transforms(cfg)
        cap = np.minimum(np.asarray(need, np.int64) - 1, self.max_depth)
        if self.spec is None:
            cap = np.minimum(cap, k)
            if not tr.active:  # no prefix processors: one law per depth, sampled in one call
                return self._chain(rows, tokens, k, cap, tr, rng, vocab)
        spec = self.spec if self.spec is not None else _chain(min(k, self.max_depth))
        toks, q, valid, parent = grow_tree(spec, self._logits_at(rows, tokens), tr, tokens, rows, cap,
                                           self._ready(), rng, vocab)
        if self.spec is None:
            return _as_chain(toks, q, valid, k)
        return DraftedTree(toks, q, valid, Tree(parent, spec.replacement), None)

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray, path: Any = None) -> None:
        """Nothing to roll back: the next round's features come from the target (``observe``)."""
