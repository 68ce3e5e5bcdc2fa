"""Suffix drafting (``"suffix"``, ``"suffix:N"``): training-free token trees from the continuations of
a row's longest earlier match, in its own tokens and in a store of earlier requests' outputs,
with a real draft law at every node, so that the tree rule keeps temperature > 0 exact.

SuffixDecoding (Oliaro et al., arXiv 2411.04975; in vLLM and Arctic Inference) keeps a suffix tree
over each request's prompt and one over earlier outputs, matches the sequence's latest tokens and
proposes the most frequent continuations as a tree. Those implementations verify by greedy
match, whose acceptance collapses at temperature > 0. Here every node of the tree carries ``q``,
the empirical law of the next token after the node's context, its children are sampled from it
without replacement (the layout of ``speculate.verify.tree``, proofs/11), and the verifier's
residual rule keeps the output law the target's whatever the counts are.

**What is matched.** Per row, the context is the row's committed tokens. Its longest suffix that
occurred earlier with a continuation (at most ``max_match`` tokens) is looked up in the row's own
tokens (a scan, latest first) and in the shared :class:`SuffixStore`; the occurrences of that
longest match (both sources together, at most ``max_occurrences``, latest first) are the root's.
A tree node's occurrences are those of its parent whose continuation carries the node's token;
its law ``q`` is the histogram of the next token over them (occurrences with nothing after them
are left out), a true distribution over the vocabulary, zero elsewhere. A continuation in the
row's own tokens runs into the drafted path itself (as an LZ77 copy overlaps its source), so a
periodic row gets trees as deep as the budget.

**The shape.** Best first, as SuffixDecoding grows its speculation tree: node ``v``'s next child
slot has the value ``value(v) * q_v[j]`` (the j-th largest value of ``q_v`` for its j-th child;
the root's value is 1), and the best slot of the whole tree is drafted next, while it is worth at
least ``min_prob``, the tree has fewer than ``ceil(spec_factor * match length)`` nodes (longer
matches speculate more) and at most ``N`` nodes (``"suffix:N"``, default 16), no deeper than the
round's lookahead. The child's token is then drawn from ``q_v`` without the tokens of its earlier
siblings (one uniform each: the sequential law ``verify_tree(replacement=False)`` expects), and it
keeps the value that chose it (as :class:`~speculate.domains.text.drafts.trees.DynamicTree` does,
for the same reason). Whether a node exists is decided from the counts and earlier nodes' tokens
only, never from its own draw: the condition of proofs/11. At temperature 0 the j-th child is the
j-th most frequent continuation and ``q`` is not needed (the greedy tree rule). Node indices are
creation order, so each row's nodes are ``1 .. n_r``; the tree is cut to the widest row's.

**The store** (:class:`SuffixStore`, shared by every request of the draft, and so of the
generator, and by the copies continuous batching makes with :meth:`SuffixDraft.fresh`): a ring of
``capacity`` tokens (default 2**18) holding each finished row's output after the last
``max_match`` tokens of its prompt (``store_prompts=True``: the whole row), sequences separated by
a mark; writing past the capacity overwrites the oldest tokens (first in, first out; memory is
fixed). Occurrences are found through hash chains of the 8-grams and 2-grams that end at each
position (LZ77's index: a head per hash, a link per position; ``max_chain`` links walked per
lookup, the longer anchor first), so a lookup costs O(max_chain * max_match) whatever the store
holds. Rows go in when they leave the batch (``select``) or the request ends (``release``).

**Why Numba.** Matching, the per-node histograms and the best-first growth are short loops with
data-dependent exits over ragged rows: one compiled pass per round over all rows
(``nogil``), no Python per token or per node; numpy vectorisation would need padded
[rows, occurrences, depth] tensors for what is mostly a few dozen integer compares per row.

``tree=None`` or ``"dynamic"``: the tree above. ``SuffixDraft(chain=True)``: one child per node,
proposed as a chain (:class:`~speculate.domains.text.drafts.base.Drafted`, ``q`` at each depth),
which the block rule, the lean runtimes and on-device verification take.

>>> import numpy as np
>>> from speculate.domains.text.request.sampling import SamplingConfig
>>> from speculate.domains.text.request.tokens import TokenBuffer
>>> buf = TokenBuffer.from_prompts([[5, 6, 7, 5, 6, 8, 5, 6]], extra=8)
>>> d = SuffixDraft(max_nodes=4, min_prob=0.0, spec_factor=4.0)
>>> d.reset(buf, 16)
>>> t = d.propose(np.array([0]), buf, 4, np.array([8]), SamplingConfig(temperature=0), None, 10)
>>> t.tokens[0].tolist(), t.tree.parent[0].tolist()   # "5 6" was followed by 7 and by 8
([0, 8, 7, 5, 5], [-1, 0, 0, 1, 2])
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from speculate.verify import Tree

from ..models.facts import reads_encoder
from ..request.processors import as_transforms
from ..request.tokens import TokenBuffer
from .base import Draft, Drafted, DraftedTree, DraftOptions

__all__ = ["SuffixDraft", "SuffixShape", "SuffixStore"]

_SPEC = re.compile(r"^suffix(?::(\d+))?$")
_ANCHORS = (8, 2)  # the store's hash chains: n-grams ending at each position, the longer tried first


@dataclass(frozen=True)
class SuffixShape:
    """The suffix draft's tree budget (what the generator reads as ``draft.spec``): at most
    ``n_nodes`` drafted nodes, at most ``depth`` deep; children drawn without replacement."""

    n_nodes: int
    depth: int
    replacement: bool = False


# ----------------------------------------------------------------------------- the store


@nb.njit(cache=True, nogil=True)
def _hash(seq, end, A, mask):  # pragma: no cover - compiled
    """Hash of ``seq[end - A : end]`` into ``[0, mask]``."""
    h = np.uint64(0x243F6A8885A308D3)
    for j in range(end - A, end):
        h = (h ^ np.uint64(seq[j] + 1)) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@nb.njit(cache=True, nogil=True)
def _insert(toks, heads, prev, anchors, state, seq):  # pragma: no cover - compiled
    """Append a separator, then ``seq``, to the ring ``toks``; link each position into the chain of
    every anchor n-gram that ends there (inside ``seq``). ``state[0]``: tokens written so far."""
    C = toks.shape[0]
    mask = heads.shape[1] - 1
    p = state[0]
    s = p % C
    toks[s] = -1
    for a in range(anchors.shape[0]):
        prev[a, s] = -1
    p += 1
    for i in range(seq.shape[0]):
        s = p % C
        toks[s] = seq[i]
        for a in range(anchors.shape[0]):
            A = anchors[a]
            if i + 1 >= A:
                h = _hash(seq, i + 1, A, mask)
                prev[a, s] = heads[a, h]
                heads[a, h] = p
            else:
                prev[a, s] = -1
        p += 1
    state[0] = p


class SuffixStore:
    """Earlier requests' tokens, bounded: a ring of ``capacity`` tokens with hash-chain indexes.

    >>> store = SuffixStore(capacity=8)
    >>> store.insert([1, 2, 3]); store.insert([4, 5, 6, 7])
    >>> len(store), store.tokens().tolist()          # separators (-1) count
    (8, [1, 2, 3, -1, 4, 5, 6, 7])
    >>> store.insert([9, 9]); store.tokens().tolist()  # the oldest tokens are overwritten
    [-1, 4, 5, 6, 7, -1, 9, 9]
    """

    def __init__(self, capacity: int = 1 << 18) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 2:
            raise ValueError(f"a suffix store's capacity must be an int >= 2 (tokens), got {capacity!r}")
        self.capacity = int(capacity)
        self.anchors = np.array(_ANCHORS, np.int64)
        self.state = np.zeros(1, np.int64)  # tokens written so far (separators included)
        self._alloc()

    def _alloc(self) -> None:
        C = self.capacity
        H = 1 << max(1, (C - 1).bit_length())  # hash heads per anchor: a power of two >= C
        self.toks = np.full(C, -1, np.int64)
        self.heads = np.full((len(self.anchors), H), -1, np.int64)
        self.prev = np.full((len(self.anchors), C), -1, np.int64)

    def __len__(self) -> int:
        """Tokens held (separators included), at most ``capacity``."""
        return int(min(self.state[0], self.capacity))

    @property
    def written(self) -> int:
        """Tokens written since the store was made (separators included)."""
        return int(self.state[0])

    def insert(self, seq: Any) -> None:
        """Append one sequence (token ids >= 0), evicting the oldest tokens past the capacity."""
        seq = np.ascontiguousarray(seq, dtype=np.int64)
        if seq.ndim != 1:
            raise ValueError(f"SuffixStore.insert takes one sequence of token ids, got shape {seq.shape}")
        if len(seq) and int(seq.min()) < 0:
            raise ValueError("token ids must be >= 0")
        _insert(self.toks, self.heads, self.prev, self.anchors, self.state, seq)

    def tokens(self) -> np.ndarray:
        """The tokens held, oldest first (-1 separates sequences)."""
        p, C = int(self.state[0]), self.capacity
        idx = np.arange(max(0, p - C), p) % C
        return self.toks[idx].copy()

    def clear(self) -> None:
        """Forget everything."""
        self.state[0] = 0
        self._alloc()


# ----------------------------------------------------------------------------- one round


@nb.njit(cache=True, nogil=True)
def _cont(kind, pos, d, ctx, n, path, v, toks, total, V):  # pragma: no cover - compiled
    """The token ``d`` steps after occurrence (kind, pos) (-1: none): in the row's own tokens
    (kind 0; past the row's end, the node's own path) or in the store's ring (kind 1)."""
    if kind == 0:
        j = pos + 1 + d
        return ctx[j] if j < n else path[v, j - n]
    j = pos + 1 + d
    if j >= total:
        return -1
    x = toks[j % toks.shape[0]]
    return x if x < V else -1  # a store shared with another vocabulary: never draft an id outside it


@nb.njit(cache=True, nogil=True)
def _grow(ids, n_tok, rows, cap, budget_max, max_match, min_match, max_occ, max_chain, max_children,
          spec_factor, min_prob, greedy, V, toks, heads, prev, anchors, total, uniforms,
          out_tok, out_parent, out_valid, q_tok, q_p, used):  # pragma: no cover - compiled
    R = rows.shape[0]
    N1 = out_tok.shape[1]
    C = toks.shape[0]
    lo = max(total - C, 0)
    mask = heads.shape[1] - 1
    ell = np.zeros(ids.shape[1], np.int64)
    cand_pos = np.zeros(max_chain, np.int64)
    cand_ell = np.zeros(max_chain, np.int64)
    occ_kind = np.zeros(max_occ, np.int64)
    occ_pos = np.zeros(max_occ, np.int64)
    flat = np.zeros(N1 * max_occ, np.int64)  # each node's occurrences (indices into occ_*)
    o_start = np.zeros(N1, np.int64)
    o_len = np.zeros(N1, np.int64)
    s_tok = np.zeros(N1 * max_occ, np.int64)  # each node's support, most frequent first
    s_cnt = np.zeros(N1 * max_occ, np.int64)
    s_used = np.zeros(N1 * max_occ, np.bool_)
    s_len = np.zeros(N1, np.int64)
    s_tot = np.zeros(N1, np.int64)
    depth = np.zeros(N1, np.int64)
    value = np.zeros(N1, np.float64)
    kids = np.zeros(N1, np.int64)
    path = np.zeros((N1, max(N1 - 1, 1)), np.int64)
    xs = np.zeros(max_occ, np.int64)
    keys = np.zeros(max_occ, np.int64)
    tok_at = np.zeros(max_occ, np.int64)
    B = max_occ + 1
    for i in range(R):
        r = rows[i]
        ctx = ids[r]
        n = n_tok[r]
        out_valid[i, 0] = True
        if cap[i] <= 0 or n < 1:
            continue
        # the longest earlier match: in the row's own tokens (latest first) ...
        best = 0
        for e in range(n - 2, -1, -1):
            m = 0
            while m < max_match and e - m >= 0 and ctx[e - m] == ctx[n - 1 - m]:
                m += 1
            ell[e] = m
            if m > best:
                best = m
        # ... and in the store, through the chain of the longest anchor that finds one
        nc = 0
        for a in range(anchors.shape[0]):
            A = anchors[a]
            if n < A or total == 0:
                continue
            p = heads[a, _hash(ctx, n, A, mask)]
            steps = 0
            while p >= lo and steps < max_chain:
                steps += 1
                if p + 1 < total and toks[(p + 1) % C] >= 0:
                    m = 0
                    while m < max_match and m < n and p - m >= lo and toks[(p - m) % C] == ctx[n - 1 - m]:
                        m += 1
                    if m >= A:
                        cand_pos[nc] = p
                        cand_ell[nc] = m
                        nc += 1
                        if m > best:
                            best = m
                p = prev[a, p % C]
            if nc > 0:
                break
        if best < min_match or best == 0:
            continue
        no = 0
        for e in range(n - 2, -1, -1):
            if no < max_occ and ell[e] >= best:
                occ_kind[no] = 0
                occ_pos[no] = e
                no += 1
        for c in range(nc):
            if no < max_occ and cand_ell[c] >= best:
                occ_kind[no] = 1
                occ_pos[no] = cand_pos[c]
                no += 1
        budget = min(budget_max, math.ceil(spec_factor * best), N1 - 1)
        # the root
        for o in range(no):
            flat[o] = o
        o_start[0], o_len[0], depth[0], value[0], kids[0] = 0, no, 0, 1.0, 0
        made = 1
        fill = no
        v = 0
        while True:
            # the support of node v (the node just made): the next token of each of its occurrences
            k = 0
            for t in range(o_len[v]):
                o = flat[o_start[v] + t]
                x = _cont(occ_kind[o], occ_pos[o], depth[v], ctx, n, path, v, toks, total, V)
                if x >= 0:
                    xs[k] = x
                    k += 1
            idx = np.argsort(xs[:k], kind="mergesort")  # stable: each token's occurrences, latest first
            base = v * max_occ
            u = 0
            t = 0
            while t < k:  # distinct tokens with their counts, and their latest occurrence
                t2 = t
                while t2 < k and xs[idx[t2]] == xs[idx[t]]:
                    t2 += 1
                first = idx[t]
                tok_at[first] = xs[first]
                keys[u] = -(t2 - t) * B + first  # by count, most first; ties: the latest occurrence first
                u += 1
                t = t2
            order = np.sort(keys[:u])
            tot = 0
            for j in range(u):
                cnt = -(order[j] // B)  # floor division: key = -cnt * B + first, 0 <= first < B
                s_tok[base + j] = tok_at[order[j] % B]
                s_cnt[base + j] = cnt
                s_used[base + j] = False
                tot += cnt
            s_len[v], s_tot[v] = u, tot
            if made - 1 >= budget:
                break
            # the best open slot of the tree
            pick, pv = -1, -1.0
            for w in range(made):
                j = kids[w]
                if j < s_len[w] and j < max_children and depth[w] < cap[i]:
                    val = value[w] * s_cnt[w * max_occ + j] / s_tot[w]
                    if val > pv:
                        pick, pv = w, val
            if pick < 0 or pv < min_prob:
                break
            w = pick
            wb = w * max_occ
            if greedy:
                sel = kids[w]
            else:  # drawn from q_w without its earlier children's tokens (sequential, without replacement)
                left = s_tot[w]
                for j in range(s_len[w]):
                    if s_used[wb + j]:
                        left -= s_cnt[wb + j]
                target = uniforms[i, made - 1] * left
                acc = 0.0
                sel = -1
                for j in range(s_len[w]):
                    if not s_used[wb + j]:
                        acc += s_cnt[wb + j]
                        sel = j
                        if acc > target:
                            break
            s_used[wb + sel] = True
            x = s_tok[wb + sel]
            if kids[w] == 0:  # w's law: the verifier reads it at every node with a child
                for j in range(s_len[w]):
                    q_tok[i, w, j] = s_tok[wb + j]
                    q_p[i, w, j] = s_cnt[wb + j] / s_tot[w]
            c = made
            out_tok[i, c] = x
            out_parent[i, c] = w
            out_valid[i, c] = True
            depth[c] = depth[w] + 1
            value[c] = pv  # the value that chose it, not its draw's
            kids[c] = 0
            for d in range(depth[w]):
                path[c, d] = path[w, d]
            path[c, depth[w]] = x
            o_start[c] = fill
            m = 0
            for t in range(o_len[w]):
                o = flat[o_start[w] + t]
                if _cont(occ_kind[o], occ_pos[o], depth[w], ctx, n, path, w, toks, total, V) == x:
                    flat[fill + m] = o
                    m += 1
            o_len[c] = m
            fill += m
            kids[w] += 1
            made += 1
            v = c
        used[i] = made - 1


class SuffixDraft(Draft):
    """Token trees (or chains) from the continuations of each row's longest earlier match, in its own
    tokens and in a shared, bounded store of earlier outputs (see the module docstring).

    ``max_nodes``: drafted nodes per tree (``"suffix:N"``); ``max_match``: the longest suffix matched;
    ``min_prob``: a node is drafted only while its value (the product of the ``q`` values of the
    ranks that chose it and its ancestors) is at least this (SuffixDecoding's ``min_token_prob``);
    ``spec_factor``: at most ``ceil(spec_factor * match length)`` nodes (its ``max_spec_factor``);
    ``max_occurrences``: the latest occurrences of the match counted; ``store``: a
    :class:`SuffixStore` to share (default: a new one of ``2**18`` tokens) or its capacity;
    ``store_prompts``: store whole rows, not only the outputs (after their prompts' last
    ``max_match`` tokens); ``chain``: one child per node, proposed as a chain.
    """

    def __init__(self, max_nodes: int = 16, *, max_match: int = 24, min_prob: float = 0.1,
                 spec_factor: float = 1.0, max_occurrences: int = 128, max_chain: int = 256,
                 store: SuffixStore | int | None = None, store_prompts: bool = False, chain: bool = False) -> None:
        for name, v, low in (("max_nodes", max_nodes, 1), ("max_match", max_match, 1),
                             ("max_occurrences", max_occurrences, 1), ("max_chain", max_chain, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        if not (0.0 <= float(min_prob) <= 1.0):
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob!r}")
        if not (float(spec_factor) > 0.0):
            raise ValueError(f"spec_factor must be > 0, got {spec_factor!r}")
        self.max_nodes, self.max_match = int(max_nodes), int(max_match)
        self.min_prob, self.spec_factor = float(min_prob), float(spec_factor)
        self.max_occurrences, self.max_chain = int(max_occurrences), int(max_chain)
        self.store = store if isinstance(store, SuffixStore) else SuffixStore(1 << 18 if store is None else store)
        self.store_prompts, self.chain = bool(store_prompts), bool(chain)
        self.spec = None if chain else SuffixShape(self.max_nodes, self.max_nodes)
        self.static_target = self.chain  # a chain is scored as a block: the lean runtimes take it
        self._bufs: list[TokenBuffer] = []  # per row: the buffer it was last seen in, and its index there
        self._idx = np.zeros(0, np.int64)

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> SuffixDraft | None:
        if not isinstance(draft, str):
            return None
        m = _SPEC.match(draft)
        if m is None:
            return None
        n = int(m.group(1) or 16)
        if n < 1:
            raise ValueError(f"{draft!r}: N in 'suffix:N' (the most drafted nodes per tree) must be >= 1")
        if reads_encoder(target):
            raise ValueError(f"{type(target).__name__} is an encoder-decoder: the suffix draft's token trees are "
                             "for decoder-only targets; pass 'ngram' (prompt lookup over the source too)")
        if options.tree is not None and not (isinstance(options.tree, str) and options.tree == "dynamic"):
            raise ValueError(f"the suffix draft grows its own tree from continuation counts (at most N nodes: "
                             f"'suffix:N'); pass tree=None or 'dynamic', got tree={options.tree!r}")
        return cls(max_nodes=n)

    def default_lookahead(self) -> int:
        return self.max_nodes if self.spec is not None else min(self.max_nodes, 8)

    def as_chain(self) -> SuffixDraft:
        """The same draft (settings and store) proposing chains."""
        return SuffixDraft(self.max_nodes, max_match=self.max_match, min_prob=self.min_prob,
                           spec_factor=self.spec_factor, max_occurrences=self.max_occurrences,
                           max_chain=self.max_chain, store=self.store, store_prompts=self.store_prompts, chain=True)

    # the request
    def reset(self, tokens: TokenBuffer, capacity: int, spare: int = 0) -> None:
        self._bufs = [tokens] * len(tokens.n)
        self._idx = np.arange(len(tokens.n), dtype=np.int64)

    def select(self, keep: np.ndarray) -> None:
        keep = np.asarray(keep, np.int64)
        gone = np.setdiff1d(np.arange(len(self._idx)), keep)
        self._store_rows(gone)
        self._bufs = [self._bufs[j] for j in keep.tolist()]
        self._idx = self._idx[keep]

    def release(self) -> None:
        self._store_rows(np.arange(len(self._idx)))
        self._bufs, self._idx = [], np.zeros(0, np.int64)

    def _store_rows(self, which: np.ndarray) -> None:
        """Put the rows ``which`` (the draft's own row indices) in the store: their outputs, after
        their prompts' last ``max_match`` tokens (the whole row with ``store_prompts``)."""
        for j in np.asarray(which, np.int64).tolist():
            buf, r = self._bufs[j], int(self._idx[j])
            n, pl = int(buf.n[r]), int(buf.prompt_len[r])
            if n > pl or (self.store_prompts and n > 0):
                start = 0 if self.store_prompts else max(0, pl - self.max_match)
                self.store.insert(buf.ids[r, start:n])

    # continuous batching: the store is shared, the rows' state is where they are
    def join_refusal(self) -> str | None:
        return None

    def fresh(self) -> SuffixDraft:
        out = super().fresh()
        out._bufs, out._idx = [], np.zeros(0, np.int64)  # type: ignore[attr-defined]
        return out  # type: ignore[return-value]

    def absorb(self, other: Draft) -> None:
        self._bufs = self._bufs + other._bufs  # type: ignore[attr-defined]
        self._idx = np.concatenate([self._idx, other._idx])  # type: ignore[attr-defined]

    # the round
    def propose(self, rows: np.ndarray, tokens: TokenBuffer, k: int, need: np.ndarray, cfg: Any,
                rng: np.random.Generator, vocab: int) -> Drafted | DraftedTree:
        rows = np.asarray(rows, np.int64)
        self._bufs, self._idx = [tokens] * len(rows), rows.copy()
        greedy = as_transforms(cfg).greedy
        R = len(rows)
        N = self.max_nodes if self.spec is not None else min(self.max_nodes, max(int(k), 0))
        cap = np.minimum(np.asarray(need, np.int64) - 1, max(int(k), 0))
        N1 = N + 1
        out_tok = np.zeros((R, N1), np.int64)
        out_parent = np.zeros((R, N1), np.int64)
        out_valid = np.zeros((R, N1), bool)
        S = self.max_occurrences
        q_tok = np.full((R, N1, S), -1, np.int64)
        q_p = np.zeros((R, N1, S), np.float32)
        used = np.zeros(R, np.int64)
        uniforms = np.zeros((R, max(N, 1))) if greedy or N == 0 else rng.random((R, N))
        st = self.store
        if N > 0 and R > 0:
            _grow(tokens.ids, tokens.n, rows, cap, N, self.max_match, 1, S, self.max_chain,
                  1 if self.chain else N, self.spec_factor, self.min_prob, greedy, int(vocab), st.toks, st.heads,
                  st.prev, st.anchors, int(st.state[0]), uniforms, out_tok, out_parent, out_valid, q_tok, q_p, used)
        W = int(used.max(initial=0)) + 1  # the widest row's nodes (each row's are 1 .. used[r])
        q = None
        if not greedy:
            q = np.zeros((R, W, vocab), np.float32)
            r, v, j = np.nonzero(q_tok[:, :W] >= 0)
            q[r, v, q_tok[r, v, j]] = q_p[r, v, j]
        if self.spec is None:  # a chain: draft j was drawn from q at node j
            K = max(int(k), 0)
            out = np.zeros((R, K), np.int64)
            out[:, : W - 1] = out_tok[:, 1:W]
            qq = None
            if q is not None:
                qq = np.zeros((R, K, vocab), np.float32)
                qq[:, : W - 1] = q[:, : W - 1]
            return Drafted(out, qq, used)
        parent = out_parent[:, :W].copy()
        parent[:, 0] = -1
        return DraftedTree(out_tok[:, :W].copy(), q, out_valid[:, :W].copy(), Tree(parent, False))
