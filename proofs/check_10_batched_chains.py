"""Checks for proofs/10-batched-chains.md: B chains verified together are independent and each
exact when every row and every round gets fresh uniforms; reusing uniforms breaks this."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

from proofs.cases import random_table
from proofs.stats import chi2_gof, min_samples
from proofs.table_process import TableProcess, as_conditional, random_tables
from speculate.rounds import run
from speculate.testing.exact import assert_exact_law, residual, target_joint_law
from speculate.verify import verify_token

V, L = 2, 3
EPS = 0.05  # total variation the pair test is powered for (merged cells)
PAIRS = min_samples(EPS, 64)


def pair_counts(samples):
    """Counts of (chain 2i, chain 2i+1) over the 8 x 8 = 64 joint outcomes of 3 binary steps."""
    s = np.array([x[:L] for x in samples], np.int64)  # [B, L]
    code = s @ (2 ** np.arange(L)[::-1])  # [B]
    return np.bincount(code[0::2] * 8 + code[1::2], minlength=64)


SEED = 2  # tables without zeros: every chain is random from its first outcome on


def product_law(seed):
    P, _ = random_tables(seed, V, den=4, zeros=False)
    law = target_joint_law(as_conditional(P), V, L)
    one = [float(law.get(seq, 0)) for seq in itertools.product(range(V), repeat=L)]
    return np.outer(one, one).ravel()


@pytest.mark.parametrize(
    ("verify", "branches", "lookahead"),
    [("token", 1, 2), ("block", 1, 2), ("token", 2, 2), ("greedy", 1, 2), ("token", 1, "auto")],
)
def test_round_loop_rows_are_independent_and_exact(verify, branches, lookahead):
    """speculate.rounds.run on 2 x 12 180 chains of an order-2 table model: the joint law of
    the first 3 outcomes of chains 2i and 2i+1 is the product of the exact target laws
    (chi-square at level 1e-6 on the 64 joint cells, small cells merged; power 0.99 against any
    deviation of TV >= 0.05 of the merged law: bias of either chain or dependence between them)."""
    seed = SEED
    P, Q = random_tables(seed, V, den=4, zeros=False)
    B = 2 * PAIRS
    proc = TableProcess(P, Q, B)
    kw = {"cost_ratio": 0.1} if lookahead == "auto" else {}
    res = run(proc, B, L, lookahead=lookahead, verify=verify, branches=branches, rng=11, **kw)
    if verify == "greedy":  # argmax decoding: every chain is the same deterministic sequence
        want = [int(np.argmax(P[V, V]))]
        a, b = V, want[0]
        for _ in range(L - 1):
            want.append(int(np.argmax(P[a, b])))
            a, b = b, want[-1]
        assert all(list(s) == want for s in res.samples)
        return
    chi2_gof(pair_counts(res.samples), product_law(seed), EPS, f"{verify} m={branches} {lookahead}")
    assert res.stats.rounds >= 2


def test_restoring_the_loops_generator_is_caught():
    """Counterexample through the real loop: a Process whose snapshot restores the loop's
    generator at every commit makes every round reuse the same uniforms (and draft noise); the
    same test rejects it."""
    seed = SEED
    P, Q = random_tables(seed, V, den=4, zeros=False)
    B = 2 * PAIRS
    res = run(TableProcess(P, Q, B, restore_rng=True), B, L, lookahead=1, rng=11)
    with pytest.raises(AssertionError, match="do not follow"):
        chi2_gof(pair_counts(res.samples), product_law(seed), EPS, "restored generator")


# ------------------------------------------------- exact laws with reused uniforms (k = 1)


def _cases(T, D, Vv, Lmax):
    """Every (prefix, draft) a k = 1 round can meet before Lmax outcomes."""
    out = []
    for n in range(Lmax):
        for s in itertools.product(range(Vv), repeat=n):
            for x in range(Vv):
                if D(s)[x]:
                    out.append((s, x))
    return out


def _pieces(points):
    pts = sorted({F(0), F(1)} | {t for t in points if 0 < t < 1})
    return list(itertools.pairwise(pts))


def _cells(T, D, Vv, cases):
    """Pieces of (u_accept, u_next) between every threshold any case can use (k = 1)."""
    acc, nxt = set(), set()
    for s, x in cases:
        p, q = T(s), D(s)
        acc.add(min(F(1), p[x] / q[x]))
        for row in ([p, T((*s, x))] + ([residual(p, q)] if p != q else [])):
            nxt |= set(itertools.accumulate(row))
    return list(itertools.product(_pieces(acc), _pieces(nxt)))


def _verdicts(T, D, Vv, cases, cells):
    """verify_token's (n, next) for every case at the centre of every cell: [cells][cases]."""
    p = np.array([[[float(v) for v in T(s)], [float(v) for v in T((*s, x))]] for s, x in cases])
    q = np.array([[[float(v) for v in D(s)]] for s, _ in cases])
    d = np.array([[x] for _, x in cases], np.int64)
    C, N = len(cells), len(cases)
    ua = np.repeat([float((a + b) / 2) for (a, b), _ in cells], N)[:, None]
    un = np.repeat([float((a + b) / 2) for _, (a, b) in cells], N)
    n, y = verify_token(np.tile(p, (C, 1, 1)), np.tile(q, (C, 1, 1)), np.tile(d, (C, 1)), None,
                        ua, un)
    out = [{} for _ in cells]
    for i in range(C * N):
        s, x = cases[i % N]
        out[i // N][s, x] = (x,) * int(n[i]) + (int(y[i]),)
    return out


def reused_across_rounds_law(T, D, Vv, Lmax):
    """Law of the first Lmax outcomes of ONE chain whose rounds all use the same uniforms."""
    cases = _cases(T, D, Vv, Lmax)
    cells = _cells(T, D, Vv, cases)
    verdicts = _verdicts(T, D, Vv, cases, cells)
    law: dict = {}
    for ((a0, a1), (b0, b1)), table in zip(cells, verdicts, strict=True):
        frontier = {(): (a1 - a0) * (b1 - b0)}
        while frontier:
            new: dict = {}
            for s, w in frontier.items():
                if len(s) >= Lmax:
                    law[s[:Lmax]] = law.get(s[:Lmax], 0) + w
                    continue
                for x, qx in enumerate(D(s)):
                    if qx:
                        t = s + table[s, x]
                        new[t] = new.get(t, 0) + w * qx
            frontier = new
    return law


def shared_across_rows_law(T, D, Vv, Lmax):
    """Joint law of two chains that use the SAME uniforms in each round (fresh each round)."""
    cases = _cases(T, D, Vv, Lmax)
    cells = _cells(T, D, Vv, cases)
    verdicts = _verdicts(T, D, Vv, cases, cells)
    sizes = [(a1 - a0) * (b1 - b0) for (a0, a1), (b0, b1) in cells]
    law: dict = {}
    frontier = {((), ()): F(1)}
    while frontier:
        new: dict = {}
        for (sa, sb), w in frontier.items():
            if len(sa) >= Lmax and len(sb) >= Lmax:
                key = (sa[:Lmax], sb[:Lmax])
                law[key] = law.get(key, 0) + w
                continue
            for size, table in zip(sizes, verdicts, strict=True):
                def step(s, table=table):
                    if len(s) >= Lmax:
                        return [(s, F(1))]
                    return [(s + table[s, x], qx) for x, qx in enumerate(D(s)) if qx]
                for (ta, wa), (tb, wb) in itertools.product(step(sa), step(sb)):
                    new[ta, tb] = new.get((ta, tb), 0) + w * size * wa * wb
        frontier = new
    return law


def test_fresh_uniforms_enumeration_is_exact():
    """The same enumeration with fresh uniforms every round (cells redrawn per round) gives the
    target law: the machinery below is sound, so the biases it finds are real."""
    T, D = random_table(3, 2, den=4), random_table(4, 2, den=4)
    cases = _cases(T, D, 2, 3)
    cells = _cells(T, D, 2, cases)
    verdicts = _verdicts(T, D, 2, cases, cells)
    sizes = [(a1 - a0) * (b1 - b0) for (a0, a1), (b0, b1) in cells]
    frontier, law = {(): F(1)}, {}
    while frontier:
        new: dict = {}
        for s, w in frontier.items():
            if len(s) >= 3:
                law[s[:3]] = law.get(s[:3], 0) + w
                continue
            for size, table in zip(sizes, verdicts, strict=True):
                for x, qx in enumerate(D(s)):
                    if qx:
                        t = s + table[s, x]
                        new[t] = new.get(t, 0) + w * size * qx
        frontier = new
    assert_exact_law(law, target_joint_law(T, 2, 3), "fresh uniforms")


def test_reusing_uniforms_across_rounds_is_biased():
    """The minimal example of the proof, through verify_token: p = (1/2, 1/2), q = (1, 0), k = 1.
    With the same uniforms every round the first two outcomes are (1, 1) w.p. 1/2, not 1/4."""
    half = F(1, 2)
    T, D = (lambda s: [half, half]), (lambda s: [F(1), F(0)])
    law = reused_across_rounds_law(T, D, 2, 2)
    assert law == {(0, 0): F(1, 4), (0, 1): F(1, 4), (1, 1): F(1, 2)}
    biased = 0
    for seed in range(4):  # and on random context-dependent tables
        T, D = random_table(seed, 2, den=4), random_table(10 + seed, 2, den=4)
        biased += reused_across_rounds_law(T, D, 2, 3) != target_joint_law(T, 2, 3)
    assert biased >= 2


def test_sharing_uniforms_across_rows_keeps_marginals_but_couples_rows():
    half = F(1, 2)
    T, D = (lambda s: [half, half]), (lambda s: [F(1), F(0)])
    joint = shared_across_rows_law(T, D, 2, 2)
    one = target_joint_law(T, 2, 2)
    for i in (0, 1):  # each row alone is exact
        marg: dict = {}
        for pair, w in joint.items():
            marg[pair[i]] = marg.get(pair[i], 0) + w
        assert marg == one
    product = {(a, b): one[a] * one[b] for a in one for b in one}
    with pytest.raises(AssertionError, match="differs"):
        assert_exact_law(joint, product, "two rows sharing uniforms")
    assert joint[(1, 1), (1, 1)] == F(1, 4)  # vs 1/16 for independent rows
