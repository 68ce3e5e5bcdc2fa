"""The conformance matrix over every family of ``tests/text/families.py`` (the README's table).

Every row marked ``works`` or ``fixed`` is built as a tiny random model from its config (float64,
init std 0.3 so that the law depends on context and position; a sliding window or attention chunk
of 6 tokens where the family has one) with a draft that is a perturbed copy of it, and must pass:

- greedy: a ragged, left-padded batch of four prompts (1 to 9 tokens), 16 new tokens each (past
  the window, also in the middle of drafted blocks), lookahead 3: every row equals the target's own
  greedy decoding (the argmax of full forward passes, token by token);
- law, token and block rules: the first three sampled tokens (three, so that a round verifies two
  drafts and the block rule differs from the token rule; the first two are their marginal) of a
  batch mixing three prompts of 5, 7 and 9 tokens, against :func:`continuation_law` (top-k 3, 81
  cells), by ``check_conformance`` at the suite's level ALPHA, one check per test. Power: each
  test catches a deviation of total variation ``FAST_TV`` = 0.1 of the joint law of (prompt,
  continuation) with probability 0.99 in the default run, ``SLOW_TV`` = 0.02 under ``slow``.

Rows marked ``fallback`` pass the same matrix through transformers' own cache, and their
``FallbackWarning`` names the reason the position-indexed cache refuses them (``refusal``). The
README's table is the one :func:`markdown_table` renders from the same rows.
"""

from __future__ import annotations

import functools
import re
import zlib
from pathlib import Path

import pytest
import torch
from families import FAMILIES, markdown_table, perturbed, tiny_model
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import model_case
from speculate.domains.text.models.pick import FallbackWarning
from speculate.domains.text.models.transformers_cache import TransformersCacheModel
from speculate.domains.text.request.sampling import SamplingConfig

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import check_conformance

SUPPORTED = [f for f in FAMILIES if f.status in ("works", "fixed", "fallback")]
FALLBACK = [f for f in FAMILIES if f.status == "fallback"]
FAST_TV, SLOW_TV = 0.1, 0.02
LAW_PROMPTS = ([1, 5, 7, 2, 9], [3, 3, 9, 4, 3, 3, 8], [8, 2, 6, 1, 0, 4, 11, 2, 9])
GREEDY_PROMPTS = ([1, 5, 7, 2], [3, 3, 9], [8], [4, 6, 10, 11, 0, 5, 5, 2, 9])
SAMPLING = SamplingConfig(temperature=1.0, top_k=3)
README = Path(__file__).resolve().parents[2] / "domains" / "text" / "README.md"


@functools.cache
def _pair(name: str):
    fam = next(f for f in FAMILIES if f.name == name)
    target = tiny_model(fam)
    return target, perturbed(target)


def _greedy(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_readme_table_is_the_families_table():
    assert markdown_table() in README.read_text(), "domains/text/README.md's family table is stale"
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert {f.status for f in FAMILIES} == {"works", "fixed", "fallback"}


@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_greedy_equals_the_targets_own(fam):
    target, draft = _pair(fam.name)
    assert type(target).__name__ == fam.model_class
    L = max(map(len, GREEDY_PROMPTS))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in GREEDY_PROMPTS])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in GREEDY_PROMPTS])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = SpeculativeGenerator(target, draft, lookahead=3).generate(
            ids, attention_mask=mask, max_new_tokens=16, temperature=0, eos_token_id=[])
        for r, p in enumerate(GREEDY_PROMPTS):
            assert out.new_tokens[r] == _greedy(target, p, 16), f"{fam.name}, row {r}"
    finally:
        torch.set_num_threads(threads)
    assert out.stats.rejections > 0, "the draft never missed: no rollback was exercised"


def _law(fam, rule, tv):
    target, draft = _pair(fam.name)
    case = model_case(f"{fam.name}, {rule}", target, draft, rule, SAMPLING, [], 3, tv,
                      prompts=LAW_PROMPTS, n_new=3)
    assert case.detectable_tv(alpha=ALPHA) <= tv
    check_conformance(case, seed=zlib.crc32(case.name.encode()), alpha=ALPHA)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_law_of_the_first_tokens(fam, rule):
    """Catches a TV deviation of FAST_TV = 0.1 of the joint law with probability 0.99."""
    _law(fam, rule, FAST_TV)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_law_of_the_first_tokens_slow(fam, rule):
    """Catches a TV deviation of SLOW_TV = 0.02 of the joint law with probability 0.99."""
    _law(fam, rule, SLOW_TV)


@pytest.mark.parametrize("fam", FALLBACK, ids=lambda f: f.name)
def test_fallback_rows_run_on_transformers_cache_with_the_reason(fam):
    model = tiny_model(fam)
    assert type(model).__name__ == fam.model_class
    with pytest.warns(FallbackWarning, match=re.compile(fam.refusal, re.S)):
        gen = SpeculativeGenerator(model, "ngram")
    assert isinstance(gen._target_lm, TransformersCacheModel)
