"""A vectorised Process for the round loop: B chains of an order-2 Markov model given by tables.

Used by the statistical checks of the round loop (proofs/check_10). Target and draft are tables
``[V+1, V+1, V]`` indexed by the last two outcomes (``V`` is the start symbol), so the exact joint
law of the first L outcomes is available from :mod:`speculate.testing.exact`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

import speculate
from speculate.rounds import Proposal


class TableProcess:
    """The Process protocol (docs/architecture.md) for an order-2 table model, batched in NumPy.

    ``restore_rng=True`` reproduces a real bug for the counterexample of Theorem 10: the process
    saves the generator's state at the first round and restores it at every commit (as a snapshot
    that wrongly includes the loop's generator), so every round reuses the same uniforms.
    """

    def __init__(self, target: np.ndarray, draft: np.ndarray, B: int, restore_rng: bool = False):
        V = target.shape[-1]
        assert target.shape == draft.shape == (V + 1, V + 1, V)
        self.P, self.Q, self.V = target, draft, V
        self.ctx = np.full((B, 2), V, np.int64)  # [B, 2]: the last two outcomes (V = start)
        self.restore_rng, self._saved = restore_rng, None
        self._rng = None

    def propose(self, rows, k, m, need, rng):
        if self.restore_rng:
            if self._saved is None:
                self._saved = rng.bit_generator.state
            self._rng = rng
        R, V = len(rows), self.V
        ctx = np.repeat(self.ctx[rows][:, None, :], m, axis=1)  # [R, m, 2]
        path = np.empty((R, m, k + 1, 2), np.int64)  # contexts of the k+1 drafted states
        path[:, :, 0] = ctx
        x = np.empty((R, m, k), np.int64)
        for i in range(k):
            q = self.Q[ctx[..., 0], ctx[..., 1]]  # [R, m, V]
            cdf = np.cumsum(q, axis=-1)
            u = rng.random((R, m, 1))
            x[..., i] = np.minimum((cdf <= u * cdf[..., -1:]).sum(-1), V - 1)
            ctx = np.stack([ctx[..., 1], x[..., i]], axis=-1)
            path[:, :, i + 1] = ctx
        q = self.Q[path[:, :, :k, 0], path[:, :, :k, 1]]  # [R, m, k, V]
        if m == 1:
            return Proposal(x[:, 0], speculate.Categorical(probs=q[:, 0], validate=False), context=path)
        return Proposal(x, speculate.Categorical(probs=q, validate=False), context=path)

    def score(self, rows, proposal):
        path = proposal.context  # [R, m, k+1, 2]
        p = self.P[path[..., 0], path[..., 1]]  # [R, m, k+1, V]
        if p.shape[1] == 1:
            p = p[:, 0]  # [R, k+1, V]
        return speculate.Categorical(probs=p, validate=False)

    def commit(self, rows, proposal, verdict):
        n = verdict.n_accepted + 1  # outcomes per row: the kept drafts and the verifier's draw
        for r, e, c in zip(rows, verdict.outcomes.tolist(), n.tolist(), strict=True):
            for x in e[:c]:
                self.ctx[r] = (self.ctx[r, 1], x)
        if self.restore_rng:
            self._rng.bit_generator.state = self._saved
        return n, np.zeros(len(rows), bool)


def random_tables(
    seed: int, V: int, den: int = 8, zeros: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Dyadic target and draft tables [V+1, V+1, V] (zeros allowed unless ``zeros=False``)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        t = np.zeros((V + 1, V + 1, V))
        for a in range(V + 1):
            for b in range(V + 1):
                while True:
                    cuts = np.sort(rng.integers(0, den + 1, V - 1))
                    t[a, b] = np.diff(np.concatenate([[0], cuts, [den]])) / den
                    if zeros or t[a, b].min() > 0:
                        break
        out.append(t)
    return out[0], out[1]


def as_conditional(table: np.ndarray):
    """The table as ``prefix -> list of Fractions`` for speculate.testing.exact."""
    V = table.shape[-1]

    def cond(prefix):
        a, b = (V, V, *prefix)[-2:]
        return [Fraction(float(x)) for x in table[a, b]]

    return cond
