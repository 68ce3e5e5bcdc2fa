"""Checks for proofs/06-expected-outcomes.md: outcomes per round, speedup, optimal lookahead."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import pytest
import sympy as sp

from proofs.cases import constant, random_table
from speculate import theory
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    expected_outcomes,
    round_law,
    target_joint_law,
)

ALPHAS = [F(0), F(1, 5), F(1, 2), F(3, 5), F(7, 10), F(4, 5), F(9, 10), F(1)]


def E_iid(a, k):
    return sum(a**i for i in range(k + 1))


def S(a, k, c):
    return E_iid(a, k) / (k * c + 1)


def test_symbolic_identities():
    a, c = sp.symbols("alpha c", positive=True)
    k = sp.symbols("k", integer=True, nonnegative=True)
    i = sp.symbols("i", integer=True, nonnegative=True)
    E = sp.summation(a**i, (i, 0, k))  # sympy: Piecewise((k + 1, a == 1), ((1 - a^(k+1))/(1 - a)))
    assert sp.simplify(E.args[1][0] - (1 - a ** (k + 1)) / (1 - a)) == 0
    # the increment of g(k) = a^(k+1) (k c + 1) - c E_k factors as claimed, for symbolic k
    Ek = (1 - a ** (k + 1)) / (1 - a)
    g = a ** (k + 1) * (k * c + 1) - c * Ek
    g1 = g.subs(k, k + 1)
    assert sp.simplify(g1 - g - a ** (k + 1) * (a - 1) * ((k + 1) * c + 1)) == 0
    # S(k+1) - S(k) = g(k) / ((k c + 1)((k+1) c + 1)): the sign of the increment is that of g(k)
    Sk = Ek / (k * c + 1)
    assert sp.simplify((Sk.subs(k, k + 1) - Sk) * (k * c + 1) * ((k + 1) * c + 1) - g) == 0
    for kk in range(0, 6):  # the truncated geometric pmf of N sums to 1 and has mean E_k
        pmf = [a**n * (1 - a) for n in range(kk)] + [a**kk]
        assert sp.expand(sum(pmf) - 1) == 0
        mean = sum((n + 1) * w for n, w in enumerate(pmf))
        assert sp.cancel(mean - (1 - a ** (kk + 1)) / (1 - a)) == 0


def pair_with_acceptance(a: F):
    """Context-free (p, q) on 2 outcomes with sum min(p, q) = a."""
    return [F(1), F(0)], [a, 1 - a]


@pytest.mark.parametrize("a", ALPHAS)
def test_iid_acceptance_outcomes_per_round(a):
    """With the same acceptance alpha at every context, one round's law of N (accepted drafts)
    is the truncated geometric law and E[N + 1] = (1 - a^(k+1)) / (1 - a), exactly."""
    p, q = pair_with_acceptance(a)
    assert acceptance(p, q) == a
    for k in range(0, 7):
        law = round_law(constant(p), constant(q), 2, k, "token")
        N = {}
        for block, w in law.items():
            N[len(block) - 1] = N.get(len(block) - 1, 0) + w
        want = {n: a**n * (1 - a) for n in range(k)} | {k: a**k}
        assert {n: w for n, w in N.items() if w} == {n: w for n, w in want.items() if w}
        assert expected_outcomes(constant(p), constant(q), 2, k) == E_iid(a, k)
        pmf = theory.accepted_length_pmf(float(a), k)
        assert all(abs(pmf[n] - float(want.get(n, 0))) < 1e-12 for n in range(k + 1))
        assert abs(theory.expected_tokens(float(a), k) - float(E_iid(a, k))) < 1e-12


def best_k(a, c, k_max):
    vals = [S(a, k, c) for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (vals[k], -k))


def test_speedup_is_unimodal_and_the_optimal_k_rule():
    """For every alpha, c on a grid: S(k) increases while g(k) > 0 and decreases after (exact),
    the optimum is the first k with g(k) <= 0, speculation pays iff alpha > c, and
    speculate.theory.optimal_lookahead agrees."""
    cs = [F(0), F(1, 100), F(1, 20), F(1, 10), F(1, 4), F(1, 2), F(9, 10)]
    for a, c in itertools.product(ALPHAS[1:-1], cs):
        K = 40
        vals = [S(a, k, c) for k in range(K + 1)]
        g = [a ** (k + 1) * (k * c + 1) - c * E_iid(a, k) for k in range(K)]
        for k in range(K):
            assert (vals[k + 1] > vals[k]) == (g[k] > 0) and (vals[k + 1] == vals[k]) == (g[k] == 0)
            if k:
                assert g[k] < g[k - 1]
        first = next((k for k in range(K) if g[k] <= 0), K)
        assert best_k(a, c, K) == first
        assert (max(vals) > 1) == (a > c)
        # the library's float search: its choice attains the maximum up to its 1e-12 tolerance
        # (for c = 0 the speedup increases forever and it stops where the gain is negligible)
        kt = theory.optimal_lookahead(float(a), float(c), K)
        assert float(vals[kt]) >= float(max(vals)) * (1 - 1e-11)
        if c > 0 and all(abs(v - vals[first]) > vals[first] * F(1, 10**9)
                         for j, v in enumerate(vals) if j != first):
            assert kt == first
        assert abs(theory.speedup(float(a), 3, float(c)) - float(S(a, 3, c))) < 1e-12


def test_leviathan_table_1():
    """Leviathan et al. Table 1 (c = 0): (alpha, k) -> speedup."""
    table = {(0.6, 2): 1.96, (0.7, 3): 2.53, (0.8, 2): 2.44, (0.8, 5): 3.69, (0.9, 2): 2.71,
             (0.9, 10): 6.86}
    for (a, k), s in table.items():
        assert round(theory.speedup(a, k, 0.0), 2) == s
        assert round(float(S(F(a).limit_denominator(10), k, F(0))), 2) == s


@pytest.mark.parametrize("seed", range(10))
def test_position_dependent_acceptance(seed):
    """Context-dependent tables: E[N + 1] = sum_i A_i with A_i = P(N >= i) = E[prod_j min(1, p/q)],
    S(k) is still unimodal (g(k+1) - g(k) = (A_(k+2) - A_(k+1))((k+1)c + 1) <= 0), and the
    i.i.d. formula with the average acceptance is in general wrong."""
    V, K = 3, 4
    T, D = random_table(seed, V, zeros=False), random_table(50 + seed, V, zeros=False)
    A = [F(1)]
    level = [((), F(1))]
    for _ in range(K):
        new = []
        for s, w in level:
            p, q = T(s), D(s)
            for x in range(V):
                if q[x]:
                    new.append(((*s, x), w * min(q[x], p[x])))
        level = new
        A.append(sum(w for _, w in level))
    for k in range(K + 1):
        assert expected_outcomes(T, D, V, k) == sum(A[: k + 1])
    for c in [F(1, 50), F(1, 10), F(1, 3)]:
        Ek = [sum(A[: k + 1]) for k in range(K + 1)]
        vals = [Ek[k] / (k * c + 1) for k in range(K + 1)]
        g = [A[k + 1] * (k * c + 1) - c * Ek[k] for k in range(K)]
        for k in range(K):
            assert (vals[k + 1] > vals[k]) == (g[k] > 0)
            if k:
                assert g[k] - g[k - 1] == (A[k + 1] - A[k]) * (k * c + 1) <= 0


def test_jensen_when_acceptance_varies_between_rounds():
    """If a round's acceptance is a random beta (constant within the round), E[N + 1] =
    E[sum beta^i] >= sum E[beta]^i: the i.i.d. formula with the mean acceptance underestimates."""
    for b1, b2 in itertools.combinations([F(1, 5), F(1, 2), F(4, 5), F(1)], 2):
        for k in range(1, 6):
            mixed = (E_iid(b1, k) + E_iid(b2, k)) / 2
            assert mixed >= E_iid((b1 + b2) / 2, k)
            assert (mixed > E_iid((b1 + b2) / 2, k)) == (k >= 2)


def test_adaptive_lookahead_from_past_rounds_is_exact():
    """k chosen from the past rounds' outcomes (here: 1 + the number of drafts kept in the
    previous round, as an acceptance-driven controller) keeps the chain exact."""
    V, L = 3, 5
    for seed in range(4):
        T, D = random_table(seed, V), random_table(90 + seed, V)
        # state = (committed outcomes, length of the last block); k = last length (1..)
        frontier = {((), 1): F(1)}
        done: dict = {}
        while frontier:
            new: dict = {}
            for (seq, last), w in frontier.items():
                if len(seq) >= L:
                    done[seq[:L]] = done.get(seq[:L], 0) + w
                    continue
                for block, pb in round_law(T, D, V, min(last, 3), "token", prefix=seq).items():
                    key = ((*seq, *block), len(block))
                    new[key] = new.get(key, 0) + w * pb
            frontier = new
        assert_exact_law(done, target_joint_law(T, V, L), "adaptive lookahead")
        assert len({len(b) for b in round_law(T, D, V, 3, prefix=()).keys()}) > 1  # k varies
