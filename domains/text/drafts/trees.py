"""Token trees for drafts that propose several candidates per position (heads, feature drafts).

A tree is grown level by level from the root (the row's committed tokens): at depth ``d`` the
draft gives its logits at every node of the level, the generation settings turn them into the
law ``q`` at each node (with that node's own prefix: the committed tokens, then the path's
tokens), the shape decides how many children each node gets, and the children are drawn from
``q`` at their parent: without replacement (``replacement=False``, Gumbel-top-c: the sequential
law, distinct siblings) or i.i.d. The verifier (``speculate.verify.verify_tree``, proofs/11) then
keeps an exactly distributed path.

Shapes (what ``SpeculativeGenerator(..., tree=...)`` takes, :func:`as_tree_spec`):

- :class:`StaticTree`: the same shape every round: a branching list (``[4, 2, 1]``: 4 children
  of the root, 2 under each, 1 under each of those) or any parent array / ``speculate.verify.Tree``;
- :class:`DynamicTree` (``"dynamic"``): EAGLE-2-style, confidence-driven. Each level has ``width``
  nodes; the node ``v`` of the frontier gets its ``j``-th child when ``s(v) * q_v[j]`` (``v``'s
  value times ``q_v``'s ``j``-th largest value) is among the level's ``width`` largest, and that
  product is the child's value (the root's is 1). EAGLE-2 ranks by the draft probability of the
  drawn path, right for top-k drafting; here children are sampled, and a child drawn with low
  probability is still accepted with probability about ``min(1, p / q)``, so its value is the
  one that chose it: ranking by the drawn tokens' probabilities cut sampled paths short and
  kept fewer tokens per call than a chain with the feature draft. The count of a node's children
  is decided before they are drawn and from what was drawn before them only, which keeps
  verification exact (proofs/11, "shapes chosen while drafting"); re-ranking nodes after they are
  drawn (EAGLE-2's last step) would not.

>>> spec = as_tree_spec([2, 1])
>>> spec.parent.tolist(), spec.n_nodes, spec.depth
([-1, 0, 0, 1, 2], 4, 2)
>>> as_tree_spec("dynamic")
DynamicTree(width=4, depth=4, max_children=4, replacement=False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from speculate.verify import Tree
from speculate.verify.tree import tree_depths

from ..request.processors import Transforms
from ..request.sampling import probabilities

__all__ = ["DynamicTree", "StaticTree", "as_tree_spec", "grow_tree", "node_scores", "tree_probs"]


@dataclass(frozen=True)
class StaticTree:
    """The same tree shape every round: ``parent`` int64 ``[N+1]`` (``parent[0] = -1``, ``parent[i] < i``)."""

    parent: np.ndarray
    replacement: bool = False

    @property
    def n_nodes(self) -> int:
        return len(self.parent) - 1

    @cached_property
    def depth(self) -> int:
        return int(tree_depths(self.parent).max())

    @cached_property
    def plan(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per level d: the children's slots ``[M, C]`` of its M nodes (-1 pads), and the next level's nodes."""
        levels = _levels(self.parent)
        out = []
        for d in range(len(levels) - 1):
            kids = [np.flatnonzero(self.parent == v) for v in levels[d]]
            slots = np.full((len(kids), max(len(c) for c in kids)), -1, np.int64)
            for m, c in enumerate(kids):
                slots[m, : len(c)] = c
            out.append((slots, levels[d + 1]))
        return out


@dataclass(frozen=True)
class DynamicTree:
    """A confidence-driven shape: ``width`` nodes per level, ``depth`` levels, at most
    ``max_children`` children per node (see the module docstring)."""

    width: int = 4
    depth: int = 4
    max_children: int = 4
    replacement: bool = False

    @property
    def n_nodes(self) -> int:
        return self.width * self.depth


def as_tree_spec(tree: Any, replacement: bool = False) -> StaticTree | DynamicTree | None:
    """``tree`` as a shape: None (chains), a branching list, a parent array or ``Tree``, ``"dynamic"``
    or a :class:`DynamicTree`. Raises ``ValueError`` naming what is wrong before any work."""
    if tree is None or isinstance(tree, (StaticTree, DynamicTree)):
        if isinstance(tree, DynamicTree):
            for name in ("width", "depth", "max_children"):
                v = getattr(tree, name)
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise ValueError(f"DynamicTree.{name} must be an int >= 1, got {v!r}")
        return tree
    if isinstance(tree, str):
        if tree != "dynamic":
            raise ValueError(f"tree must be None, a branching list, a parent array, a Tree or 'dynamic', got {tree!r}")
        return DynamicTree(replacement=replacement)
    if isinstance(tree, Tree):
        parent, replacement = np.asarray(tree.parent), bool(tree.replacement)
    else:
        try:
            b = [int(v) for v in tree]
        except (TypeError, ValueError):
            raise ValueError(f"tree must be None, a branching list, a parent array, a Tree or 'dynamic', "
                             f"got {tree!r}") from None
        if not b or any(v < 1 for v in b):
            raise ValueError(f"a branching list needs one factor >= 1 per depth, got {b}")
        parent = Tree.from_branching(b).parent
    if parent.ndim != 1 or len(parent) < 2 or parent[0] != -1 or any(
            not 0 <= parent[i] < i for i in range(1, len(parent))):
        raise ValueError("a tree's parent array must be 1-D with parent[0] = -1 and 0 <= parent[i] < i for the "
                         f"drafted nodes, got {np.asarray(parent).tolist()}")
    return StaticTree(np.asarray(parent, np.int64), replacement)


def node_scores(tr: Transforms, logits: torch.Tensor, buf: Any, rows: np.ndarray, path: np.ndarray,
                d: int) -> torch.Tensor:
    """The processed logits (before the warpers) at ``M`` nodes of depth ``d``: ``logits`` ``[M, V]``,
    node ``i`` of buffer row ``rows[i]`` with prefix = the committed tokens, then ``path[i, :d]``."""
    if not tr.active:
        return logits.float()
    return tr.scores(logits[:, None], buf, rows, path[:, :d], d)[:, 0]


def tree_probs(tr: Transforms, logits: torch.Tensor, buf: Any, rows: np.ndarray, tokens: np.ndarray,
               parent: np.ndarray, depth: np.ndarray) -> torch.Tensor:
    """The sampling law ``[R, N+1, V]`` at every node of a scored tree (``logits`` ``[R, N+1, V]``,
    ``tokens``, ``parent``, ``depth`` int64 ``[R, N+1]``), each node with its own prefix: the row's
    committed tokens, then the path's tokens (one call of the settings per depth)."""
    if not tr.active:
        return tr.probs(logits, None, None, None)
    R, N1 = tokens.shape
    rr = np.arange(R)
    path = np.zeros((R, N1, max(int(depth.max()), 1)), np.int64)  # [R, N+1, D] tokens root -> node
    for i in range(1, N1):
        path[:, i] = path[rr, parent[:, i]]
        path[rr, i, depth[:, i] - 1] = tokens[:, i]
    out = torch.empty_like(logits, dtype=torch.float32)
    for d in np.unique(depth).tolist():
        r, i = np.nonzero(depth == d)
        ri, ii = torch.as_tensor(r, device=logits.device), torch.as_tensor(i, device=logits.device)
        out[ri, ii] = tr.probs(logits[ri, ii][:, None], buf, rows[r], path[r, i, :d], d)[:, 0]
    return out


def _levels(parent: np.ndarray) -> list[np.ndarray]:
    depth = tree_depths(parent)
    return [np.flatnonzero(depth == d) for d in range(int(depth.max()) + 1)]


def grow_tree(spec: StaticTree | DynamicTree,
              logits_at: Callable[[np.ndarray, int, np.ndarray, np.ndarray], torch.Tensor],
              tr: Transforms, buf: Any, rows: np.ndarray, max_depth: np.ndarray, row_ok: np.ndarray,
              rng: np.random.Generator, vocab: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """Draft one tree per row; returns ``(tokens [R, N+1], q [R, N+1, V] or None (greedy), valid
    [R, N+1], parent [R, N+1])``.

    ``logits_at(nodes, d, parent, tokens)``: the draft's logits ``[R, M, V]`` at the nodes ``nodes``
    int64 ``[R, M]`` (all of depth ``d``; -1 marks a slot a row does not use), called once per level
    from the root (``d = 0``, ``nodes`` = zeros ``[R, 1]``) down, with the tree so far (``parent``,
    ``tokens`` int64 ``[R, N+1]``); ``max_depth`` int64 ``[R]``: no node deeper (the
    round loop's ``need - 1``); ``row_ok`` bool ``[R]``: rows that can draft at all; ``vocab``: V.
    """
    R = len(rows)
    greedy = tr.greedy
    N1 = spec.n_nodes + 1
    D = min(spec.depth, int(max_depth.max(initial=0)))
    parent = np.full((R, N1), -1, np.int64)
    tokens = np.zeros((R, N1), np.int64)
    valid = np.zeros((R, N1), bool)
    valid[:, 0] = True
    path = np.zeros((R, N1, max(D, 1)), np.int64)  # tokens on the path root -> node
    score = np.ones((R, N1))  # each node's value (dynamic shapes): the one that chose it
    q = None if greedy else np.zeros((R, N1, vocab), np.float32)
    plan = spec.plan if isinstance(spec, StaticTree) else None
    frontier = np.zeros((R, 1), np.int64)
    nxt, rr = 1, np.arange(R)
    for d in range(D):
        fvalid = (frontier >= 0) & valid[rr[:, None], np.maximum(frontier, 0)]  # [R, M]
        fvalid &= (row_ok & (max_depth > d))[:, None]
        if not fvalid.any():
            break
        M = frontier.shape[1]
        f = np.maximum(frontier, 0)
        lg = logits_at(frontier, d, parent, tokens)  # [R, M, V]
        V = lg.shape[-1]
        x = node_scores(tr, lg.reshape(R * M, V), buf, np.repeat(rows, M), path[rr[:, None], f].reshape(R * M, -1),
                        d).reshape(R, M, V)
        pr = x.softmax(-1) if greedy else probabilities(x, tr.cfg)  # [R, M, V] float32
        pr_np = pr.cpu().numpy()
        if not np.isfinite(pr_np[fvalid].sum(axis=-1)).all():
            raise ValueError("the draft's logits are not finite (NaN or +inf) at some node of the tree: its "
                             "weights or activations overflowed or hold NaN")
        if q is not None:
            q[rr[:, None], f] = np.where(fvalid[:, :, None], pr_np, q[rr[:, None], f])
        # how many children each frontier node gets, and the slots they go to
        if plan is not None:  # static: the shape's own children, in increasing index
            if d >= len(plan):
                break
            slots, next_level = plan[d]
            C = slots.shape[1]
            slots = np.broadcast_to(slots, (R, M, C))
            L, base = len(next_level), None
        else:
            C = min(spec.max_children, V)
            top = -np.sort(-pr_np, axis=-1)[..., :C]  # [R, M, C] the largest q values
            value = np.where(fvalid[:, :, None], score[rr[:, None], f][:, :, None] * top, -1.0)
            flat = value.reshape(R, -1)
            pick = np.argsort(-flat, axis=1, kind="stable")[:, : spec.width]  # the level's best pairs
            chosen = np.zeros_like(flat, bool)
            chosen[rr[:, None], pick] = np.take_along_axis(flat, pick, 1) > 0
            counts = chosen.reshape(R, M, C).sum(axis=2)  # [R, M]
            offset = np.cumsum(counts, axis=1) - counts
            j = np.arange(C)[None, None, :]
            slots = np.where(j < counts[:, :, None], nxt + offset[:, :, None] + j, -1)
            L, base = spec.width, nxt
        slots = np.where(fvalid[:, :, None], slots, -1)
        if C == 0:
            break
        cand, ok = _children(x, pr_np, C, greedy, spec.replacement, rng)  # [R, M, C]
        on = (slots >= 0) & ok
        r, m, j = np.nonzero(on)
        s = slots[r, m, j]
        tokens[r, s] = cand[r, m, j]
        parent[r, s] = frontier[r, m]
        valid[r, s] = True
        if base is not None:  # dynamic: the value that chose the child (the j-th largest q), not its draw's
            score[r, s] = value[r, m, j]
        path[r, s] = path[r, f[r, m]]
        path[r, s, d] = cand[r, m, j]
        if base is None:  # static: the next level's nodes
            frontier = np.broadcast_to(next_level, (R, L))
        else:
            frontier = base + np.broadcast_to(np.arange(L), (R, L))
            nxt += L
    if isinstance(spec, DynamicTree):
        parent[:, 0] = -1
        idx = np.arange(N1)
        parent = np.where(valid | (idx == 0), parent, np.maximum(idx - 1, 0))  # unused slots: a chain, masked
        parent[:, 0] = -1
    else:
        parent = np.broadcast_to(spec.parent, (R, N1)).copy()
    return tokens, q, valid, parent


def _children(x: torch.Tensor, pr: np.ndarray, C: int, greedy: bool, replacement: bool,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``C`` children per node ``[R, M, C]`` and whether each is a real draw (q > 0): the top-C of the
    processed logits ``x`` (greedy), Gumbel-top-C of ``log q`` (without replacement: the sequential
    law), or C i.i.d. draws, from the draft's law ``pr`` ``[R, M, V]`` (already on the host)."""
    if greedy:
        keys = x.double().cpu().numpy()
        cand = np.argsort(-keys, axis=-1, kind="stable")[..., :C]
        return cand, np.take_along_axis(np.isfinite(keys), cand, -1)
    p = pr.astype(np.float64)  # [R, M, V]
    if replacement:
        cum = np.cumsum(p, axis=-1)
        u = rng.random((*p.shape[:-1], C)) * cum[..., -1:]
        cand = np.minimum((cum[..., None, :] <= u[..., :, None]).sum(-1), p.shape[-1] - 1)  # inverse CDF
        return cand, np.take_along_axis(p, cand, -1) > 0
    g = -np.log(-np.log(rng.random(p.shape)))
    with np.errstate(divide="ignore"):
        keys = np.log(p) + g
    cand = np.argsort(-keys, axis=-1, kind="stable")[..., :C]
    return cand, np.take_along_axis(p, cand, -1) > 0
