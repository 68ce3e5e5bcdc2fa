"""Medusa heads on the target (``draft=MedusaHeads``): head ``i`` gives the law at depth ``i + 1`` from
the feature of the position before the last committed token (the one whose logits gave that token);
every node of a depth draws its children from the same head (after the settings, with the node's
prefix)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..request.processors import Transforms
from ..request.tokens import TokenBuffer
from ..training.heads import MedusaHeads
from .base import Drafted, DraftOptions
from .on_target import FeatureReader, draw_depth, refuse_encoder_decoder

__all__ = ["MedusaDraft"]


class MedusaDraft(FeatureReader):
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

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> MedusaDraft | None:
        if not isinstance(draft, MedusaHeads):
            return None
        refuse_encoder_decoder(target)
        return cls(draft, target, options.tree)

    def default_lookahead(self) -> int:
        return self.spec.depth if self.spec is not None else min(4, self.heads.n_heads)

    def lookahead_limit(self) -> tuple[int, str]:
        n = self.heads.n_heads
        return n, f"the Medusa heads draft at most {n} tokens (one per head)"

    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        self.feat, self.has = None, np.zeros(len(tokens.n), bool)

    def release(self) -> None:
        self.feat = None

    def select(self, keep: np.ndarray) -> None:
        self.has = self.has[keep]
        if self.feat is not None:
            self.feat = self.feat[torch.as_tensor(keep, device=self.feat.device)]

    def join_refusal(self) -> str | None:
        return None

    def absorb(self, other: MedusaDraft) -> None:  # type: ignore[override]
        if self.feat is not None or other.feat is not None:  # type: ignore[attr-defined]
            ref = self.feat if self.feat is not None else other.feat  # type: ignore[attr-defined]
            mine = self.feat if self.feat is not None else ref.new_zeros(len(self.has), ref.shape[-1])
            theirs = other.feat if other.feat is not None else ref.new_zeros(len(other.has), ref.shape[-1])  # type: ignore[attr-defined]
            self.feat = torch.cat([mine, theirs.to(mine.device)])
        self.has = np.concatenate([self.has, other.has])  # type: ignore[attr-defined]

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
        pr = draw_depth(x, tr, rng, out, q, slice(0, steps))  # every depth at once, in row-major order
        return Drafted(out, pr if whole else q, lengths, None)

    def _logits_at(self, rows: np.ndarray, tokens: TokenBuffer):
        logits = self.heads.draft_logits(self.feat) if self.feat is not None else None  # [R, n_heads, V]: ONE call

        def at(nodes: np.ndarray, d: int, parent: np.ndarray, toks: np.ndarray) -> torch.Tensor:
            return logits[:, d][:, None].expand(-1, nodes.shape[1], -1)  # [R, M, V]: every node of depth d

        return at
