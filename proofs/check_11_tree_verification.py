"""Checks for proofs/11-tree-verification.md: token trees, children i.i.d. or without replacement."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

from proofs.cases import constant, marginal, random_table, simplex_grid
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    chain_joint_law,
    extend_with_target,
    greedy,
    kernel_round_law,
    kernel_tree_round_law,
    residual,
    round_law,
    target_joint_law,
    tree_drafts,
    tree_round_law,
    tree_walk,
)
from speculate.verify import Tree, verify_multi, verify_tree, verify_tree_greedy, verify_tree_reference

SHAPES = {
    "chain": [-1, 0, 1, 2],  # token-wise verification of 3 drafts
    "star": [-1, 0, 0, 0],  # 3 candidates for one position
    "binary": Tree.from_branching([2, 2]).parent.tolist(),  # binary, depth 2
    "uneven": [-1, 0, 0, 1, 1, 3, 2],  # depths 1..3, branching 2, 2, 1, 1
}


def one_position(p, q, m, replacement):
    """Law of the first emitted outcome with m candidates from the root (a star)."""
    law = tree_round_law(constant(p), constant(q), len(p), [-1] + [0] * m, (), replacement)
    return marginal(law, 0, len(p)), sum(w for b, w in law.items() if len(b) == 2)


@pytest.mark.parametrize(("V", "n", "m"), [(2, 8, 2), (3, 4, 2), (3, 4, 3), (4, 2, 3)])
def test_one_position_is_exact_both_ways(V, n, m):
    """Statement 1 exhaustively: the output has law p with i.i.d. and with distinct candidates;
    i.i.d. candidates keep one with probability 1 - prod(1 - alpha_j) (Theorem 8)."""
    for p, q in itertools.product(simplex_grid(V, n), repeat=2):
        law, kept = one_position(p, q, m, True)
        assert law == p
        prod, cur = F(1), p
        for _ in range(m):
            a = acceptance(cur, q)
            prod *= 1 - a
            if a == 1:
                break
            cur = residual(cur, q)
        assert kept == 1 - prod
        law, _ = one_position(p, q, m, False)
        assert law == p


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_rounds_are_exact(shape, replacement):
    """Statement 2: criterion (C) for one round on random context-dependent tables with zeros
    (so trees without replacement run out of outcomes and drop nodes), and the joint law of 3
    outcomes over successive rounds."""
    par = SHAPES[shape]
    depth = max(Tree(np.array(par)).depth)
    for seed in range(4):
        V = 2 + seed % 2
        T, D = random_table(seed, V), random_table(300 + seed, V)
        law = tree_round_law(T, D, V, par, (), replacement)
        assert_exact_law(extend_with_target(law, T, V, depth + 1), target_joint_law(T, V, depth + 1),
                         f"{shape} criterion (C)")
        if shape != "binary" or V == 2:
            chained = chain_joint_law(T, D, V, 3, 0, rule=lambda s, T=T, D=D, V=V: tree_round_law(
                T, D, V, par, s, replacement))
            assert_exact_law(chained, target_joint_law(T, V, 3), f"{shape} chain of rounds")


def test_without_replacement_drops_children_it_cannot_draw():
    """A node whose q has fewer outcomes than it has children drafts the ones it can."""
    D = constant([F(1, 2), F(1, 2), F(0)])
    trees = tree_drafts(D, 3, [-1, 0, 0, 0], replacement=False)
    assert {t[1] for t in trees} == {(True, True, True, False)}
    assert sum(t[2] for t in trees) == 1


@pytest.mark.parametrize("seed", range(4))
def test_multi_draft_is_the_tree_with_branching_at_the_root(seed):
    """Statement 3: Tree.chains(m, k) verified by the tree rule has multi-draft's law (Theorem 8),
    through the rules and through the kernels."""
    T, D = random_table(seed, 3), random_table(400 + seed, 3)
    for m, k in [(2, 1), (2, 2), (3, 1)]:
        assert tree_round_law(T, D, 3, Tree.chains(m, k).parent) == round_law(T, D, 3, k, branches=m)
    if seed < 2:
        T, D = random_table(seed, 2), random_table(400 + seed, 2)
        assert kernel_tree_round_law(verify_tree, T, D, 2, Tree.chains(2, 2).parent) == kernel_round_law(
            verify_multi, T, D, 2, 2, branches=2)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_kernel_is_the_rule(shape, replacement):
    """The code path: verify_tree on every piece of its uniforms' space and every drafted tree has
    the rule's exact law; the NumPy twin on two shapes."""
    V = 2 if shape == "binary" else 3
    T, D = random_table(11, V), random_table(12, V)
    par = SHAPES[shape]
    want = tree_round_law(T, D, V, par, (), replacement)
    assert_exact_law(kernel_tree_round_law(verify_tree, T, D, V, par, (), replacement), want, f"{shape} kernel")
    if shape in ("star", "chain"):
        assert_exact_law(kernel_tree_round_law(verify_tree_reference, T, D, V, par, (), replacement), want,
                         f"{shape} reference")


def test_kernel_chains_exactly():
    T, D = random_table(21, 3), random_table(22, 3)
    par = SHAPES["uneven"]
    law = chain_joint_law(T, D, 3, 3, 0, rule=lambda s: kernel_tree_round_law(verify_tree, T, D, 3, par, s, False))
    assert_exact_law(law, target_joint_law(T, 3, 3), "verify_tree without replacement, chained")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tree_is_greedy_decoding(shape):
    """Statement 4: the greedy walk emits the target's greedy decoding, through the kernel too."""
    par = SHAPES[shape]
    for seed in range(3):
        V = 2 if shape == "binary" else 3
        T, D = random_table(seed, V), random_table(60 + seed, V)
        G = greedy(T)
        law = tree_round_law(T, D, V, par, rule="greedy")
        depth = max(Tree(np.array(par)).depth)
        assert_exact_law(extend_with_target(law, G, V, depth + 1), target_joint_law(G, V, depth + 1))
        assert_exact_law(kernel_tree_round_law(verify_tree_greedy, T, D, V, par, (), "greedy"), law)


def test_distinct_children_verified_as_iid_are_biased():
    """Statement 5: drawing siblings without replacement but verifying them against q (not the
    renormalised q) is biased, with Theorem 8's exact numbers; the right rule is exact."""
    p, q = [F(1, 4), F(5, 16), F(7, 16)], [F(3, 16), F(1, 16), F(3, 4)]
    naive = tree_round_law(constant(p), constant(q), 3, [-1, 0, 0], (), False, verify_replacement=True)
    assert marginal(naive, 0, 3) == [F(27, 64), F(9, 64), F(7, 16)]
    assert marginal(tree_round_law(constant(p), constant(q), 3, [-1, 0, 0], (), False), 0, 3) == p


def _adaptive_round_law(T, D, V, replacement, drop_seen=False):
    """One round with a shape chosen while drafting (the text domain's DynamicTree in small): the
    root gets 2 children; then the level's 2 remaining nodes both go under the child whose
    outcome the draft found more likely (a choice that reads BOTH siblings' outcomes). With
    ``drop_seen`` the second child is instead dropped after its own outcome is seen (when it is
    outcome 0): the violation the assumption forbids."""
    law: dict = {}
    q = D(())
    for toks1, valid1, _ in tree_drafts(D, V, [-1, 0, 0], (), replacement):
        best = 1 if not valid1[2] or q[toks1[1]] >= q[toks1[2]] else 2
        par = [-1, 0, 0, best, best]
        for toks, valid, w in tree_drafts(D, V, par, (), replacement):
            if toks[:3] != toks1 or valid[:3] != valid1:
                continue
            valid = list(valid)
            if drop_seen and toks[2] == 0:
                valid[2] = False
                valid[3:] = [v and par[i] != 2 for i, v in enumerate(valid[3:], start=3)]
            for (n, nxt, last), pw in tree_walk(T, D, V, par, toks, valid, (), replacement).items():
                path, j = [], last
                while j > 0:
                    path.append(toks[j])
                    j = par[j]
                block = (*path[::-1], nxt)
                assert len(block) == n + 1
                law[block] = law.get(block, 0) + w * pw
    return law


@pytest.mark.parametrize("replacement", [True, False])
def test_shapes_chosen_while_drafting_are_exact(replacement):
    """The 'Sequential drafting' assumption allows a node's children count to depend on its
    siblings' outcomes (decided before the children are drawn): criterion (C) holds exactly; a
    node dropped after its own outcome is seen breaks it."""
    p, q = [F(1, 4), F(5, 16), F(7, 16)], [F(3, 16), F(1, 16), F(3, 4)]
    cases = [(constant(p), constant(q))] + [(random_table(s, 3), random_table(500 + s, 3)) for s in range(4)]
    for T, D in cases:
        law = _adaptive_round_law(T, D, 3, replacement)
        assert sum(law.values()) == 1
        assert_exact_law(extend_with_target(law, T, 3, 3), target_joint_law(T, 3, 3), "adaptive shape (C)")
    T, D = cases[0]
    bad = _adaptive_round_law(T, D, 3, replacement, drop_seen=True)
    # the first token's law moves off p = (16/64, 20/64, 7/16): by 3/64 with i.i.d. children, 1/64 without
    want = [F(13, 64), F(23, 64), F(7, 16)] if replacement else [F(15, 64), F(21, 64), F(7, 16)]
    assert marginal(bad, 0, 3) == want
