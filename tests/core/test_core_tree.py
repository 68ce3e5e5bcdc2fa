"""Token-tree verification (speculate/verify/tree.py, proofs/11): exact laws in rational arithmetic,
the kernel against its NumPy twin and against multi-draft, bad input, and the round loop."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import speculate
from proofs.cases import constant, marginal, random_table
from proofs.table_process import as_conditional, random_tables
from speculate import verify as V
from speculate.rounds import Proposal, run
from speculate.testing import assert_categorical_matches, chi2_sample_size
from speculate.testing.exact import (
    assert_exact_law,
    chain_joint_law,
    extend_with_target,
    greedy,
    kernel_tree_round_law,
    round_law,
    target_joint_law,
    tree_round_law,
)
from speculate.testing.strategies import categorical_pairs
from speculate.verify import Tree
from tests.core.test_core_kernels import problems as kernel_problems

SHAPES = {
    "chain": [-1, 0, 1, 2],
    "star": [-1, 0, 0, 0],
    "binary": Tree.from_branching([2, 2]).parent.tolist(),
    "uneven": [-1, 0, 0, 1, 1, 3, 2],
}


# ----------------------------------------------------------------------------- exact laws


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_rule_emits_the_target_joint_law(shape, replacement):
    """Criterion (C) for one round, and the joint law of 3 outcomes over rounds, exactly."""
    par = SHAPES[shape]
    for seed in range(2):
        T, D = random_table(seed, 3), random_table(100 + seed, 3)
        law = tree_round_law(T, D, 3, par, (), replacement)
        depth = max(Tree(np.array(par)).depth)
        want = target_joint_law(T, 3, depth + 1)
        assert_exact_law(extend_with_target(law, T, 3, depth + 1), want, f"{shape} criterion (C)")
        if shape != "binary":  # the chain of rounds enumerates every tree again after every prefix
            chained = chain_joint_law(T, D, 3, 3, 0, rule=lambda s, par=par, T=T, D=D: tree_round_law(
                T, D, 3, par, s, replacement))
            assert_exact_law(chained, target_joint_law(T, 3, 3), f"{shape} chained")


@pytest.mark.parametrize("replacement", [True, False, "greedy"])
@pytest.mark.parametrize("shape", ["star", "uneven", "binary"])
def test_kernel_has_the_rules_exact_law(shape, replacement):
    """The code path: verify_tree over every piece of its uniforms' space, every drafted tree."""
    par = SHAPES[shape]
    T, D = random_table(7, 3 if shape != "binary" else 2), random_table(8, 3 if shape != "binary" else 2)
    Vn = 3 if shape != "binary" else 2
    kernel = V.verify_tree_greedy if replacement == "greedy" else V.verify_tree
    rule = "greedy" if replacement == "greedy" else "token"
    want = tree_round_law(T, D, Vn, par, (), replacement is not False, rule)
    assert_exact_law(kernel_tree_round_law(kernel, T, D, Vn, par, (), replacement), want, f"{shape} kernel")


@pytest.mark.parametrize("replacement", [True, False])
def test_reference_has_the_rules_exact_law(replacement):
    T, D = random_table(3, 3), random_table(4, 3)
    par = SHAPES["uneven"]
    assert_exact_law(kernel_tree_round_law(V.verify_tree_reference, T, D, 3, par, (), replacement),
                     tree_round_law(T, D, 3, par, (), replacement), "reference")


def test_greedy_tree_is_greedy_decoding():
    for seed in range(3):
        T, D = random_table(seed, 3), random_table(50 + seed, 3)
        for par in (SHAPES["uneven"], SHAPES["star"]):
            law = tree_round_law(T, D, 3, par, rule="greedy")
            assert_exact_law(extend_with_target(law, greedy(T), 3, 4), target_joint_law(greedy(T), 3, 4))


def test_multi_draft_is_the_tree_with_branching_at_the_root():
    """Same exact law as round_law(branches=m) (recursive rejection over draft branches)."""
    for seed in range(4):
        T, D = random_table(seed, 3), random_table(200 + seed, 3)
        for m, k in [(2, 1), (2, 2), (3, 1)]:
            assert tree_round_law(T, D, 3, Tree.chains(m, k).parent) == round_law(T, D, 3, k, branches=m)


def test_without_replacement_drafts_verified_as_iid_are_biased():
    """The naive variant: siblings drawn without replacement, verified as if i.i.d."""
    biased = 0
    for seed in range(10):
        T, D = random_table(seed, 3, zeros=False), random_table(50 + seed, 3, zeros=False)
        law = tree_round_law(T, D, 3, [-1, 0, 0], (), False, verify_replacement=True)
        biased += extend_with_target(law, T, 3, 2) != target_joint_law(T, 3, 2)
    assert biased >= 1
    p, q = [F(1, 4), F(5, 16), F(7, 16)], [F(3, 16), F(1, 16), F(3, 4)]  # proofs/08's pair
    law = tree_round_law(constant(p), constant(q), 3, [-1, 0, 0], (), False, verify_replacement=True)
    assert marginal(extend_with_target(law, constant(p), 3, 1), 0, 3) == [F(27, 64), F(9, 64), F(7, 16)]
    law = tree_round_law(constant(p), constant(q), 3, [-1, 0, 0], (), False)  # the right rule
    assert marginal(extend_with_target(law, constant(p), 3, 1), 0, 3) == p


# ----------------------------------------------------------------------------- kernel vs twin


@hs.composite
def tree_problems(draw):
    """Random trees (one shape per row, padded with a valid mask), random pairs of every kind."""
    R = draw(hs.integers(1, 5))
    N = draw(hs.integers(0, 7))
    Vn = draw(hs.sampled_from([1, 2, 3, 7, 300]))
    dtype = draw(hs.sampled_from([np.float32, np.float64]))
    seed = draw(hs.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    parent = np.full((R, N + 1), -1, np.int64)
    for i in range(1, N + 1):
        parent[:, i] = rng.integers(0, i, R)
    valid = np.ones((R, N + 1), bool)
    for i in range(1, N + 1):
        valid[:, i] = valid[np.arange(R), parent[:, i]] & (rng.random(R) < 0.85)
    pairs = [draw(categorical_pairs(min_outcomes=Vn, max_outcomes=Vn, dtype=dtype)) for _ in range(R * (N + 1))]
    p = np.stack([a for a, _ in pairs]).reshape(R, N + 1, Vn)
    q = np.stack([b for _, b in pairs]).reshape(R, N + 1, Vn)
    replacement = draw(hs.booleans())
    tokens = np.zeros((R, N + 1), np.int64)
    for r in range(R):
        for i in range(1, N + 1):
            if not valid[r, i]:
                continue
            w = q[r, parent[r, i]].astype(np.float64)
            if not replacement:
                sib = [tokens[r, c] for c in range(1, i) if valid[r, c] and parent[r, c] == parent[r, i]]
                w[sib] = 0.0
            if w.sum() <= 0:
                valid[r, i] = False
                valid[r, i + 1:] &= False  # keep it simple: drop the rest of this row's tree
                break
            tokens[r, i] = rng.choice(Vn, p=w / w.sum())
    special = draw(hs.sampled_from(["random", "zeros", "near_one"]))
    u = {"random": rng.random((R, N + 1)), "zeros": np.zeros((R, N + 1)),
         "near_one": np.full((R, N + 1), 1 - 2**-53)}[special]
    u_next = rng.random(R) if special == "random" else np.full(R, 1 - 2**-53 if special == "near_one" else 0.0)
    return p, q, tokens, parent, valid, u, u_next, replacement


def _last(n, path):
    """The path's last node per row (0, the root, when nothing was accepted)."""
    return np.concatenate([np.zeros((len(n), 1), np.int64), path], axis=1)[np.arange(len(n)), n]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@settings(deadline=None)
@given(tree_problems())
def test_tree_kernel_equals_reference(prob):
    p, q, tokens, parent, valid, u, un, repl = prob
    want = V.verify_tree_reference(p, q, tokens, parent, valid, u, un, replacement=repl, validate=False)
    for par in (False, True):
        _same(V.verify_tree(p, q, tokens, parent, valid, u, un, replacement=repl, validate=False, parallel=par), want)
    n, nxt, path = want
    R = len(n)
    assert np.all((nxt >= 0) & (nxt < p.shape[-1]))
    last = _last(n, path)
    assert np.all(p[np.arange(R), last, nxt] > 0)  # the next outcome has target mass at the path's end
    for r in range(R):  # the path is a root-to-node path of valid nodes, -1 after it
        v = 0
        for d in range(n[r]):
            assert valid[r, path[r, d]] and parent[r, path[r, d]] == v
            v = path[r, d]
        assert np.all(path[r, n[r]:] == -1)
    _same(V.verify_tree_greedy(p, tokens, parent, valid, validate=False),
          V.verify_tree_greedy_reference(p, tokens, parent, valid, validate=False))


def multi_problems():
    return hs.integers(1, 3).flatmap(lambda m: kernel_problems(m=m))


def _as_tree(p, q, d, L):
    """Multi-draft arrays [B, m, ...] laid out as the tree Tree.chains(m, K)."""
    B, m, K1, Vn = p.shape
    K = K1 - 1
    N1 = 1 + m * K
    P, Q = np.zeros((B, N1, Vn), p.dtype), np.zeros((B, N1, Vn), q.dtype)
    tokens, valid = np.zeros((B, N1), np.int64), np.ones((B, N1), bool)
    P[:, 0] = p[:, 0, 0]
    if K:
        Q[:, 0] = q[:, 0, 0]
    for j, i in itertools.product(range(m), range(K)):
        node = 1 + j * K + i
        tokens[:, node] = d[:, j, i]
        P[:, node] = p[:, j, i + 1]
        if i + 1 < K:
            Q[:, node] = q[:, j, i + 1]
        valid[:, node] = L[:, j] > i
    return P, Q, tokens, valid


@settings(deadline=None)
@given(multi_problems())
def test_multi_draft_kernel_is_the_tree_kernel_bit_for_bit(prob):
    """verify_tree on Tree.chains(m, K) with the uniforms laid out node by node gives verify_multi's
    outcomes (the branches share the root's p and q rows, as they share its context)."""
    p, q, d, L, u, un = prob
    if p.ndim == 3:  # m = 1
        p, q, d, L, u = p[:, None], q[:, None], d[:, None], L[:, None], u[:, :, None]
    B, m, K1, _ = p.shape
    K = K1 - 1
    n, nxt, branch = V.verify_multi(p, q, d, L, u, un)
    P, Q, tokens, valid = _as_tree(p, q, d, L)
    ut = np.zeros((B, 1 + m * K))
    for j, i in itertools.product(range(m), range(K)):
        ut[:, 1 + j * K + i] = u[:, i, j]
    tn, tnxt, path = V.verify_tree(P, Q, tokens, Tree.chains(m, K).parent, valid, ut, un, validate=False)
    np.testing.assert_array_equal(tn, n)
    np.testing.assert_array_equal(tnxt, nxt)
    np.testing.assert_array_equal(np.where(tn > 0, (_last(tn, path) - 1) // max(K, 1), 0), branch)


# ----------------------------------------------------------------------------- bad input


def _ok(R=1, N1=3, Vn=3):
    p = np.full((R, N1, Vn), 1 / Vn)
    return p, p.copy(), np.ones((R, N1), np.int64), np.array([-1, 0, 0][:N1] + list(range(1, N1 - 2))), None, \
        np.full((R, N1), 0.5), np.full(R, 0.5)


@pytest.mark.parametrize("fn", [V.verify_tree, V.verify_tree_reference])
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"parent": [-1, 0, 2]}, ValueError, r"parent\[2\] = 2.*0 <= parent\[i\] < i"),
        ({"parent": [-1, 2, 1]}, ValueError, r"parent\[1\] = 2.*no cycles"),
        ({"parent": [-1, 0, -3]}, ValueError, r"parent\[2\] = -3"),
        ({"parent": [0, 0, 0]}, ValueError, r"parent\[0\] must be -1"),
        ({"parent": [-1, 0]}, ValueError, r"parent must have shape"),
        ({"parent": [-1.0, 0.0, 0.0]}, TypeError, r"parent must be integers"),
        ({"tokens": [[0, 1, 3]]}, ValueError, r"node 2: drafted outcome tokens\[0, 2\] = 3 is outside 0..2"),
        ({"tokens": [[0, -1, 1]]}, ValueError, r"node 1: drafted outcome"),
        ({"tokens": [[0, 1]]}, ValueError, r"tokens must have shape"),
        ({"q": np.full((1, 2, 3), 1 / 3)}, ValueError, r"q must have shape"),
        ({"p": np.full((3, 3), 1 / 3)}, ValueError, r"3 axes"),
        ({"p": np.full((1, 3, 3), 0.5)}, ValueError, r"row 0, node 0: p\[0, 0, :\] sums to 1.5"),
        ({"q": np.array([[[0.5, 0.5, 0.5], [1, 0, 0], [1, 0, 0]]])}, ValueError, r"q\[0, 0, :\] sums to 1.5"),
        ({"q": np.array([[[1.0, 0, 0], [1, 0, 0], [1, 0, 0]]])}, ValueError, r"row 0, node 1: .*q = 0"),
        ({"p": np.array([[[np.nan, 0.5, 0.5]] * 3])}, ValueError, r"NaN"),
        ({"valid": [[True, False, True]], "parent": [-1, 0, 1]}, ValueError, r"node 2 is valid but its parent 1"),
        ({"valid": [[False, True, True]]}, ValueError, r"root"),
        ({"valid": [[1.5, 1, 1]]}, TypeError, r"valid must be booleans"),
        ({"u_accept": np.ones((1, 3))}, ValueError, r"\[0, 1\)"),
        ({"u_next": np.zeros(2)}, ValueError, r"u_next must have shape"),
    ],
)
def test_bad_input_is_refused_before_any_work(fn, change, error, match):
    p, q, tokens, parent, valid, u, un = _ok()
    args = {"p": p, "q": q, "tokens": tokens, "parent": parent, "valid": valid, "u_accept": u, "u_next": un}
    args.update({k: np.asarray(v) if isinstance(v, list) else v for k, v in change.items()})
    with pytest.raises(error, match=match):
        fn(**args)


def test_duplicate_siblings_without_replacement_are_an_error():
    p, q, tokens, parent, valid, _, un = _ok()
    p[0, 0] = [1.0, 0.0, 0.0]  # node 1 (outcome 1) is rejected, then node 2 repeats it
    for fn in (V.verify_tree, V.verify_tree_reference):
        with pytest.raises(ValueError, match=r"row 0, node 2: a child repeats the outcome of an earlier sibling"):
            fn(p, q, tokens, parent, valid, np.full((1, 3), 0.99), un, replacement=False)
        fn(p, q, tokens, parent, valid, np.full((1, 3), 0.99), un)  # i.i.d. siblings may repeat


def test_padding_nodes_are_never_read():
    """Invalid nodes may hold anything: out-of-range tokens, NaN rows, a garbage parent."""
    p, q, tokens, _, _, u, un = _ok(R=2, N1=4)
    parent = np.array([[-1, 0, 1, 0], [-1, 0, 1, 99]])
    valid = np.array([[True, True, True, True], [True, True, True, False]])
    tokens[1, 3] = 10**6
    p[1, 3] = np.nan
    want = V.verify_tree_reference(p, q, tokens, parent, valid, u, un)
    _same(V.verify_tree(p, q, tokens, parent, valid, u, un), want)


# ----------------------------------------------------------------------------- the round loop


class TreeTables:
    """An order-2 table model drafting a token tree per row (the Process protocol, vectorised)."""

    def __init__(self, target, draft, B, tree):
        self.P, self.Q, self.V = target, draft, target.shape[-1]
        self.ctx = np.full((B, 2), self.V, np.int64)
        self.tree = tree

    def propose(self, rows, k, branches, need, rng):
        par = np.asarray(self.tree.parent)
        R, N1 = len(rows), len(par)
        node_ctx = np.empty((R, N1, 2), np.int64)
        node_ctx[:, 0] = self.ctx[rows]
        tokens = np.zeros((R, N1), np.int64)
        valid = np.ones((R, N1), bool)
        for i in range(1, N1):
            a = par[i]
            w = self.Q[node_ctx[:, a, 0], node_ctx[:, a, 1]].copy()  # [R, V]
            if not self.tree.replacement:
                for c in range(1, i):
                    if par[c] == a:
                        w[np.arange(R)[valid[:, c]], tokens[valid[:, c], c]] = 0.0
            valid[:, i] = valid[:, a] & (w.sum(-1) > 0)
            cdf = np.cumsum(w, -1)
            x = (cdf <= rng.random((R, 1)) * cdf[:, -1:]).sum(-1)
            tokens[:, i] = np.where(valid[:, i], np.minimum(x, self.V - 1), 0)
            node_ctx[:, i] = np.stack([node_ctx[:, a, 1], tokens[:, i]], -1)
        q = self.Q[node_ctx[..., 0], node_ctx[..., 1]]
        return Proposal(tokens, speculate.Categorical(probs=q, validate=False), valid, node_ctx, tree=self.tree)

    def score(self, rows, proposal):
        c = proposal.context
        return speculate.Categorical(probs=self.P[c[..., 0], c[..., 1]], validate=False)

    def commit(self, rows, proposal, verdict):
        n = verdict.n_accepted + 1
        for r, e, c in zip(rows, verdict.outcomes.tolist(), n.tolist(), strict=True):
            for x in e[:c]:
                self.ctx[r] = (self.ctx[r, 1], x)
        return n, None


def test_round_loop_runs_trees_and_counts_them():
    P, Q = random_tables(0, 3)
    tree = Tree.from_branching([2, 2])
    res = run(TreeTables(P, Q, 4, tree), 4, 9, rng=0)
    assert [len(s) for s in res.samples] == [9] * 4
    s = res.stats
    assert s.routes == {"tree": s.rounds}
    assert len(s.tree_paths) == s.rounds and s.tree_node_accepted[0] == s.row_rounds
    assert sum(s.accepted_per_position) == s.row_rounds  # the accepted-depth histogram
    assert s.accepted == sum(len(p) for rnd in s.tree_paths for p in rnd)
    assert "tree-node acceptance" in s.summary()
    merged = s + s
    assert merged.tree_node_accepted.tolist() == (2 * s.tree_node_accepted).tolist()
    greedy_res = run(TreeTables(P, Q, 2, tree), 2, 6, verify="greedy", rng=0)
    assert greedy_res.stats.routes == {"tree_greedy": greedy_res.stats.rounds}
    with pytest.raises(ValueError, match="branches=1"):
        run(TreeTables(P, Q, 2, tree), 2, 6, branches=2, rng=0)
    with pytest.raises(ValueError, match="verify='token'"):
        run(TreeTables(P, Q, 2, tree), 2, 6, verify="block", rng=0)


def _three_outcome_law(P, Q, tree, B, seed):
    res = run(TreeTables(P, Q, B, tree), B, 3, rng=seed)
    T = as_conditional(P)
    exact = target_joint_law(T, P.shape[-1], 3)
    keys = sorted(exact)
    index = {k: i for i, k in enumerate(keys)}
    samples = [index[tuple(s)] for s in res.samples]
    return samples, np.array([float(exact[k]) for k in keys])


@pytest.mark.parametrize("replacement", [True, False])
def test_round_loop_with_trees_samples_the_target(replacement):
    """Statistical: the first 3 outcomes (27 cells) of chi2_sample_size(0.02, 27) = 58222 rows
    through run() with a tree of 3 x 2 candidates: at level 1e-6 a total-variation deviation of
    0.02 is caught with probability >= 0.99 (the slow variant: 0.01)."""
    P, Q = random_tables(3, 3)
    samples, probs = _three_outcome_law(P, Q, Tree(Tree.from_branching([3, 2]).parent, replacement),
                                        chi2_sample_size(0.02, 27), 1)
    assert_categorical_matches(samples, probs, label=f"tree loop replacement={replacement}, TV 0.02")


@pytest.mark.slow
@pytest.mark.parametrize("replacement", [True, False])
def test_round_loop_with_trees_samples_the_target_at_full_power(replacement):
    P, Q = random_tables(4, 3)
    samples, probs = _three_outcome_law(P, Q, Tree(Tree.from_branching([2, 2]).parent, replacement),
                                        chi2_sample_size(0.01, 27), 2)
    assert_categorical_matches(samples, probs, label=f"tree loop replacement={replacement}, TV 0.01")
