"""Checks for proofs/07-block-verification.md: block verification is exact and never worse."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
import sympy as sp

from proofs.cases import random_table
from speculate.testing.exact import (
    assert_exact_law,
    block_quantities,
    chain_joint_law,
    expected_outcomes,
    extend_with_target,
    kernel_round_law,
    residual,
    round_law,
    target_joint_law,
)
from speculate.verify import verify_block, verify_block_reference


def drafts_of(D, V, k, prefix=()):
    out = [((), F(1))]
    for _ in range(k):
        out = [((*s, x), w * px) for s, w in out for x, px in enumerate(D(prefix + s)) if px]
    return out


@pytest.mark.parametrize("seed", range(16))
def test_block_is_exact(seed):
    V = 2 + seed % 2
    T, D = random_table(seed, V), random_table(500 + seed, V)
    want = target_joint_law(T, V, 4)
    for k in (1, 2, 3):
        assert_exact_law(chain_joint_law(T, D, V, 4, k, "block"), want, f"block k={k}")
        for prefix in [(), (1,)]:
            block = round_law(T, D, V, k, "block", prefix=prefix)
            assert_exact_law(extend_with_target(block, T, V, k + 1, prefix),
                             target_joint_law(T, V, k + 1, prefix), "criterion (C)")


@pytest.mark.parametrize("seed", range(12))
def test_key_lemma_and_never_worse_than_token(seed):
    """P(tau >= i | X_1..i) = P_i and P(tau = i | X_1..i) = R_i (i < g), exactly; P_i >= the
    token rule's prod_j min(1, p_j/q_j) pointwise; so E[outcomes] block >= token."""
    V, k = 3, 3
    T, D = random_table(seed, V), random_table(700 + seed, V)
    for i in range(1, k):
        for head, _ in drafts_of(D, V, i):
            ge, eq = F(0), F(0)
            for tail, wt in drafts_of(D, V, k - i, head):
                xs = head + tail
                P, h = block_quantities([T(xs[:j]) for j in range(k + 1)],
                                        [D(xs[:j]) for j in range(k)], xs)
                none_after = F(1)
                for j in range(i + 1, k + 1):
                    none_after *= 1 - h[j - 1]
                ge += wt * (1 - none_after * (1 - h[i - 1]))
                eq += wt * h[i - 1] * none_after
            P, _ = block_quantities([T(head[:j]) for j in range(i + 1)] + [T(head)],
                                    [D(head[:j]) for j in range(i)], head)
            R = sum(max(P[i] * a - b, F(0)) for a, b in zip(T(head), D(head), strict=True))
            assert ge == P[i] and eq == R
            token = F(1)
            for j, x in enumerate(head):
                q = D(head[:j])
                token *= min(F(1), T(head[:j])[x] / q[x]) if q[x] else F(0)
            assert P[i] >= token
    for kk in (1, 2, 3):
        assert expected_outcomes(T, D, V, kk, "block") >= expected_outcomes(T, D, V, kk, "token")


def test_block_can_be_strictly_better():
    half = F(1, 2)
    T = lambda s: [half, half] if not s else ([F(1), F(0)] if s[-1] == 1 else [F(0), F(1)])  # noqa: E731
    D = lambda s: [F(1, 4), F(3, 4)] if not s else [half, half]  # noqa: E731
    b, t = expected_outcomes(T, D, 2, 2, "block"), expected_outcomes(T, D, 2, 2, "token")
    assert b > t


def test_symbolic_lemma_step():
    """(1 - h)(1 - P + R) = 1 - P with h = R/(R + 1 - P)."""
    P, R = sp.symbols("P R", positive=True)
    h = R / (R + 1 - P)
    assert sp.simplify((1 - h) * (1 - P + R) - (1 - P)) == 0


@pytest.mark.parametrize("kernel", [verify_block, verify_block_reference])
def test_kernel_block(kernel):
    """The code path: verify_block[_reference] with enumerated uniforms equals the rule's exact
    round law (every draft, lengths 0..k with a decoy past the length) and drives an exact chain."""
    V, k = 3, 3
    for seed in range(3):
        T, D = random_table(30 + seed, V), random_table(60 + seed, V)
        for n in range(k + 1):
            assert_exact_law(kernel_round_law(kernel, T, D, V, k, "block", length=n),
                             round_law(T, D, V, n, "block"), f"{kernel.__name__} length {n}")
        law = chain_joint_law(T, D, V, 3, 2, rule=lambda s, T=T, D=D: kernel_round_law(
            kernel, T, D, V, 2, "block", prefix=s))
        assert_exact_law(law, target_joint_law(T, V, 3), f"{kernel.__name__} chain")


def test_kernel_block_float32():
    V, k = 3, 2
    T, D = random_table(5, V), random_table(6, V)
    law = kernel_round_law(verify_block, T, D, V, k, "block", dtype=np.float32)
    assert_exact_law(law, round_law(T, D, V, k, "block"), "float32 block")


# ----------------------------------------------------------------------- counterexamples


def variant_round_law(T, D, V, k, variant, prefix=()):
    """The block rule with one deliberate change (for the counterexamples)."""
    out: dict = {}
    for xs, w in drafts_of(D, V, k, prefix):
        p_rows = [T(prefix + xs[:i]) for i in range(k + 1)]
        q_rows = [D(prefix + xs[:i]) for i in range(k)]
        P, h = block_quantities(p_rows, q_rows, xs)
        if variant == "h = P":
            h = P[1:]
        for tau in range(k + 1):
            pt = F(1) if tau == 0 else h[tau - 1]
            for j in range(tau + 1, k + 1):
                pt *= 1 - h[j - 1]
            if not pt:
                continue
            if tau == k:
                law = p_rows[k]
            else:
                scale = 1 if variant == "token residual" else P[tau]
                try:
                    law = residual(p_rows[tau], q_rows[tau], scale=scale)
                except ValueError:  # empty residual: fall back to p, as the kernels do
                    law = p_rows[tau]
            for y, py in enumerate(law):
                if py:
                    key = (*xs[:tau], y)
                    out[key] = out.get(key, 0) + w * pt * py
    return out


@pytest.mark.parametrize("variant", ["h = P", "token residual"])
def test_naive_variants_are_not_exact(variant):
    """Stopping at the last i with U_i < P_i (no R_i correction), or drawing the residual
    (p - q)_+ without the factor P_tau, is biased."""
    biased = 0
    for seed in range(8):
        V, k = 3, 2
        T, D = random_table(seed, V), random_table(900 + seed, V)
        law = extend_with_target(variant_round_law(T, D, V, k, variant), T, V, k + 1)
        biased += law != target_joint_law(T, V, k + 1)
        # the unmodified rule, through the same code, is exact
        ok = extend_with_target(variant_round_law(T, D, V, k, "none"), T, V, k + 1)
        assert ok == target_joint_law(T, V, k + 1)
    assert biased >= 3
