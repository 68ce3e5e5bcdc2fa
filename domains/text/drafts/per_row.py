"""Several kinds of draft, one chosen per row and round (:class:`PerRowDraft`, ``draft=[...]``).

A generator given a list of drafts (``SpeculativeGenerator(target, ["suffix", draft_model])``)
drafts each row, each round, with the kind that has gained that row the most tokens per round so
far (a new row starts from what each kind gained earlier rows): the suffix draft where the row
repeats earlier text, the draft model elsewhere. The choice is
made from the row's past rounds only (a moving average of accepted drafts + 1 per kind), before any
kind drafts, so every round's draft law is the chosen kind's own ``q`` and the verifier keeps the
output law the target's (proofs/06, point 5: a draft chosen from the past is a draft). A kind not
chosen for ``EXPLORE`` rounds drafts a row once more, so a row whose text turns repetitive (or stops
being so) finds the better kind again; a kind that such a re-try finds still worse waits twice as
long before the next (up to ``MAX_WAIT`` rounds), so a kind that never pays for a row costs it a
few rounds, not one in every ``EXPLORE``.

Each kind drafts the rows that chose it in a round where at least one row did (a kind with a model
drafts all rows then: its runtime steps every row together, and the rows that chose another kind
keep only their committed tokens in its cache, as after a round that rejected every draft). Chains
only: a token tree cannot be merged row by row with a chain, so ``"suffix"`` here is the suffix
draft's chain form (``SuffixDraft(chain=True)``), and trained trees (Medusa, feature drafts) are
refused. Verification stays on the host (``verify_on_device=False``).

>>> import numpy as np
>>> from speculate.domains.text.drafts.ngram import NgramDraft
>>> from speculate.domains.text.drafts.suffix import SuffixDraft
>>> d = PerRowDraft([SuffixDraft(chain=True), NgramDraft(3)])
>>> [type(k).__name__ for k in d.kinds], d.default_lookahead()
(['SuffixDraft', 'NgramDraft'], 8)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..request.processors import as_transforms
from .base import Draft, Drafted

__all__ = ["PerRowDraft"]


class PerRowDraft(Draft):
    """Drafts of several kinds (chains), the one with the most tokens per round per row so far.

    ``kinds``: two or more drafts; ``explore``: rounds after which a kind not chosen for a row drafts it
    once more; ``decay``: the weight of a row's past in its moving average per kind; ``prior``: new rows
    start from what each kind gained earlier rows of the generator (False: every kind is tried afresh).
    """

    EXPLORE = 16
    MAX_WAIT = 512  #: the most rounds between two re-tries of a kind that keeps losing for a row

    def __init__(self, kinds: list[Draft], explore: int = EXPLORE, decay: float = 0.7, prior: bool = True) -> None:
        kinds = list(kinds)
        if len(kinds) < 2:
            raise ValueError(f"a per-row choice of drafts needs two or more drafts, got {len(kinds)}")
        for d in kinds:
            if not isinstance(d, Draft):
                raise TypeError(f"every kind must be a speculate text Draft, got {type(d).__name__}")
            if d.spec is not None or d.reads_features:
                raise ValueError(
                    f"{type(d).__name__} drafts token trees or reads the target's features: a per-row choice "
                    "merges chains row by row (pass 'suffix' or SuffixDraft(chain=True), 'ngram', "
                    "'early-exit:N' or draft models)")
        if isinstance(explore, bool) or not isinstance(explore, (int, np.integer)) or explore < 1:
            raise ValueError(f"explore must be an int >= 1, got {explore!r}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        self.kinds, self.explore, self.decay, self.learns = kinds, int(explore), float(decay), bool(prior)
        self.static_target = all(d.static_target for d in kinds)
        self.counts = np.zeros(len(kinds), np.int64)  #: row-rounds each kind drafted (all requests)
        self.prior = np.full(len(kinds), np.nan)  #: [J] tokens per round each kind gained, over all rows so far
        self._empty(0)

    def _empty(self, B: int) -> None:
        """The state of ``B`` new rows: each kind's gain starts at what it gained earlier rows (``prior``;
        NaN, not tried, for a kind that never drafted), so a new request does not learn from nothing."""
        J = len(self.kinds)
        self.gain = np.repeat(self.prior[:, None], B, axis=1)  # [J, B] tokens per round (moving average)
        self.since = np.zeros((J, B), np.int64)  # [J, B] rounds since the kind last drafted the row
        self.tries = np.zeros((J, B), np.int64)  # [J, B] rounds the kind drafted the row
        self.wait = np.full((J, B), self.explore, np.int64)  # [J, B] rounds before a kind not chosen is re-tried

    # the draft's on_device is the process's: refused, since q is merged on the host
    @property  # type: ignore[override]
    def on_device(self) -> bool:
        return False

    @on_device.setter
    def on_device(self, value: bool) -> None:
        if value:
            raise ValueError("a per-row choice of drafts verifies on the host: pass verify_on_device=False")

    # the request
    def reset(self, tokens: Any, capacity: int, spare: int = 0) -> None:
        for d in self.kinds:
            d.reset(tokens, capacity, spare)
        self._empty(len(tokens.n))

    def select(self, keep: np.ndarray) -> None:
        for d in self.kinds:
            d.select(keep)
        self.gain, self.since, self.tries = self.gain[:, keep], self.since[:, keep], self.tries[:, keep]
        self.wait = self.wait[:, keep]

    def release(self) -> None:
        for d in self.kinds:
            d.release()
        self._empty(0)

    def join_refusal(self) -> str | None:
        return next((r for r in (d.join_refusal() for d in self.kinds) if r), None)

    def fresh(self) -> PerRowDraft:
        twin = PerRowDraft([d.fresh() for d in self.kinds], self.explore, self.decay, self.learns)
        twin.counts, twin.prior = self.counts, self.prior  # one count and one prior per generator
        return twin

    def absorb(self, other: Draft) -> None:
        for d, o in zip(self.kinds, other.kinds, strict=True):  # type: ignore[attr-defined]
            d.absorb(o)
        self.gain = np.concatenate([self.gain, other.gain], axis=1)  # type: ignore[attr-defined]
        self.since = np.concatenate([self.since, other.since], axis=1)  # type: ignore[attr-defined]
        self.tries = np.concatenate([self.tries, other.tries], axis=1)  # type: ignore[attr-defined]
        self.wait = np.concatenate([self.wait, other.wait], axis=1)  # type: ignore[attr-defined]

    def encode(self, inputs: Any, target_state: Any) -> None:
        for d in self.kinds:
            d.encode(inputs, target_state)

    def models(self) -> list[tuple[Any, str]]:
        return [m for d in self.kinds for m in d.models()]

    def default_lookahead(self) -> int:
        return max(d.default_lookahead() for d in self.kinds)

    def lookahead_limit(self) -> tuple[int, str] | None:
        limits = [x for x in (d.lookahead_limit() for d in self.kinds) if x is not None]
        return min(limits, key=lambda x: x[0]) if limits else None

    def use_static(self) -> bool:
        return all([d.use_static() for d in self.kinds])  # every kind switches (a list: no short cut)

    # the round
    def choose(self) -> np.ndarray:
        """Each row's kind this round ``[R]`` (see ``_choice``)."""
        return self._choice()[0]

    def _choice(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's kind this round ``[R]``, from its past rounds only: a kind never tried first (in
        the order given), then one not chosen for its ``wait`` (``explore`` rounds, doubled by each re-try
        that found it still worse), else the most tokens per round plus an optimism of ``1 / sqrt(tries)``
        (a kind that had one unlucky round is not written off)."""
        gain, since = self.gain, self.since
        untried = np.isnan(gain)
        stale = since >= self.wait
        score = gain + 1.0 / np.sqrt(np.maximum(self.tries, 1))
        best = np.argmax(np.where(untried, -np.inf, score), axis=0)  # ties: the first kind
        pick = np.where(stale.any(axis=0), np.argmax(stale, axis=0), best)
        retry = stale.any(axis=0) & ~untried.any(axis=0)  # [R] the row re-tries a kind that waited
        return np.where(untried.any(axis=0), np.argmax(untried, axis=0), pick), retry

    def propose(self, rows: np.ndarray, tokens: Any, k: int, need: np.ndarray, cfg: Any,
                rng: np.random.Generator, vocab: int) -> Drafted:
        R = len(rows)
        choice, retry = self._choice()  # [R], decided before any kind draws
        greedy = as_transforms(cfg).greedy  # greedy: no laws (the greedy rule)
        outcomes = np.zeros((R, k), np.int64)
        lengths = np.zeros(R, np.int64)
        q = None
        states: list[Any] = [None] * len(self.kinds)
        ran = np.zeros(len(self.kinds), bool)
        for j, d in enumerate(self.kinds):
            mine = choice == j
            if not mine.any():
                continue  # its state (a cache) catches up the next time it drafts
            got = d.propose(rows, tokens, k, need, cfg, rng, vocab)
            states[j], ran[j] = got.state, True
            w = got.outcomes.shape[1]
            outcomes[mine, :w] = got.outcomes[mine]
            lengths[mine] = got.lengths[mine]
            if not greedy:
                if q is None:
                    q = np.zeros((R, k, vocab), np.float32)
                if got.q is None:  # point masses at the drafted tokens
                    r, i = np.nonzero(mine[:, None] & (np.arange(w)[None, :] < got.lengths[:, None]))
                    q[r, i, got.outcomes[r, i]] = 1.0
                else:
                    q[mine, :w] = np.asarray(got.q)[mine]
        self.counts += np.bincount(choice, minlength=len(self.kinds))
        return Drafted(outcomes, q, lengths, (choice, retry, states, ran))

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray, path: Any = None) -> None:
        choice, retry, states, ran = state
        R = len(choice)
        n_used, n_accepted = np.asarray(n_used, np.int64), np.asarray(n_accepted, np.int64)
        for j, d in enumerate(self.kinds):
            if ran[j]:  # rows that chose another kind: none of this kind's drafts were kept
                d.advance(states[j], n_used, np.where(choice == j, n_accepted, 0))
        cols = np.arange(R)
        old = self.gain[choice, cols]
        new = (n_accepted + 1).astype(np.float64)
        used = n_used > 0
        avg = np.where(np.isnan(old), new, self.decay * old + (1 - self.decay) * new)
        self.gain[choice[used], cols[used]] = avg[used]
        for j in np.unique(choice[used]) if self.learns else ():  # what each kind gained, into the prior
            mean = float(new[used & (choice == j)].mean())
            self.prior[j] = mean if np.isnan(self.prior[j]) else self.decay * self.prior[j] + (1 - self.decay) * mean
        others = np.where(np.isnan(self.gain), -np.inf, self.gain)  # [J, R]
        others[choice, cols] = -np.inf
        lost = used & retry & (avg < others.max(axis=0))  # a re-try found the kind still behind the best other
        kept = used & ~lost
        self.wait[choice[lost], cols[lost]] = np.minimum(2 * self.wait[choice[lost], cols[lost]], self.MAX_WAIT)
        self.wait[choice[kept], cols[kept]] = self.explore  # chosen on its merit, or a re-try that caught up
        self.since[:, used] += 1
        self.since[choice[used], cols[used]] = 0
        self.tries[choice[used], cols[used]] += 1
