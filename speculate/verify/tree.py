"""Token-tree verification: a tree of drafted candidates per row, walked from the root (proofs/11).

Layout (R rows, N drafted nodes, static tree shape, node 0 = the root = the committed context):

- ``parent`` int64 ``[N+1]`` (one shape for every row) or ``[R, N+1]`` (a shape per row, padded):
  ``parent[0] = -1`` and ``0 <= parent[i] < i`` for the drafted nodes ``i = 1..N`` (so a parent
  comes before its children and there can be no cycle); the children of a node are taken in
  increasing index;
- ``valid`` bool ``[R, N+1]`` or None (every node): the nodes of row r's tree; padding nodes are
  False, the root is always True, and a valid node's parent is valid;
- ``tokens`` int64 ``[R, N+1]``: the outcome drafted at each node (``tokens[:, 0]`` is ignored);
- ``p`` ``[R, N+1, V]``: the target's distribution at each node's context (the committed context
  followed by the tokens on the path root -> node);
- ``q`` ``[R, N+1, V]``: the draft distribution each node's children were drafted from, exactly
  the one they were sampled from (rows of leaves are not read);
- ``u_accept`` float64 ``[R, N+1]`` (node i's test reads ``u_accept[r, i]``; column 0 unused),
  ``u_next`` float64 ``[R]``.

Children are drafted either i.i.d. from q at their parent (``replacement=True``, SpecInfer), or
one after the other WITHOUT replacement (``replacement=False``: each child drawn from q with the
earlier siblings' outcomes removed, renormalised by what is left of q's own total; siblings are
then distinct).

The rule (a walk from the root keeping an exactly distributed path): the LIVE nodes start as
{root}; their valid children, in increasing index, are the candidates, tried one after the other
against the current residual r (r = p at the first live node): candidate c with outcome x is
kept when ``u_accept[r, c] * q_c(x) < r(x)`` (probability min(1, r(x) / q_c(x))), where q_c is q
at c's parent (i.i.d.) or q at c's parent with the siblings rejected so far removed and
renormalised (without replacement); on rejection r <- norm(max(r - q_c, 0)). A kept candidate
extends the path, and the live nodes become the candidates that carry its outcome (several only
when i.i.d. siblings repeat an outcome: their subtrees are merged, which is what makes
multi-draft verification the special case of a tree with branching only at the root). When every
candidate is rejected the next outcome is drawn from the last residual; when the live nodes have
no children, the bonus is drawn from p at the first live node.

Returns ``n_accepted`` int64 ``[R]`` (the accepted depth), ``next_outcome`` int64 ``[R]`` and
``path`` int64 ``[R, D]`` (D = the depth of the tree): the accepted nodes, root's child first,
-1 past ``n_accepted`` (a root-to-node path of the tree whose tokens are the accepted outcomes).
``verify_tree_greedy`` is the greedy (argmax) rule on the same layout: keep the first candidate
whose outcome is the argmax of p at the live node; the next outcome is that argmax.

Keywords of ``verify_tree``: ``replacement`` (above), ``validate`` (default True: the rows the
kernel may read, p at every valid node and q at every node with a valid child, must be
distributions, as ``Categorical(validate=True)`` checks; the round loop passes False, its
Categoricals being validated where they are built), ``parallel`` (threads over rows; None: above a
work threshold) and ``check_uniforms``. The parent array, the mask, the tokens (in 0..V-1, with
q > 0 at their parent) and every shape are checked before any work; a bad entry met by the kernel
(NaN, inf, a negative value, siblings that repeat an outcome without replacement) raises
``ValueError`` naming the row and node.

>>> import numpy as np
>>> from speculate.verify import Tree, verify_tree
>>> tree = Tree.from_branching([2])          # the root and two children: parent [-1, 0, 0]
>>> p = np.array([[[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]])   # [R=1, N+1=3, V=2]
>>> q = np.array([[[0.75, 0.25], [0.5, 0.5], [0.5, 0.5]]])
>>> tokens = np.array([[0, 0, 1]])           # node 1 drafted 0, node 2 drafted 1
>>> verify_tree(p, q, tokens, tree.parent, None, np.array([[0.0, 0.9, 0.1]]), np.array([0.3]))
(array([1]), array([0]), array([[2]]))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numba as nb
import numpy as np

from .._inverse_cdf import (
    NEGATIVE,
    NOT_FINITE,
    OK,
    draw_row,
    draw_row_np,
    n_blocks,
    sums_np,
    weight,
    weight_sums,
    weights_np,
)
from ._shared import BAD_INDEX, Q_ZERO
from .greedy import _argmax, _argmax_np

DUPLICATE = 8  #: status: siblings drafted without replacement repeat an outcome
IID, WITHOUT, GREEDY = 0, 1, 2  # the kernel's modes


class Tree(NamedTuple):
    """A static tree shape: ``parent`` int64 ``[N+1]`` (or ``[R, N+1]``, one shape per row) with
    ``parent[0] = -1`` and ``0 <= parent[i] < i``; ``replacement``: children drafted i.i.d. (True)
    or without replacement (False). What ``Proposal.tree`` carries (a bare parent array means
    i.i.d. children).

    >>> Tree.from_branching([2, 1]).parent.tolist()   # 2 children of the root, 1 under each
    [-1, 0, 0, 1, 2]
    >>> Tree.chains(2, 2).parent.tolist()             # 2 draft branches of 2: multi-draft
    [-1, 0, 1, 0, 3]
    >>> Tree.from_branching([2, 1]).depth.tolist()
    [0, 1, 1, 2, 2]
    """

    parent: np.ndarray
    replacement: bool = True

    @property
    def depth(self) -> np.ndarray:
        """Depth of every node (root 0), same shape as ``parent``."""
        return tree_depths(self.parent)

    @property
    def n_nodes(self) -> int:
        """N: the number of drafted nodes (the root excluded)."""
        return int(np.shape(self.parent)[-1]) - 1

    @staticmethod
    def from_branching(branching: Any, replacement: bool = True) -> Tree:
        """The complete tree in which every node at depth d has ``branching[d]`` children (breadth first)."""
        parent, level = [-1], [0]
        for b in branching:
            if int(b) < 0:
                raise ValueError(f"branching factors must be >= 0, got {list(branching)}")
            nxt = []
            for v in level:
                for _ in range(int(b)):
                    nxt.append(len(parent))
                    parent.append(v)
            level = nxt
        return Tree(np.array(parent, np.int64), replacement)

    @staticmethod
    def chains(m: int, k: int) -> Tree:
        """m draft branches of k drafts from the root (multi-draft), branch-major: node
        ``1 + j * k + d`` is branch j's (d+1)-th draft."""
        parent = [-1]
        for _ in range(m):
            for d in range(k):
                parent.append(0 if d == 0 else len(parent) - 1)
        return Tree(np.array(parent, np.int64), True)


def tree_depths(parent: Any) -> np.ndarray:
    """Depth of every node of a (checked) parent array ``[..., N+1]``; root 0."""
    parent = np.asarray(parent, np.int64)
    if parent.ndim == 1:  # one shape: a loop over Python ints
        d = [0] * len(parent)
        for i, a in enumerate(parent.tolist()[1:], start=1):
            d[i] = d[max(a, 0)] + 1
        return np.array(d, np.int64)
    flat = parent.reshape(-1, parent.shape[-1])
    depth = np.zeros(flat.shape, np.int64)
    rows = np.arange(len(flat))
    for i in range(1, flat.shape[-1]):
        depth[:, i] = depth[rows, np.maximum(flat[:, i], 0)] + 1
    return depth.reshape(parent.shape)


# ----------------------------------------------------------------------------- Numba kernel


@nb.njit(nogil=True, cache=True)
def _check_candidate(p_row_w, q, tokens, b, c, a, V):
    """(x, q_c(x), status) for candidate c with parent a, reading the current weight row."""
    x = tokens[b, c]
    if x < 0 or x >= V:
        return x, 0.0, BAD_INDEX
    qx = np.float64(q[b, a, x])
    wx = p_row_w[x]
    if not (np.isfinite(qx) and np.isfinite(wx)):
        return x, 0.0, NOT_FINITE
    if qx < 0.0 or wx < 0.0:
        return x, 0.0, NEGATIVE
    if qx == 0.0:
        return x, 0.0, Q_ZERO
    return x, qx, OK


@nb.njit(nogil=True, cache=True)
def _row(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, b, n_out, next_out, path, status, where):
    N1, V = p.shape[1], p.shape[2]
    live = np.zeros(N1, np.bool_)
    nxt = np.zeros(N1, np.bool_)
    live[0] = True
    removed = np.empty(N1, np.int64)
    w = np.empty(V, np.float64)
    bs = np.empty(n_blocks(V), np.float64)
    n = 0
    while True:
        j0 = 0
        while not live[j0]:
            j0 += 1
        kept = -1
        any_candidate = False
        if mode == GREEDY:
            best, st = _argmax(p[b, j0])
            if st != OK:
                status[b], where[b] = st, j0
                return
            for c in range(1, N1):
                if not valid[b, c] or not live[parent[b, c]]:
                    continue
                x = tokens[b, c]
                if x < 0 or x >= V:
                    status[b], where[b] = BAD_INDEX, c
                    return
                if x == best:
                    kept = c
                    break
        else:
            for v in range(V):
                w[v] = np.float64(p[b, j0, v])
            Z = 1.0  # the residual is w / Z
            M = 1.0  # without replacement: q's mass left after removing the rejected siblings
            nrem = 0
            for c in range(1, N1):
                if not valid[b, c] or not live[parent[b, c]]:
                    continue
                any_candidate = True
                a = parent[b, c]
                x, qx, st = _check_candidate(w, q, tokens, b, c, a, V)
                if st != OK:
                    status[b], where[b] = st, c
                    return
                if mode == WITHOUT:
                    for t in range(nrem):
                        if removed[t] == x:
                            status[b], where[b] = DUPLICATE, c
                            return
                    if nrem == 0:  # q's own total (1 up to rounding): what is left is measured from it
                        M = weight_sums(q[b, a], q[b, a], 1.0, 0.0, 0, bs)
                        if not np.isfinite(M):
                            status[b], where[b] = NOT_FINITE, c
                            return
                    if not M > 0.0:
                        status[b], where[b] = Q_ZERO, c
                        return
                    if u_accept[b, c] * qx * Z < w[x] * M:
                        kept = c
                        break
                    s = Z / M
                    qrow = q[b, a]
                    for v in range(V):
                        w[v] = weight(w, qrow, 1.0, s, 1, v) if v != x else 0.0
                    total = weight_sums(w, w, 1.0, 0.0, 0, bs)
                    if not np.isfinite(total):
                        status[b], where[b] = NOT_FINITE, c
                        return
                    if total > tiny:
                        Z = total
                    else:  # the residual is empty up to rounding (p == q): fall back to the target row
                        for v in range(V):
                            w[v] = np.float64(p[b, j0, v])
                        Z = 1.0
                    M -= qx
                    removed[nrem] = x
                    nrem += 1
                else:
                    if u_accept[b, c] * qx * Z < w[x]:
                        kept = c
                        break
                    qrow = q[b, a]
                    total = weight_sums(w, qrow, 1.0, Z, 1, bs)
                    if not np.isfinite(total):
                        status[b], where[b] = NOT_FINITE, c
                        return
                    if total > tiny:
                        for v in range(V):
                            w[v] = weight(w, qrow, 1.0, Z, 1, v)
                        Z = total
        if kept >= 0:
            x = tokens[b, kept]
            for c in range(N1):
                nxt[c] = c > 0 and valid[b, c] and live[parent[b, c]] and tokens[b, c] == x
            for c in range(N1):
                live[c] = nxt[c]
            n += 1
            continue
        if mode == GREEDY:
            idx, st = best, OK
        elif any_candidate:
            idx, st = draw_row(w, u_next[b], bs)
        else:
            idx, st = draw_row(p[b, j0], u_next[b], bs)
        if st == OK and not p[b, j0, idx] > 0.0:  # residual mass from a negative q, not from p
            idx, st = -1, NEGATIVE
        v = j0
        for d in range(n - 1, -1, -1):
            path[b, d] = v
            v = parent[b, v]
        n_out[b], next_out[b], status[b], where[b] = n, idx, st, j0
        return


@nb.njit(nogil=True, cache=True, parallel=True)
def _batch_parallel(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, n_out, next_out, path, status, where):
    for b in nb.prange(p.shape[0]):
        _row(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, b, n_out, next_out, path, status, where)


@nb.njit(nogil=True, cache=True)
def _batch_serial(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, n_out, next_out, path, status, where):
    for b in range(p.shape[0]):
        _row(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, b, n_out, next_out, path, status, where)


def _outputs(R: int, D: int) -> tuple[np.ndarray, ...]:
    return (np.zeros(R, np.int64), np.full(R, -1, np.int64), np.full((R, D), -1, np.int64),
            np.zeros(R, np.int64), np.zeros(R, np.int64))


def kernel(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, depth, parallel):
    """The Numba kernel on checked arrays (parent and valid ``[R, N+1]``): returns
    (n_accepted, next_outcome, path [R, depth], status, where)."""
    n_out, next_out, path, status, where = _outputs(p.shape[0], depth)
    fn = _batch_parallel if parallel else _batch_serial
    fn(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, n_out, next_out, path, status, where)
    return n_out, next_out, path, status, where


# ----------------------------------------------------------------------------- NumPy twin


def reference(p, q, tokens, parent, valid, u_accept, u_next, tiny, mode, depth):
    """Plain NumPy twin of the kernel (same arguments but ``parallel``; same bits on the same uniforms)."""
    R, N1, V = p.shape
    n_out, next_out, path, status, where = _outputs(R, depth)
    for b in range(R):
        live = np.zeros(N1, bool)
        live[0] = True
        n, bad, bad_at = 0, OK, 0
        while True:
            j0 = int(np.flatnonzero(live)[0])
            cands = [c for c in range(1, N1) if valid[b, c] and live[parent[b, c]]]
            kept, best = -1, -1
            if mode == GREEDY:
                best, bad = _argmax_np(p[b, j0])
                bad_at = j0
                if bad == OK:
                    for c in cands:
                        x = int(tokens[b, c])
                        if not 0 <= x < V:
                            bad, bad_at = BAD_INDEX, c
                            break
                        if x == best:
                            kept = c
                            break
            else:
                w, Z, M, removed = np.asarray(p[b, j0], np.float64).copy(), 1.0, 1.0, []
                for c in cands:
                    a, x = int(parent[b, c]), int(tokens[b, c])
                    bad_at = c
                    if not 0 <= x < V:
                        bad = BAD_INDEX
                        break
                    qx = float(q[b, a, x])
                    if not (np.isfinite(qx) and np.isfinite(w[x])):
                        bad = NOT_FINITE
                        break
                    if qx < 0.0 or w[x] < 0.0:
                        bad = NEGATIVE
                        break
                    if qx == 0.0:
                        bad = Q_ZERO
                        break
                    if mode == WITHOUT:
                        if x in removed:
                            bad = DUPLICATE
                            break
                        if not removed:
                            _, M = sums_np(weights_np(q[b, a], q[b, a], 1.0, 0.0, 0))
                            if not np.isfinite(M):
                                bad = NOT_FINITE
                                break
                        if not M > 0.0:
                            bad = Q_ZERO
                            break
                        if u_accept[b, c] * qx * Z < w[x] * M:
                            kept = c
                            break
                        w2 = weights_np(w, q[b, a], 1.0, Z / M, 1)
                        w2[x] = 0.0
                        _, total = sums_np(w2)
                        if not np.isfinite(total):
                            bad = NOT_FINITE
                            break
                        if total > tiny:
                            w, Z = w2, total
                        else:
                            w, Z = np.asarray(p[b, j0], np.float64).copy(), 1.0
                        M -= qx
                        removed.append(x)
                    else:
                        if u_accept[b, c] * qx * Z < w[x]:
                            kept = c
                            break
                        w2 = weights_np(w, q[b, a], 1.0, Z, 1)
                        _, total = sums_np(w2)
                        if not np.isfinite(total):
                            bad = NOT_FINITE
                            break
                        if total > tiny:
                            w, Z = w2, total
            if bad != OK:
                status[b], where[b] = bad, bad_at
                break
            if kept >= 0:
                x = tokens[b, kept]
                new = np.zeros(N1, bool)
                for c in cands:
                    new[c] = tokens[b, c] == x
                live = new
                n += 1
                continue
            if mode == GREEDY:
                idx, st = best, OK
            else:
                idx, st = draw_row_np(w if cands else p[b, j0], u_next[b])
            if st == OK and not p[b, j0, idx] > 0.0:
                idx, st = -1, NEGATIVE
            v = j0
            for d in range(n - 1, -1, -1):
                path[b, d] = v
                v = parent[b, v]
            n_out[b], next_out[b], status[b], where[b] = n, idx, st, j0
            break
    return n_out, next_out, path, status, where
