"""The text Process: a batch of token sequences, a target LM and a draft, with reusable KV caches.

The round loop (:func:`speculate.rounds.run`) drives :class:`TextProcess` through
``propose -> score -> commit``; verification happens only there, and so does the budget (the loop
tells ``propose`` how many tokens each row still needs and stops rows that have them all).

Long-lived state lives on the process: the committed tokens (``request.tokens.TokenBuffer``), the
target's model runtime (``models.runtime.ModelRuntime``: the position-indexed KV cache, a lean loop, or
the fallback) and the draft (``drafts.base.Draft``) with its own cache. What one
round needs between its three steps travels in the proposal's context (``_Round``): how many
tokens ``score`` fed the target, and the draft's own round state, which ``commit`` hands back to
the draft's ``advance``.

>>> from speculate.domains.text.conformance import tiny_llama
>>> from speculate.domains.text.drafts.factory import make_draft
>>> from speculate.domains.text.models.pick import pick_runtime
>>> from speculate.domains.text.request.sampling import SamplingConfig
>>> from speculate.domains.text.request.tokens import TokenBuffer
>>> import numpy as np, speculate as sp
>>> target = tiny_llama(vocab=12)
>>> proc = TextProcess(target=pick_runtime(target, "target"), draft=make_draft("ngram", target),
...                    tokens=TokenBuffer.from_prompts([[1, 2, 1, 2]], extra=6), cfg=SamplingConfig(),
...                    eos=np.zeros(0, np.int64), vocab=12)
>>> proc.start()
>>> out = sp.rounds.run(proc, 1, 6, lookahead=3, rng=0)
>>> int(proc.tokens.n[0])                                       # the prompt's 4 tokens + 6 new
10
>>> proc.release()
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from speculate.distributions import Categorical
from speculate.rounds import Proposal, Verdict
from speculate.verify import Tree
from speculate.verify.device import DeviceCategorical, upload
from speculate.verify.tree import tree_depths

from .drafts.base import Draft, DraftedTree
from .drafts.trees import tree_probs
from .models.kv_cache import advance_length
from .models.runtime import ModelRuntime
from .request.processors import Transforms, as_transforms
from .request.sampling import SamplingConfig
from .request.tokens import TokenBuffer

__all__ = ["TextProcess"]










def _check_logits(logits: torch.Tensor, rows: np.ndarray) -> None:
    """Raise ``ValueError`` when a row's target logits hold NaN or +inf (softmax would give NaN, and
    argmax would pick a NaN): never sample from, or pass on, a broken distribution."""
    top = logits.amax(dim=-1)  # [R, k+1]: NaN and +inf propagate; all -inf means no token at all
    ok = torch.isfinite(top)
    if bool(ok.all()):
        return
    bad = (~ok).any(dim=1).nonzero()[:, 0].cpu().numpy()
    raise ValueError(
        f"the target's logits are not finite (NaN, +inf or all -inf) for rows {rows[bad][:8].tolist()}: "
        "its weights or activations overflowed or hold NaN (float16 overflow? a diverged "
        "checkpoint?). Check the model with a plain forward pass; try float32 or bfloat16")


class _Round:
    """One round's state (the proposal's context): the draft's, then what ``score`` fed the target."""

    __slots__ = ("draft", "features", "fed", "p", "pending")

    def __init__(self, draft: Any) -> None:
        self.draft = draft  # the draft's round state (Drafted.state)
        self.p: Any = None  # [R, k+1 or N+1, V]: the target's law at each scored position (logprobs only)
        self.pending: Any = None  # int64 [R]: committed tokens the target's cache lacked (fed first)
        self.fed: Any = None  # int64 [R]: drafted tokens fed to the target after them
        self.features: Any = None  # [R, W, H]: the target's features, for drafts that read them


@dataclass
class TextProcess:
    """B token sequences, the target's cache and a draft, driven by ``speculate.rounds.run``.

    Rows finish when the loop has given them their tokens or at an EOS id of ``eos`` (int64
    ``[E]``; empty: never). ``encode``: for encoder-decoder targets, run once by :meth:`start`
    before the caches are filled (it runs the encoders and hands each row's encoder output to the
    target's and the draft's caches; counted in ``prefill_time``). ``cfg``: the sampling settings,
    or a :class:`~speculate.domains.text.request.processors.Transforms` with prefix processors. ``stop``:
    optional ``stop(rows, start, n_used) -> (n_used, hit)``, called after each commit with the
    buffer rows, where their new tokens start and how many were committed (stop strings).
    """

    target: ModelRuntime
    draft: Draft
    tokens: TokenBuffer
    cfg: SamplingConfig | Transforms
    eos: np.ndarray  # int64 [E]
    vocab: int
    prefill_time: float = 0.0
    encode: Any = None  # Callable[[], None]: encoder-decoder targets only
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows in the caches
    stop: Any = None  # Callable: stop strings (see the class docstring)
    on_device: bool = False  # chains verified where the logits are (speculate.verify.device)
    want_logprobs: bool = False  # keep each committed token's log-probability in ``logprobs``
    logprobs: Any = None  # float32 [B, capacity] (NaN where no token was generated): with want_logprobs

    def __post_init__(self) -> None:
        self.cfg = as_transforms(self.cfg)

    def start(self, spare: int = 2) -> None:
        """Fill both caches with every prompt token but the last (the last is scored first).

        The caches hold rows as long as the token buffer (prompts plus new tokens) and ``spare``
        slots more for the padded columns of ragged blocks.
        """
        B = len(self.tokens.n)
        capacity = self.tokens.ids.shape[1]
        self.live = np.arange(B, dtype=np.int64)
        if self.want_logprobs:
            self.logprobs = np.full((B, capacity), np.nan, np.float32)
        t0 = time.perf_counter()
        if self.encode is not None:
            self.encode()
        self.target.reset(B, capacity, spare)
        self.draft.on_device = self.on_device  # a draft model drafts where its logits are
        reads = self.draft.reads_features
        self.target.capture, self.target.features = reads, None
        m = int(self.tokens.n.max()) - 1
        if m > 0:
            block = self.tokens.block(self.live, np.zeros(B, np.int64), m)
            self.target.forward(torch.from_numpy(block), np.zeros(B, np.int64), last_only=not reads,
                                valid=self.tokens.n - 1)
            self.target.keep(self.tokens.n - 1)
        self.draft.reset(self.tokens, capacity, spare)
        if reads:  # the features of every prompt position but the last (what the prefill computed)
            feats = self.target.features if m > 0 else None
            self.draft.observe(feats, self.tokens.n - 1)
        self.prefill_time = time.perf_counter() - t0

    def release(self) -> None:
        """Free both models' caches once generation is over."""
        self.target.release()
        self.draft.release()

    def absorb(self, other: TextProcess) -> np.ndarray:
        """Append the rows of ``other`` (another request on the same target and kind of draft, already
        :meth:`start`-ed: its caches filled) after this process's rows; their buffer rows here.
        Continuous batching: a request joins a running batch between rounds without refilling the
        rows already running. ``NotImplementedError`` (before any change) when a runtime or the draft
        cannot (:meth:`join_refusal`)."""
        why = self.join_refusal()
        if why is not None:
            raise NotImplementedError(why)
        off = len(self.tokens.n)
        self.tokens = self.tokens.joined(other.tokens)
        self.target.absorb(other.target)  # type: ignore[attr-defined]
        self.draft.absorb(other.draft)
        new = off + other.live
        self.live = np.concatenate([self.live, new])
        if self.want_logprobs:
            lp = np.full(self.tokens.ids.shape, np.nan, np.float32)
            lp[:off, : self.logprobs.shape[1]] = self.logprobs
            lp[off:, : other.logprobs.shape[1]] = other.logprobs
            self.logprobs = lp
        return new

    def join_refusal(self) -> str | None:
        """Why other requests' rows cannot join this process's batch (:meth:`absorb`); None when they can."""
        if self.encode is not None:
            return "encoder-decoder rows carry encoder states: they do not join a running batch"
        join = getattr(self.target, "join_refusal", None)
        if join is None:
            return f"the target's runtime {type(self.target).__name__} cannot take rows into a running batch"
        return join() or self.draft.join_refusal()

    def compact(self) -> np.ndarray:
        """Drop the finished rows from the token buffer: the live rows become rows ``0 .. R-1`` (in
        order; the caches already hold only them). Returns the old buffer rows, in the new order."""
        old = self.live.copy()
        self.tokens = self.tokens.taken(old)
        if self.want_logprobs:
            self.logprobs = self.logprobs[old]
        self.live = np.arange(len(old), dtype=np.int64)
        return old

    def _select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == len(self.live) and np.array_equal(rows, self.live):
            return
        keep = np.searchsorted(self.live, rows)
        if np.any(keep >= len(self.live)) or not np.array_equal(self.live[keep], rows):
            raise RuntimeError(f"rows {rows.tolist()} are not a subset of the live rows")
        self.target.select(keep)
        self.draft.select(keep)
        self.live = rows

    def _grow(self, k: int) -> None:
        need = int(self.tokens.n[self.live].max()) + k + 2
        self.target.ensure_capacity(need)

    def propose(
        self, rows: np.ndarray, k: int, branches: int, need: np.ndarray, rng: np.random.Generator
    ) -> Proposal:
        if branches != 1:
            raise NotImplementedError("the text domain drafts one branch per row (branches = 1)")
        self._select(rows)
        self._grow(k)
        d = self.draft.propose(self.live, self.tokens, k, need, self.cfg, rng, self.vocab)
        dists = (d.q if d.q is None or isinstance(d.q, DeviceCategorical)  # None: point masses
                 else Categorical(probs=d.q, validate=False))
        if isinstance(d, DraftedTree):
            self._grow(d.tokens.shape[1])
            return Proposal(outcomes=d.tokens, dists=dists, lengths=d.valid, context=_Round(d.state),
                            tree=d.tree)
        return Proposal(outcomes=d.outcomes, dists=dists, lengths=d.lengths, context=_Round(d.state))

    def score(self, rows: np.ndarray, proposal: Proposal) -> Categorical:
        self._select(rows)
        if proposal.tree is not None:
            return self._score_tree(proposal)
        drafts = np.asarray(proposal.outcomes, dtype=np.int64)  # [R, k]
        R, k = drafts.shape
        lengths = (np.full(R, k, np.int64) if proposal.lengths is None
                   else np.asarray(proposal.lengths, dtype=np.int64))
        t = self.tokens
        start = self.target.length  # [R]
        P = t.n[self.live] - start  # [R] pending tokens (>= 1)
        W = int(P.max()) + k
        block = t.block(self.live, start, W)  # [R, W]
        cols = P[:, None] + np.arange(k)[None, :]  # [R, k] where the drafts go
        valid = np.arange(k)[None, :] < lengths[:, None]
        rr = np.repeat(np.arange(R), k).reshape(R, k)
        block[rr[valid], cols[valid]] = drafts[valid]
        logits = self.target.forward(torch.from_numpy(block), start, valid=P + lengths)  # [R, W, V]
        idx = upload(P[:, None] - 1 + np.arange(k + 1)[None, :], logits.device)  # [R, k+1]
        sel = logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[-1]))  # [R, k+1, V]
        ctx = proposal.context
        ctx.pending, ctx.fed = P, lengths
        ctx.features = self.target.features if self.target.capture else None
        if self.on_device:  # verified where the logits are: no transfer (bad rows flagged there)
            probs = self.cfg.probs(sel, t, self.live, drafts)  # [R, k+1, V]
            ctx.p = probs if self.want_logprobs else None
            return DeviceCategorical(probs)
        _check_logits(sel, self.live)
        p = self.cfg.probs(sel, t, self.live, drafts).cpu().numpy()  # [R, k+1, V] float32
        ctx.p = p if self.want_logprobs else None
        return Categorical(probs=p, validate=False)

    def _score_tree(self, proposal: Proposal) -> Categorical:
        """The target at every node of each row's token tree, in ONE forward: the pending tokens
        as a chain, then node i at column ``P - 1 + i`` (the root is the last pending token) with
        position ``start + P - 1 + depth(i)``, seeing the prefix and its ancestors."""
        tokens = np.asarray(proposal.outcomes, dtype=np.int64)  # [R, N+1]
        R, N1 = tokens.shape
        tree = proposal.tree if isinstance(proposal.tree, Tree) else Tree(np.asarray(proposal.tree))
        shape = np.asarray(tree.parent, np.int64)
        parent = np.broadcast_to(shape, (R, N1))
        depth = np.broadcast_to(tree_depths(shape), (R, N1))  # [R, N+1] (one shape: computed once)
        t = self.tokens
        start = self.target.length  # [R]
        P = t.n[self.live] - start  # [R] pending tokens (>= 1)
        W = int(P.max()) + N1 - 1
        block = t.block(self.live, start, W)  # [R, W]: the pending tokens first
        rows = np.arange(R)
        cols = P[:, None] - 1 + np.arange(N1)[None, :]  # [R, N+1] the column of each node
        block[rows[:, None], cols[:, 1:]] = tokens[:, 1:]
        positions = start[:, None] + np.arange(W)[None, :]  # [R, W]
        positions[rows[:, None], cols] = (start + P - 1)[:, None] + depth
        anc = np.zeros((R, N1, N1), bool)  # anc[r, i, a]: a is i or an ancestor of i
        anc[:, np.arange(N1), np.arange(N1)] = True
        for i in range(1, N1):
            anc[:, i] |= anc[rows, parent[:, i]]
        j = np.arange(W)
        see = (j[None, None, :] <= j[None, :, None]) & (j[None, :, None] < P[:, None, None])  # [R, W, W] pending chain
        see[:, j, j] = True  # padding columns see themselves (never read)
        node_cols = cols[:, 1:]  # [R, N]
        see[rows[:, None], node_cols] = j[None, None, :] < P[:, None, None]  # a node sees every pending token
        for a in range(1, N1):
            see[rows[:, None], node_cols, cols[:, a : a + 1]] = anc[:, 1:, a]
        logits = self.target.forward(torch.from_numpy(block), start, positions=positions, see=see)  # [R, W, V]
        idx = torch.as_tensor(cols, device=logits.device)  # [R, N+1]
        sel = logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[-1]))  # [R, N+1, V]
        _check_logits(sel, self.live)
        p = tree_probs(self.cfg, sel, self.tokens, self.live, tokens, parent, depth).cpu().numpy()  # [R, N+1, V]
        ctx = proposal.context
        ctx.pending = P
        ctx.features = self.target.features if self.target.capture else None
        ctx.p = p if self.want_logprobs else None
        return Categorical(probs=p, validate=False)

    def commit(
        self, rows: np.ndarray, proposal: Proposal, verdict: Verdict
    ) -> tuple[np.ndarray, np.ndarray | None]:
        self._select(rows)
        t, rows = self.tokens, self.live
        n_accepted = verdict.n_accepted
        E = verdict.outcomes  # [R, k+1]: kept drafts, then the verifier's token at n_accepted[r]
        n_used = n_accepted + 1
        cols = np.arange(E.shape[1])[None, :]
        valid = cols < n_used[:, None]  # [R, k+1]
        done = None  # no EOS ids: rows end when the loop has given them their tokens
        if len(self.eos):
            hit = valid & np.isin(E, self.eos)
            done = hit.any(axis=1)
            n_used = np.where(done, hit.argmax(axis=1) + 1, n_used)  # up to the first EOS
            valid = cols < n_used[:, None]
        rr, cc = np.nonzero(valid)
        t.ids[rows[rr], t.n[rows][rr] + cc] = E[rr, cc]
        ctx = proposal.context
        if ctx.p is not None:  # each committed token's log-probability under the law it was drawn from
            node = cc.copy()  # a chain: position j's law; a tree: the law at the node the token hangs from
            if verdict.path is not None:
                deep = cc > 0
                node[deep] = np.asarray(verdict.path, np.int64)[rr[deep], cc[deep] - 1]
            if isinstance(ctx.p, np.ndarray):
                lp = ctx.p[rr, node, E[rr, cc]]
            else:  # on the device: one gather, one transfer
                ix = [torch.as_tensor(a, device=ctx.p.device) for a in (rr, node, E[rr, cc])]
                lp = ctx.p[ix[0], ix[1], ix[2]].float().cpu().numpy()
            with np.errstate(divide="ignore"):
                self.logprobs[rows[rr], t.n[rows][rr] + cc] = np.log(np.asarray(lp, np.float64))
        if self.stop is not None:  # stop strings: cut a row after the token that completes one
            n_used, hit = self.stop(rows, t.n[rows], n_used)
            done = hit if done is None else (done | hit)
        t.n[rows] += n_used
        R = len(rows)
        if verdict.path is not None or ctx.features is not None:  # chains without features need neither
            keep = np.minimum(n_accepted, np.maximum(n_used - 1, 0))  # fed drafts that stay in the caches
            if verdict.path is not None:  # a tree: node i was written at column P - 1 + i
                path = np.asarray(verdict.path, np.int64)[:, : max(int(keep.max()), 0)]  # [R, D']
            else:
                path = np.broadcast_to(np.arange(1, int(keep.max()) + 1), (R, int(keep.max())))
            cols = ctx.pending[:, None] - 1 + path  # [R, D'] the columns of the kept path
        if verdict.path is not None:
            dst = ctx.pending[:, None] + np.arange(path.shape[1])[None, :]
            move = (np.arange(path.shape[1])[None, :] < keep[:, None]) & (cols != dst)
            r, j = np.nonzero(move)
            start = self.target.length
            self.target.move(r, start[r] + cols[r, j], start[r] + dst[r, j])
            ctx.fed = n_accepted
        if ctx.features is not None:
            self._observe(ctx, cols, keep, n_used)
        advance_length(self.target, ctx.pending, ctx.fed, n_used, n_accepted)
        self.draft.advance(ctx.draft, n_used, n_accepted, verdict.path)
        return n_used, done

    def _observe(self, ctx: _Round, path_cols: np.ndarray, keep: np.ndarray, n_used: np.ndarray) -> None:
        """Hand the draft the target's features at the positions this round commits to the target's
        cache, in order: the pending tokens', then the kept path's (none for a row that used nothing)."""
        P = ctx.pending
        count = np.where(n_used > 0, P + keep, 0)  # [R]
        F = max(int(count.max()), 1)
        j = np.arange(F)[None, :]
        cols = np.where(j < P[:, None], j, 0)  # [R, F]
        on = (j >= P[:, None]) & (j < count[:, None])
        rr, jj = np.nonzero(on)
        cols[rr, jj] = path_cols[rr, jj - P[rr]]
        feats = ctx.features  # [R, W, H]
        idx = torch.as_tensor(cols, device=feats.device)
        self.draft.observe(feats.gather(1, idx[:, :, None].expand(-1, -1, feats.shape[-1])), count)
