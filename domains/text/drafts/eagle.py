"""An EAGLE-style feature draft (``draft=FeatureDraft``): it runs autoregressively in feature space
with its own position-indexed cache: the committed positions' columns (true target feature, next
token) are fed once; a tree is drafted level by level, each node's column (its parent's predicted
feature, its token) attending to the committed columns and its ancestors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..request.processors import Transforms
from ..request.tokens import TokenBuffer
from ..training.feature_draft import FeatureDraft
from .base import Drafted, DraftedTree, DraftOptions
from .on_target import FeatureReader, draw_depth, refuse_encoder_decoder

__all__ = ["EagleDraft"]


class EagleDraft(FeatureReader):
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

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> EagleDraft | None:
        if not isinstance(draft, FeatureDraft):
            return None
        refuse_encoder_decoder(target)
        return cls(draft, target, options.tree)

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
            draw_depth(lg, tr, rng, out, q, d)
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
