"""Drafts on the target (Medusa heads, an EAGLE feature draft), chains and token trees, end to end.

- The tree mask: the target's logits at every node of a tree scored in ONE forward (ragged rows,
  after a committed prefix) equal those of the target run on that node's path alone.
- Greedy equality with the target's own greedy decoding on a ragged, left-padded batch, for both
  drafters, chains and static / dynamic trees, with and without replacement.
- The law of the first tokens at temperature > 0 equals the target's exact law: the chi-square
  test of ``test_text_exactness`` (ALPHA = 1e-6 per test; power 0.99 at a joint TV of FAST_TV =
  0.02). The heads and the feature draft are random (their residual weights perturbed, so that
  their laws depend on the target's features and differ from the target's: acceptance well below
  1, trees with rejections at every depth).
- Bad input: drafts trained for another target, malformed or too deep trees, trees with a draft
  model or on a target that cannot score one: ``ValueError`` before any work.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.drafts.trees import DynamicTree
from speculate.domains.text.models.kv_cache import CachedModel
from speculate.domains.text.request.sampling import SamplingConfig
from speculate.domains.text.training.feature_draft import FeatureDraft
from speculate.domains.text.training.heads import MedusaHeads

from speculate.verify import Tree
from tests.text.test_text_exactness import FAST_TV, PROMPTS, assert_law, rows_needed, sample_rows


def _perturbed(module: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype) / max(1, p.shape[-1]) ** 0.5)
    return module.eval()


def _drafter(kind: str, target) -> torch.nn.Module:
    if kind == "heads":
        return _perturbed(MedusaHeads.for_target(target, n_heads=3), seed=3)
    return _perturbed(FeatureDraft.for_target(target), seed=4)


def test_tree_logits_equal_each_paths_own(make_llama):
    target = make_llama(eos=None)
    lm = CachedModel(target)
    lm.reset(2, 24)
    prefix = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 9]])
    lm.forward(prefix, np.array([0, 0]), valid=np.array([4, 3]))
    lm.keep(np.array([4, 3]))  # ragged: row 1 keeps 3 tokens
    parent = np.array([-1, 0, 0, 1, 1, 2, 3])  # root (the last committed token), 2 children, ...
    depth = Tree(parent).depth
    toks = torch.tensor([[10, 11, 2, 3, 4, 5, 6], [9, 1, 2, 3, 1, 2, 8]])
    start = np.array([4, 3])
    see = np.zeros((2, 7, 7), bool)
    for i in range(7):
        j = i
        while j >= 0:
            see[:, i, j] = True
            j = parent[j]
    got = lm.forward(toks, start, positions=start[:, None] + depth[None], see=see)
    for r, n in ((0, 4), (1, 3)):
        for node in range(7):
            path, j = [], node
            while j >= 0:
                path.append(int(toks[r, j]))
                j = parent[j]
            seq = torch.cat([prefix[r, :n], torch.tensor(path[::-1])])
            want = target(input_ids=seq[None]).logits[0, -1]
            torch.testing.assert_close(got[r, node], want, atol=1e-5, rtol=1e-5)


TREES = [None, [2, 2], Tree(Tree.from_branching([3, 1]).parent, replacement=True), "dynamic",
         DynamicTree(width=3, depth=3, max_children=2, replacement=True)]


@pytest.mark.parametrize("kind", ["heads", "feature"])
@pytest.mark.parametrize("tree", TREES, ids=["chain", "static", "static-iid", "dynamic", "dynamic-iid"])
def test_greedy_equals_targets_greedy(make_llama, kind, tree):
    target = make_llama(eos=None)
    L = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in PROMPTS])
    want = SpeculativeGenerator(target, "ngram").generate(ids, attention_mask=mask, max_new_tokens=14,
                                                           temperature=0, eos_token_id=[])
    gen = SpeculativeGenerator(target, _drafter(kind, target), lookahead=3, tree=tree)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=14, temperature=0, eos_token_id=[])
    assert out.sequences == want.sequences
    assert out.stats.accepted >= 5  # drafts were kept (8 to 18 of them on these models), not only verifier draws
    assert set(out.stats.routes) == ({"greedy"} if tree is None else {"tree_greedy"})


# (drafter, tree, temperature, top_k, top_p, eos, lookahead, n_new)
LAWS = [
    ("heads", [2, 2], 0.9, 4, 0.9, [], 3, 2),
    ("feature", "dynamic", 1.2, 3, None, [0], 3, 3),
    ("heads", None, 1.0, 3, None, [0], 3, 3),  # the chain path: every head's law at once, block rule
    ("feature", None, 1.0, 3, None, [0], 3, 3),  # the feature draft's chain path (causal columns), block rule
]
SLOW_LAWS = [
    ("feature", Tree(Tree.from_branching([3, 1]).parent, replacement=True), 1.0, 3, None, [], 3, 3),
    ("heads", DynamicTree(width=3, depth=3, max_children=2, replacement=True), 1.0, 3, None, [0], 3, 3),
    ("feature", None, 0.8, 4, None, [0], "auto", 3),
]


def _law_case(make_llama, case):
    kind, tree, t, k, p, eos, la, n_new = case
    target = make_llama(eos=None)
    gen = SpeculativeGenerator(target, _drafter(kind, target), lookahead=la, tree=tree)
    cfg = SamplingConfig(temperature=t, top_k=k, top_p=p)
    laws = [continuation_law(target, prompt, n_new, cfg, eos) for prompt in PROMPTS]
    n = rows_needed(laws, FAST_TV)
    samples = sample_rows(gen, n, n_new, cfg, eos, rng=zlib.crc32(repr(case).encode()))
    assert_law(laws, samples, FAST_TV)


@pytest.mark.parametrize("case", LAWS, ids=lambda c: f"{c[0]}-{c[1]!r}"[:40])
def test_output_law_is_the_targets(make_llama, case):
    """Catches a TV deviation of FAST_TV = 0.02 of the joint law with probability 0.99 (a draft
    that hands the verifier its untransformed law fails it with p < 1e-300)."""
    _law_case(make_llama, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_LAWS, ids=lambda c: f"{c[0]}-{c[1]!r}"[:40])
def test_output_law_is_the_targets_slow(make_llama, case):
    """As above, for the other drafters and shapes (chains, i.i.d. children, auto lookahead)."""
    _law_case(make_llama, case)


def test_bad_input_is_refused_before_work(make_llama):
    target = make_llama(eos=None)
    other = make_llama(hidden=48, eos=None)
    heads = MedusaHeads.for_target(other, n_heads=2)
    with pytest.raises(ValueError, match="hidden size"):
        SpeculativeGenerator(target, heads)
    heads = MedusaHeads.for_target(target, n_heads=2)
    with pytest.raises(ValueError, match="3 levels deep"):
        SpeculativeGenerator(target, heads, tree=[2, 2, 2])
    with pytest.raises(ValueError, match="lookahead=3"):
        SpeculativeGenerator(target, heads, lookahead=3)
    for bad in ([2, 0], "wide", [[1, 2]]):
        with pytest.raises(ValueError, match=r"tree|branching"):
            SpeculativeGenerator(target, heads, tree=bad)
    with pytest.raises(ValueError, match="parent"):
        SpeculativeGenerator(target, heads, tree=Tree(np.array([-1, 1, 0])))
    with pytest.raises(ValueError, match="proposes token trees"):
        SpeculativeGenerator(target, make_llama(layers=1, eos=None), tree=[2])
    with pytest.raises(ValueError, match=r"DynamicTree\.width"):
        SpeculativeGenerator(target, heads, tree=DynamicTree(width=0))


@pytest.mark.parametrize("kind", ["heads", "feature"])
def test_nan_logits_of_a_draft_on_the_target_are_refused(make_llama, kind):
    """A draft on the target whose weights hold NaN: a clear error when it samples, not samples."""
    target = make_llama(eos=None)
    draft = _drafter(kind, target)
    with torch.no_grad():
        next(p for n, p in draft.named_parameters() if n in ("out", "down.weight_t"))[0, 0] = float("nan")
    for tree in (None, [2, 1]):
        gen = SpeculativeGenerator(target, draft, lookahead=2, tree=tree)
        with pytest.raises(ValueError, match="draft's logits are not finite"):
            gen.generate([[1, 2, 3]] * 2, max_new_tokens=6, eos_token_id=[])


@pytest.mark.parametrize(("key", "why"), [("mamba", "recurrent layers"), ("bloom", "ALiBi")])
def test_trees_on_targets_that_cannot_score_one_are_refused(key, why):
    """Chains work on these families; a tree needs one state per branch (recurrent layers) or
    positions apart from slots (ALiBi biases come from slots): refused by name at construction."""
    from families import family, tiny_model

    target = tiny_model(family(key), dtype=torch.float32)
    heads = MedusaHeads.for_target(target, n_heads=2)
    with pytest.raises(ValueError, match=why):
        SpeculativeGenerator(target, heads, tree=[2, 1])
    kw = dict(max_new_tokens=8, temperature=0, eos_token_id=[])
    out = SpeculativeGenerator(target, _perturbed(heads, seed=5), lookahead=2).generate([[1, 2, 3], [4, 5]], **kw)
    assert out.sequences == SpeculativeGenerator(target, "ngram").generate([[1, 2, 3], [4, 5]], **kw).sequences


def test_a_dynamic_shape_follows_the_laws_not_the_draws():
    """Children are sampled, so a node's value is the ``q`` value that chose it (its rank's), not
    the probability of the token drawn (EAGLE-2's rule, for top-k drafting): with the same law at
    every node, every draw gives the same shape, and the line of first children reaches full depth."""
    from speculate.domains.text.drafts.trees import grow_tree
    from speculate.domains.text.request.processors import as_transforms

    law = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05]).log()
    spec = DynamicTree(width=3, depth=3, max_children=3)
    tr = as_transforms(SamplingConfig(temperature=1.0))
    shapes = set()
    for seed in range(20):
        _, _, valid, parent = grow_tree(spec, lambda nodes, d, parent, toks: law.expand(*nodes.shape, 6), tr, None,
                                        np.array([0]), np.array([3]), np.array([True]),
                                        np.random.default_rng(seed), 6)
        shapes.add(tuple(parent[0, valid[0]].tolist()))
    # root: 3 children (values .4, .3, .1); then (1, rank 0) .16, (1, rank 1) .12, (2, rank 0) .12;
    # then (4, rank 0) .064, (4, rank 1) .048, (5, rank 0) .048
    assert shapes == {(-1, 0, 0, 0, 1, 1, 2, 4, 4, 5)}


def test_the_lookahead_follows_the_tree_and_the_heads_unless_given(make_llama):
    """Regression: SpeculativeGenerator(target, heads, tree=[2, 2]) with two heads refused with
    'lookahead=4 but the Medusa heads draft at most 2 tokens'; the default is now the tree's depth
    (and, for a Medusa chain, at most one token per head)."""
    target = make_llama(eos=None)
    heads = MedusaHeads.for_target(target, n_heads=2)
    assert SpeculativeGenerator(target, heads, tree=[2, 2]).lookahead == 2
    assert SpeculativeGenerator(target, heads, tree=[3]).lookahead == 1
    assert SpeculativeGenerator(target, heads).lookahead == 2
    assert SpeculativeGenerator(target, heads, lookahead=1).lookahead == 1
    assert SpeculativeGenerator(target, "ngram").lookahead == 4
    out = SpeculativeGenerator(target, heads, tree=[2, 2]).generate([[1, 2, 3]], max_new_tokens=6, rng=0)
    assert len(out.new_tokens[0]) == 6
