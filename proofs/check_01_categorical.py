"""Checks for proofs/01-categorical.md: one-step speculative sampling of categorical laws."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
import sympy as sp
from scipy.optimize import linprog

import speculate
from proofs.cases import constant, marginal, simplex_grid
from proofs.stats import binomial_test, chi2_gof, min_samples
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    kernel_laws,
    kernel_round_law,
    residual,
    round_law,
    speculative_law,
    total_variation,
)
from speculate.verify import verify_token, verify_token_reference

GRIDS = [(2, 12), (3, 6), (4, 4)]  # (V, n): every law whose probabilities lie in (1/n)Z
DYADIC = [(2, 8), (3, 4), (4, 4)]  # the same, exactly representable in float32 and float64


def all_pairs(V: int, n: int):
    g = simplex_grid(V, n)
    return list(itertools.product(g, g))


def coupling(p, q):
    """Joint law J[x][y] of (draft X, output Y) of the algorithm of Theorem 1."""
    V = len(p)
    J = [[F(0)] * V for _ in range(V)]
    r = residual(p, q) if acceptance(p, q) < 1 else None
    for x in range(V):
        if q[x]:
            keep = min(F(1), p[x] / q[x])
            J[x][x] += q[x] * keep
            for y in range(V):
                if keep < 1:
                    J[x][y] += q[x] * (1 - keep) * r[y]
    return J


@pytest.mark.parametrize(("V", "n"), GRIDS)
def test_output_law_is_p_and_acceptance_is_one_minus_tv(V, n):
    pairs = all_pairs(V, n)
    for p, q in pairs:
        assert_exact_law(speculative_law(p, q), p, f"speculative_law({p}, {q})")
        tv = sum(abs(a - b) for a, b in zip(p, q, strict=True)) / 2
        assert acceptance(p, q) == 1 - tv == 1 - total_variation(p, q)
    assert len(pairs) == len(simplex_grid(V, n)) ** 2


@pytest.mark.parametrize(("V", "n"), GRIDS)
def test_the_coupling_is_maximal(V, n):
    """(X, Y) has marginals (q, p) and P(X = Y) = sum min(p, q), the largest any coupling has."""
    for p, q in all_pairs(V, n):
        J = coupling(p, q)
        assert [sum(row) for row in J] == q
        assert [sum(J[x][y] for x in range(V)) for y in range(V)] == p
        assert sum(J[x][x] for x in range(V)) == acceptance(p, q)
        # the bound: P(X = Y = y) <= min(P(X = y), P(Y = y)) for EVERY coupling
        assert all(J[y][y] <= min(p[y], q[y]) for y in range(V))


def test_no_coupling_keeps_the_draft_more_often_lp():
    """Linear programming over all couplings of (q, p) (floats, tolerance 1e-9)."""
    pairs = all_pairs(3, 6)[::7]
    for p, q in pairs:
        V = len(p)
        c = -np.eye(V).reshape(-1)  # maximise the diagonal mass
        A = np.concatenate([np.kron(np.eye(V), np.ones(V)), np.kron(np.ones(V), np.eye(V))])
        b = np.array([float(x) for x in q + p])
        res = linprog(c, A_eq=A, b_eq=b, bounds=(0, None), method="highs")
        assert res.status == 0
        assert abs(-res.fun - float(acceptance(p, q))) < 1e-9


def test_symbolic_every_sign_pattern_v3():
    """Sympy: for V = 3 and every sign pattern of p - q the output law simplifies to p."""
    p0, p1, q0, q1 = sp.symbols("p0 p1 q0 q1", positive=True)
    p = [p0, p1, 1 - p0 - p1]
    q = [q0, q1, 1 - q0 - q1]
    for signs in itertools.product((1, -1), repeat=3):
        if len(set(signs)) == 1:
            continue  # p - q sums to 0: not all of one sign unless p == q
        mins = [q[i] if s > 0 else p[i] for i, s in enumerate(signs)]  # p > q where s = +1
        pos = [p[i] - q[i] if s > 0 else 0 for i, s in enumerate(signs)]
        alpha = sum(mins)
        for i in range(3):
            law_i = mins[i] + (1 - alpha) * pos[i] / sum(pos)
            assert sp.simplify(law_i - p[i]) == 0
        assert sp.simplify(1 - alpha - sum(pos)) == 0  # 1 - acceptance = TV


def _kernel_one_step(kernel, V, n, dtype=np.float64):
    """Exact law of Y (the kept draft, or the kernel's next outcome) and of acceptance."""
    cases, meta = [], []
    for p, q in all_pairs(V, n):
        for x in range(V):
            if q[x]:
                cases.append(([p, p], [q], [x]))
                meta.append((tuple(p), tuple(q), x))
    laws = kernel_laws(kernel, cases, "token", dtype)
    out: dict = {}
    for (p, q, x), law in zip(meta, laws, strict=True):
        y_law, acc = out.setdefault((p, q), ([F(0)] * V, [F(0)]))
        for (n_acc, nxt), w in law.items():
            y_law[x if n_acc == 1 else nxt] += q[x] * w
            if n_acc == 1:
                acc[0] += q[x] * w
    return out


@pytest.mark.parametrize(("V", "n"), DYADIC)
@pytest.mark.parametrize("kernel", [verify_token, verify_token_reference])
def test_kernel_one_step_law_is_p(kernel, V, n):
    """The code path: speculate.verify.verify_token[_reference] with enumerated uniforms."""
    for (p, q), (y_law, acc) in _kernel_one_step(kernel, V, n).items():
        assert_exact_law(y_law, list(p), f"{kernel.__name__} output for p={p}, q={q}")
        assert acc[0] == acceptance(list(p), list(q))


def test_kernel_one_step_float32():
    for (p, _q), (y_law, _) in _kernel_one_step(verify_token, 3, 4, np.float32).items():
        assert_exact_law(y_law, list(p), "float32 kernel")


def test_library_one_step_statistical():
    """speculate.speculative_sample on a batched Categorical: chi-square and binomial tests.

    Level 1e-6 each; n = 200 000 catches a deviation of TV >= 0.01 in the output law and of
    0.01 in the acceptance rate with probability >= 0.99.
    """
    p, q = [0.5, 0.25, 0.125, 0.125], [0.125, 0.5, 0.25, 0.125]
    N = 200_000
    assert N >= min_samples(0.01, 4)
    P = speculate.Categorical(probs=np.tile(p, (N, 1)))
    Q = speculate.Categorical(probs=np.tile(q, (N, 1)))
    y, kept = speculate.speculative_sample(P, Q, rng=20240601)
    chi2_gof(np.bincount(y, minlength=4), p, eps=0.01, name="speculative_sample law")
    binomial_test(int(kept.sum()), N, float(acceptance(p, q)), 0.01, "acceptance rate")


# ----------------------------------------------------------------------- counterexamples


def naive_resample_from_p(p, q):
    """On rejection draw from p instead of the residual: law min(p, q) + (1 - alpha) p."""
    a = acceptance(p, q)
    return [min(x, y) + (1 - a) * x for x, y in zip(p, q, strict=True)]


@pytest.mark.parametrize(("V", "n"), GRIDS)
def test_resampling_from_p_is_not_exact(V, n):
    """Biased unless min(p, q) is proportional to p (e.g. p == q); exhaustive over the grid."""
    biased = 0
    for p, q in all_pairs(V, n):
        a = acceptance(p, q)
        exact = naive_resample_from_p(p, q) == p
        assert exact == all(min(x, y) == a * x for x, y in zip(p, q, strict=True))
        biased += not exact
    assert biased > 0
    p, q = [F(1, 2), F(1, 2)], [F(1), F(0)]
    assert naive_resample_from_p(p, q) == [F(3, 4), F(1, 4)]


def test_resampling_from_p_kernel_is_caught():
    """A kernel built from verify_token that resamples from p is caught by kernel_laws."""

    def resample_from_p(p, q, drafts, lengths, u_accept, u_next):
        n, _ = verify_token(p, q, drafts, lengths, u_accept, u_next)
        B, _, V = p.shape
        rows = p[np.arange(B), n][:, None, :]  # [B, 1, V]: the target at the stopping position
        empty = np.zeros((B, 0), np.int64)
        _, y = verify_token(rows, np.zeros((B, 0, V)), empty, np.zeros(B, np.int64),
                            np.zeros((B, 0)), u_next)
        return n, y

    p, q = [F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)]
    law = kernel_round_law(resample_from_p, constant(p), constant(q), V=2, k=1)
    with pytest.raises(AssertionError, match="differs"):
        assert_exact_law(marginal(law, 0, 2), p, "resample-from-p kernel")
    assert marginal(law, 0, 2) == naive_resample_from_p(p, q) == [F(5, 8), F(3, 8)]


def test_greedy_draft_with_sampled_target_transformers_30778():
    """transformers #30778 -> #32867: the assistant drafts greedily (its argmax) but the
    verifier is told its softmax q. q = [.8, .2], p = [.6, .4] gives [.75, .25], not p.
    Verifying against the law the draft was really drawn from (a point mass) is exact."""
    from speculate.testing.exact import greedy

    p, q = [F(3, 5), F(2, 5)], [F(4, 5), F(1, 5)]
    T, D = constant(p), constant(q)
    bug = round_law(T, D, V=2, k=1, proposal=greedy(D))
    assert marginal(bug, 0, 2) == [F(3, 4), F(1, 4)]
    fixed = round_law(T, greedy(D), V=2, k=1)
    assert marginal(fixed, 0, 2) == p
    # the same through the kernel (inputs are the float64 values of .6, .4, .8, .2)
    law = kernel_round_law(verify_token, constant([0.6, 0.4]),
                           constant([F(0.8), 1 - F(0.8)]), V=2, k=1,
                           proposal=constant([1, 0]))
    y = [float(v) for v in marginal(law, 0, 2)]
    assert abs(y[0] - 0.75) < 1e-15 and abs(y[1] - 0.25) < 1e-15
