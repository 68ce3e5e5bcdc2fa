"""Checks for proofs/08-multi-draft.md: recursive rejection sampling over m draft branches."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction as F

import pytest

from proofs.cases import constant, marginal, random_law, random_table, simplex_grid
from speculate import theory
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    chain_joint_law,
    extend_with_target,
    kernel_law,
    kernel_round_law,
    residual,
    round_law,
    target_joint_law,
)
from speculate.verify import verify_multi, verify_multi_reference, verify_token


def stage_acceptances(p, q, m):
    """alpha_j = sum min(p_(j-1), q) with p_0 = p and p_j = norm((p_(j-1) - q)_+)."""
    out, cur = [], p
    for _ in range(m):
        a = acceptance(cur, q)
        out.append(a)
        if a == 1:
            break
        cur = residual(cur, q)
    return out + [F(1)] * (m - len(out))


@pytest.mark.parametrize(("V", "n", "m"), [(2, 8, 2), (2, 8, 3), (3, 4, 2), (3, 4, 3), (4, 4, 2)])
def test_one_step_rrs_is_exact_with_acceptance_one_minus_prod(V, n, m):
    for p, q in itertools.product(simplex_grid(V, n), repeat=2):
        law = round_law(constant(p), constant(q), V, 1, "token", branches=m)
        assert marginal(law, 0, V) == p
        kept = sum(w for b, w in law.items() if len(b) == 2)  # the first outcome is a draft
        alphas = stage_acceptances(p, q, m)
        prod = F(1)
        for a in alphas:
            prod *= 1 - a
        assert kept == 1 - prod
        assert abs(theory.multi_draft_acceptance([float(a) for a in alphas]) - float(kept)) < 1e-12


@pytest.mark.parametrize("seed", range(10))
def test_multi_draft_chains_are_exact(seed):
    V = 2 + seed % 2
    T, D = random_table(seed, V), random_table(300 + seed, V)
    want = target_joint_law(T, V, 3)
    for m, k in [(2, 1), (2, 2), (3, 1)]:
        assert_exact_law(chain_joint_law(T, D, V, 3, k, "token", branches=m), want,
                         f"multi-draft branches={m} k={k}")
        block = round_law(T, D, V, k, "token", branches=m)
        assert_exact_law(extend_with_target(block, T, V, k + 1), target_joint_law(T, V, k + 1),
                         "criterion (C)")


@pytest.mark.parametrize("kernel", [verify_multi, verify_multi_reference])
def test_kernel_multi(kernel):
    """The code path: verify_multi[_reference] with all K x m + 1 uniforms enumerated equals the
    rule's exact round law (every configuration of branches, lengths 0..k) and chains exactly.
    (The pure-Python reference runs on fewer cases.)"""
    V, k, m = 2, 2, 2
    seeds, lengths = ((0, 1), range(k + 1)) if kernel is verify_multi else ((0,), (k,))
    for seed in seeds:
        T, D = random_table(10 + seed, V), random_table(20 + seed, V)
        for n in lengths:
            assert_exact_law(kernel_round_law(kernel, T, D, V, k, "token", branches=m, length=n),
                             round_law(T, D, V, n, "token", branches=m), f"{kernel.__name__} length {n}")
    T, D = random_table(12, 3), random_table(22, 3)
    m = 3 if kernel is verify_multi else 2
    law = chain_joint_law(T, D, 3, 3, 1, rule=lambda s: kernel_round_law(
        kernel, T, D, 3, 1, "token", branches=m, prefix=s))
    assert_exact_law(law, target_joint_law(T, 3, 3), f"{kernel.__name__} chain, m = {m}")


def one_branch(kernel):
    """A multi-draft kernel run with a single draft branch, behind the token kernel's signature."""

    def run(p, q, drafts, lengths, u_accept, u_next):
        n, y, branch = kernel(p[:, None], q[:, None], drafts[:, None], lengths[:, None],
                              u_accept[:, :, None], u_next)
        assert not branch.any()
        return n, y

    return run


def test_kernel_multi_with_one_branch_is_token():
    V, k = 3, 2
    T, D = random_table(1, V), random_table(2, V)
    assert kernel_round_law(one_branch(verify_multi), T, D, V, k, "token") == kernel_round_law(
        verify_token, T, D, V, k, "token")
    x0 = next(x for x in range(V) if D(())[x])  # a row the draft can propose
    x1 = next(x for x in range(V) if D((x0,))[x])
    p, q, drafts = [T(()), T((x0,)), T((x0, x1))], [D(()), D((x0,))], [x0, x1]
    assert kernel_law(verify_multi, [p], [q], [drafts]) == {
        (*key, 0): w for key, w in kernel_law(verify_token, p, q, drafts).items()}


# ----------------------------------------------------------------------- counterexamples


def one_step_variant(p, q, m, variant):
    """Law of the output of one step with m candidates under a deliberately wrong rule."""
    V = len(p)
    law = [F(0)] * V
    if variant == "no residual update":
        cands = [(xs, F(1)) for xs in itertools.product(range(V), repeat=m)]
    else:  # candidates drawn WITHOUT replacement from q, verified as if i.i.d.
        cands = []
        for xs in itertools.permutations(range(V), m):
            w, left = F(1), F(1)
            for x in xs:
                if not q[x] or not left:
                    w = F(0)
                    break
                w *= q[x] / left
                left -= q[x]
            if w:
                cands.append((xs, w))
    for xs, wc in cands:
        if variant == "no residual update":
            for x in xs:
                wc *= q[x]
        if not wc:
            continue
        cur, reach = p, F(1)
        for x in xs:
            a = min(F(1), cur[x] / q[x])
            law[x] += wc * reach * a
            reach *= 1 - a
            if variant != "no residual update" and reach:
                cur = residual(cur, q)
        if reach:
            final = residual(p, q) if variant == "no residual update" else cur
            for y in range(V):
                law[y] += wc * reach * final[y]
    return law


@pytest.mark.parametrize("variant", ["no residual update", "without replacement"])
def test_naive_multi_draft_variants_are_not_exact(variant):
    """Testing every candidate against the original p, or drawing distinct candidates and
    verifying them as if i.i.d., is biased (on many random pairs; exact only by coincidence)."""
    rng = random.Random(0)
    biased = 0
    for _ in range(300):
        p, q = random_law(rng, 3, 16, zeros=False), random_law(rng, 3, 16, zeros=False)
        biased += one_step_variant(p, q, 2, variant) != p
    assert biased > 0
    p, q = [F(1, 4), F(5, 16), F(7, 16)], [F(3, 16), F(1, 16), F(3, 4)]
    assert one_step_variant(p, q, 2, "without replacement") == [F(27, 64), F(9, 64), F(7, 16)]
    p, q = [F(1, 2), F(1, 4), F(1, 4)], [F(1, 4), F(1, 4), F(1, 2)]
    assert one_step_variant(p, q, 2, "no residual update") == [F(3, 8), F(5, 16), F(5, 16)]
