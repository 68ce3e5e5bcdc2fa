"""Drafts that live on the target (self-speculation): Medusa heads and an EAGLE feature draft.

Both read the target's features (the input of its output embedding), which the target computes
anyway: :class:`~speculate.domains.text.process.TextProcess` keeps them from every forward
(prefill and verification) and hands the draft those of the positions each round commits
(``observe``), so drafting costs only the heads or the one-layer feature draft. Both propose a
chain (``tree=None``: verified by the block, token or greedy rule) or a token tree
(:mod:`~speculate.domains.text.token_trees`: static or dynamic shape, verified by the tree rule),
drawn from exactly the law handed to the verifier, after every generation setting.

- :class:`MedusaDraft`: head ``i`` gives the law at depth ``i + 1`` from the feature of the
  position before the last committed token (the one whose logits gave that token); every node of
  a depth draws its children from the same head (after the settings, with the node's prefix).
- :class:`EagleDraft`: the feature draft runs autoregressively in feature space with its own
  position-indexed cache: the committed positions' columns (true target feature, next token) are
  fed once; a tree is drafted level by level, each node's column (its parent's predicted feature,
  its token) attending to the committed columns and its ancestors.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from speculate import Categorical
from speculate.verify import Tree

from .feature_draft import FeatureDraft
from .heads import MedusaHeads
from .process import Drafted, DraftedTree, TokenBuffer
from .processors import Transforms, as_transforms
from .runtime.kv_cache import execution_device
from .sampling import SamplingConfig, probabilities
from .token_trees import DynamicTree, StaticTree, as_tree_spec, grow_tree

__all__ = ["EagleDraft", "MedusaDraft"]


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


def _draw_depth(logits: torch.Tensor, tr: Transforms, rng: np.random.Generator, out: np.ndarray,
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


class _FeatureReader:
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


class MedusaDraft(_FeatureReader):
    """Medusa heads on the target: one call on one feature per row drafts every depth.

    >>> from speculate.domains.text.conformance import tiny_llama
    >>> target = tiny_llama(vocab=16)
    >>> draft = MedusaDraft(MedusaHeads.for_target(target, n_heads=3), target, tree=[2, 2])
    >>> draft.spec.n_nodes
    6
    """

    def __init__(self, heads: MedusaHeads, target: Any, tree: Any = None) -> None:
        heads.check_target(target)
        super().__init__(target, tree, heads.n_heads, f"Medusa heads ({heads.n_heads} heads)")
        self.heads = heads
        self.feat: torch.Tensor | None = None  # [R, H]: the feature before each row's last token
        self.has = np.zeros(0, bool)

    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        self.feat, self.has = None, np.zeros(len(tokens.n), bool)

    def release(self) -> None:
        self.feat = None

    def select(self, keep: np.ndarray) -> None:
        self.has = self.has[keep]
        if self.feat is not None:
            self.feat = self.feat[torch.as_tensor(keep, device=self.feat.device)]

    def observe(self, features: torch.Tensor | None, count: np.ndarray) -> None:
        """Keep each row's last committed feature (``features[r, count[r] - 1]``)."""
        if features is None:
            return
        if self.feat is None:
            self.feat = features.new_zeros(len(count), features.shape[-1])
        on = np.flatnonzero(count > 0)
        if len(on):
            idx = torch.as_tensor(on, device=features.device)
            self.feat[idx] = features[idx, torch.as_tensor(count[on] - 1, device=features.device)]
            self.has[on] = True

    def _ready(self) -> np.ndarray:
        return self.has.copy()

    def _chain(self, rows: np.ndarray, tokens: TokenBuffer, k: int, cap: np.ndarray, tr: Transforms,
               rng: np.random.Generator, vocab: int) -> Drafted:
        """Every depth's law from ONE call of the heads, all drafts drawn in one call (the heads do not
        read the drafts before them, so draft i's law given them is head i's)."""
        R = len(rows)
        lengths = np.where(self.has, np.maximum(cap, 0), 0).astype(np.int64)
        steps = int(lengths.max(initial=0))
        out = np.zeros((R, k), np.int64)
        whole = steps == k and self.heads.config["vocab_size"] == vocab  # the laws ARE q: no copy
        q = None if tr.greedy or whole else np.zeros((R, k, vocab), np.float32)
        if steps == 0:
            return Drafted(out, q, lengths, None)
        x = self.heads.draft_logits(self.feat)  # [R, n_heads, V]
        if steps < x.shape[1]:
            x = x[:, :steps]  # [R, steps, V]
        pr = _draw_depth(x, tr, rng, out, q, slice(0, steps))  # every depth at once, in row-major order
        return Drafted(out, pr if whole else q, lengths, None)

    def _logits_at(self, rows: np.ndarray, tokens: TokenBuffer):
        logits = self.heads.draft_logits(self.feat) if self.feat is not None else None  # [R, n_heads, V]: ONE call

        def at(nodes: np.ndarray, d: int, parent: np.ndarray, toks: np.ndarray) -> torch.Tensor:
            return logits[:, d][:, None].expand(-1, nodes.shape[1], -1)  # [R, M, V]: every node of depth d

        return at


class EagleDraft(_FeatureReader):
    """An EAGLE-style feature draft with its own position-indexed cache (see the module docstring).

    Column at position ``j``: (the target's feature at ``j``, the token at ``j + 1``); its output
    predicts the feature at ``j + 1``, whose logits (the target's head) are the law of the token at
    ``j + 2``. Committed columns sit at slots equal to their positions; a tree's node ``v`` at slot
    ``n - 1 + v`` (``n``: the row's committed columns), overwritten by the next round.
    """

    def __init__(self, draft: FeatureDraft, target: Any, tree: Any = None) -> None:
        draft.check_target(target)
        super().__init__(target, tree, None, "feature draft")  # autoregressive: any depth
        self.fd = draft
        self.layer: Any = draft  # what drafting calls: the draft's decoding form (see propose)
        self.cache = draft.new_cache()
        self.fbuf: torch.Tensor | None = None  # [B, C, H]: the target's features by position
        self.flen = np.zeros(0, np.int64)  # features known per row (positions 0 .. flen - 1)
        self.clen = np.zeros(0, np.int64)  # committed columns in the draft's cache
        self.capacity = 0

    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        B = len(tokens.n)
        self.capacity = capacity + spare + (self.spec.n_nodes if self.spec is not None else 0) + 2
        self.cache.reset(B, self.capacity)
        self.fbuf = None
        self.flen = np.zeros(B, np.int64)
        self.clen = np.zeros(B, np.int64)

    def release(self) -> None:
        self.cache.release()
        self.fbuf = None

    def select(self, keep: np.ndarray) -> None:
        self.cache.select(keep)
        self.flen, self.clen = self.flen[keep], self.clen[keep]
        if self.fbuf is not None:
            self.fbuf = self.fbuf[torch.as_tensor(keep, device=self.fbuf.device)]

    def observe(self, features: torch.Tensor | None, count: np.ndarray) -> None:
        """Append ``features[r, :count[r]]`` (the next positions' target features) to each row."""
        if features is None:
            return
        if self.fbuf is None:
            self.fbuf = features.new_zeros(len(count), self.capacity, features.shape[-1])
        r, j = np.nonzero(np.arange(features.shape[1])[None, :] < count[:, None])
        if len(r):
            dev = features.device
            rt, jt = torch.as_tensor(r, device=dev), torch.as_tensor(j, device=dev)
            self.fbuf[rt, torch.as_tensor(self.flen[r] + j, device=dev)] = features[rt, jt]
        self.flen = self.flen + count

    def _ready(self) -> np.ndarray:
        return self.flen > 0

    def propose(self, *args: Any, **kwargs: Any) -> Drafted | DraftedTree:
        # without autograd the draft would run its decoding form anyway: call it directly (its
        # weights checked once per round, not at every column)
        self.layer = self.fd if torch.is_grad_enabled() else self.fd.folded()
        return super().propose(*args, **kwargs)

    def _root(self, rows: np.ndarray, tokens: TokenBuffer) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row's pending columns (true features; committed from now on) and return the
        last one's output: the predicted feature at the root ``[R, H]`` and its logits ``[R, V]``
        (the law at depth 1)."""
        R = len(rows)
        dev = self.fd.fc.weight_t.device
        n = self.flen
        rt = torch.arange(R, device=dev)
        P = n - self.clen  # [R]
        W = max(int(P.max()), 1)
        pos = self.clen[:, None] + np.arange(W)[None, :]  # [R, W] positions = slots
        known = np.minimum(pos, np.maximum(n - 1, 0)[:, None])
        if R == 1:  # one run of positions: a slice
            feats = self.fbuf.narrow(1, int(known[0, 0]), W)  # [1, W, H]
        else:
            feats = self.fbuf[rt[:, None], torch.as_tensor(known, device=dev)]  # [R, W, H]
        nxt = tokens.ids[rows[:, None], np.minimum(pos + 1, tokens.ids.shape[1] - 1)]  # [R, W]
        last = np.maximum(P - 1, 0)  # on the host: a slice where every row's last column is the block's
        h, lg = self.layer(feats, torch.as_tensor(nxt, device=dev), pos, self.cache, pos,
                           keep=last)  # causal over the slots; the outputs of each row's last column
        self.clen = n.copy()
        return h[:, 0], lg[:, 0]

    def _chain(self, rows: np.ndarray, tokens: TokenBuffer, k: int, cap: np.ndarray, tr: Transforms,
               rng: np.random.Generator, vocab: int) -> Drafted:
        """A chain (no prefix processors): the root column, then one column per draft, node ``d`` at
        slot and position ``n - 1 + d`` seeing every slot up to its own (the committed columns and
        the chain above it). The same columns as a one-branch tree, without its masks by ancestry."""
        R = len(rows)
        lengths = np.where(self._ready(), np.maximum(cap, 0), 0).astype(np.int64)
        steps = int(lengths.max(initial=0))
        out = np.zeros((R, k), np.int64)
        q = None if tr.greedy else np.zeros((R, k, vocab), np.float32)
        if steps == 0:
            return Drafted(out, q, lengths, None)
        h, lg = self._root(rows, tokens)  # [R, H], [R, V]
        dev = h.device
        slot = (self.flen - 1)[:, None]  # [R, 1]: the root's (on the host: no device sync per step)
        for d in range(steps):
            _draw_depth(lg, tr, rng, out, q, d)
            if d + 1 < steps:  # node d + 1: (the feature predicted at node d, draft d)
                slot = slot + 1
                hh, ll = self.layer(h[:, None], torch.as_tensor(out[:, d : d + 1], device=dev), slot, self.cache,
                                    slot)  # position = slot: sees every slot up to its own
                h, lg = hh[:, 0], ll[:, 0]
        return Drafted(out, q, lengths, None)

    def _logits_at(self, rows: np.ndarray, tokens: TokenBuffer):
        R = len(rows)
        dev = self.fd.fc.weight_t.device
        n = self.flen.copy()  # committed columns after this round's pending ones
        hid: list[torch.Tensor] = []  # [R, N+1, H]: the predicted feature at each node (allocated at the root)
        rr = np.arange(R)
        rt = torch.as_tensor(rr, device=dev)

        def at(nodes: np.ndarray, d: int, parent: np.ndarray, toks: np.ndarray) -> torch.Tensor:
            N1 = parent.shape[1]
            if d == 0:  # the pending columns (true features); the last one (the root's) predicts depth 1
                h, lg = self._root(rows, tokens)
                hid.append(h.new_zeros(R, N1, h.shape[-1]))
                hid[0][:, 0] = h
                return lg[:, None]  # [R, 1, V]
            M = nodes.shape[1]
            on = nodes >= 0
            v = np.maximum(nodes, 0)  # [R, M]
            par = np.where(on, parent[rr[:, None], v], 0)  # [R, M]
            f_in = hid[0][rt[:, None], torch.as_tensor(par, device=dev)]  # [R, M, H]: the parent's prediction
            C = int(n.max()) + N1  # slots: the committed columns, the tree's nodes, one spare
            slots = np.where(on, n[:, None] - 1 + v, C - 1)  # [R, M]
            pos = np.repeat((n - 1 + d)[:, None], M, axis=1)  # [R, M]
            s = np.arange(C)[None, None, :]
            visible = (s < n[:, None, None]) & on[:, :, None]  # [R, M, C]: the committed columns (root's too)
            cur = v.copy()
            for _ in range(d):  # the node and its ancestors below the root
                up = on & (cur > 0)
                r_, m_ = np.nonzero(up)
                visible[r_, m_, n[r_] - 1 + cur[r_, m_]] = True
                cur = np.where(up, parent[rr[:, None], cur], 0)
            r_, m_ = np.nonzero(~on)
            visible[r_, m_, C - 1] = True  # unused columns see only their own spare slot
            h, lg = self.layer(f_in, torch.as_tensor(toks[rr[:, None], v], device=dev), pos, self.cache, slots,
                               torch.as_tensor(visible, device=dev))
            r_, m_ = np.nonzero(on)
            hid[0][torch.as_tensor(r_, device=dev), torch.as_tensor(v[r_, m_], device=dev)] = h[
                torch.as_tensor(r_, device=dev), torch.as_tensor(m_, device=dev)]
            return lg  # [R, M, V]

        return at

