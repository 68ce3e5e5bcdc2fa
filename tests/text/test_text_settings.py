"""Generation settings keep the output law exactly the target's under the same settings.

Each law test samples the first ``n_new`` tokens of three ragged prompts, interleaved in every
batch (so rows are left-padded, accept ragged numbers of drafts and the processors see prefixes of
different lengths in one call), and compares them with :func:`continuation_law` given the same
:class:`Transforms` (full forward passes in float64, each prefix processed on its own). The
prefix-dependent settings are chosen so that the drafted tokens change the prefix: a repetition
penalty and no-repeat bigrams on prompts with repeated tokens, ``min_new_tokens`` with an EOS id,
bad words, and a user processor that boosts the token after the last one. A draft or target
processed with the committed prefix only (drafted tokens left out), or a draft law reported
before the processors (transformers #47932), is far outside these tests' power.

Calibration and power: one chi-square test per law test (statistics of ``chi2_gof`` summed over
the prompts, as in ``test_text_exactness.py``) at level ``ALPHA`` = 1e-6; with the 5 law tests of
this file (Bonferroni) a correct generator fails the file with probability below 5e-6. Each test
takes its rows from ``chi2_sample_size`` to catch a total-variation bias of ``TV`` = 0.03 of the
joint (prompt, continuation) law with probability 0.99 (0.01 under ``slow``). The target's weights
are 10x the usual scale (``tiny_llama``'s ``init_std``) so its law depends strongly on the prefix.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from scipy import stats
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.processors import Transforms
from speculate.domains.text.request.settings import resolve

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import chi2_gof, chi2_sample_size

PROMPTS = [[1, 5, 5, 7], [3, 3, 9, 3], [8, 2]]
POWER, TV, SLOW_TV = 0.99, 0.03, 0.01


class NextBoost:
    """A user processor: +2 on the id after the prefix's last token (depends on the prefix)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        nxt = (input_ids[:, -1] + 1) % scores.shape[-1]
        return scores.scatter_add(1, nxt[:, None], torch.full_like(scores[:, :1], 2.0))


def _transforms(settings: dict, eos: list[int]) -> Transforms:
    s = resolve(None, **settings)
    return Transforms(s.sampling, s.before, s.user, s.min_new_tokens, np.array(eos, np.int64))


def _check(laws, samples, tv):
    stat, df = 0.0, 0
    for got, law in zip(samples, laws, strict=True):
        r = chi2_gof(got, law)
        assert np.isfinite(r.statistic), r.detail  # an outcome the law forbids
        stat, df = stat + r.statistic, df + r.df
    n = sum(len(s) for s in samples)
    need = chi2_sample_size(tv, df + 1, alpha=ALPHA, power=POWER)
    assert need <= n, f"test too weak: {need} rows needed, {n} drawn"
    p = stats.chi2.sf(stat, df)
    assert p > ALPHA, f"chi2={stat:.1f} df={df} p={p:.2e}: the law is biased"


def _run(make_llama, draft, verify, settings, eos, n_new, tv, n_ret=1):
    target = make_llama(vocab=10, eos=None)
    tree = None
    if draft == "model":
        draft = make_llama(vocab=10, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    elif draft.startswith(("heads:", "feature:")):  # drafts on the target, drafting token trees
        from tests.text.test_text_tree_drafts import _drafter

        kind, _, shape = draft.partition(":")
        tree = None if not shape else [int(b) for b in shape.split(",")] if shape[0].isdigit() else shape
        draft = _drafter(kind, target)
    gen = SpeculativeGenerator(target, draft, lookahead=3, verify=verify, tree=tree)
    tr = _transforms(settings, eos)
    laws = [continuation_law(target, p, n_new, tr.cfg, eos, transforms=tr) for p in PROMPTS]
    cells = sum(sum(1 for w in law.values() if w > 0) for law in laws)
    n = -(-chi2_sample_size(tv, cells, alpha=ALPHA, power=POWER) // len(PROMPTS))
    n = -(-n // n_ret) * n_ret
    rows = [i % len(PROMPTS) for i in range(n * len(PROMPTS) // n_ret)]
    samples: list[list] = [[] for _ in PROMPTS]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = gen.generate([PROMPTS[w] for w in rows], max_new_tokens=n_new, eos_token_id=eos,
                           num_return_sequences=n_ret, rng=zlib.crc32(repr(settings).encode()), **settings)
    finally:
        torch.set_num_threads(threads)
    assert len(out.sequences) == len(rows) * n_ret
    for i, toks in enumerate(out.new_tokens):
        samples[rows[i // n_ret]].append(tuple(toks))
    _check(laws, samples, tv)


CASES = {
    "repetition-ngram": ("model", "block", dict(temperature=1.0, top_k=4, repetition_penalty=3.0,
                                                no_repeat_ngram_size=2), [], 3),
    "min-new-bad-words": ("model", "token", dict(temperature=0.9, top_k=4, min_new_tokens=2,
                                                 bad_words_ids=[[5], [3, 9]]), [0], 3),
    "min-p-typical": ("early-exit:1", "block", dict(temperature=1.2, min_p=0.1, typical_p=0.9), [], 2),
    "user-processor": ("ngram", "block", dict(temperature=1.0, top_k=3, repetition_penalty=2.0,
                                              logits_processor=[NextBoost()]), [0], 3),
    # token trees: every node's law (target and draft) with that node's own path as its prefix
    "tree-heads-repetition": ("heads:2,2", "token", dict(temperature=1.0, top_k=4, repetition_penalty=3.0,
                                                         no_repeat_ngram_size=2), [], 3),
    # a chain from the feature draft with prefix processors: drafted as a tree of one branch, block rule
    "chain-feature-repetition": ("feature:", "block", dict(temperature=1.0, top_k=4, repetition_penalty=3.0,
                                                           no_repeat_ngram_size=2), [0], 3),
    # Medusa heads' chain with prefix processors: each depth's law from its own drafted prefix
    "chain-heads-repetition": ("heads:", "block", dict(temperature=1.0, top_k=4, repetition_penalty=3.0,
                                                       no_repeat_ngram_size=2), [0], 3),
    "tree-feature-processor": ("feature:dynamic", "token", dict(temperature=1.0, top_k=3, min_new_tokens=2,
                                                                logits_processor=[NextBoost()]), [0], 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_law_under_settings(make_llama, case):
    draft, verify, settings, eos, n_new = CASES[case]
    _run(make_llama, draft, verify, settings, eos, n_new, TV)


def test_law_with_num_return_sequences(make_llama):
    """Three copies of each prompt in the batch, rows independent."""
    _run(make_llama, "model", "block", dict(temperature=1.0, top_k=3, repetition_penalty=2.0), [], 3, TV,
         n_ret=3)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_law_under_settings_slow(make_llama, case):
    draft, verify, settings, eos, n_new = CASES[case]
    _run(make_llama, draft, verify, settings, eos, n_new, SLOW_TV)


def test_greedy_with_processors_equals_transformers(make_llama):
    """Greedy with a repetition penalty and no-repeat n-grams: transformers' own tokens, per row."""
    target = make_llama(vocab=16, eos=None)
    draft = make_llama(vocab=16, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    kw = dict(repetition_penalty=1.8, no_repeat_ngram_size=2)
    out = gen.generate(PROMPTS, max_new_tokens=10, temperature=0, eos_token_id=[], **kw)
    for p, got in zip(PROMPTS, out.new_tokens, strict=True):
        ref = target.generate(torch.tensor([p]), do_sample=False, max_new_tokens=10, eos_token_id=None,
                              pad_token_id=0, **kw)
        assert got == ref[0, len(p):].tolist()


def test_generation_config_and_overrides(make_llama):
    from transformers import GenerationConfig

    s = resolve(GenerationConfig(do_sample=True, temperature=0.5, top_k=0, max_new_tokens=7), top_p=0.9)
    assert (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p, s.max_new_tokens) == (0.5, None, 0.9, 7)
    assert resolve(GenerationConfig(do_sample=False)).sampling.greedy
    with pytest.raises(ValueError, match="num_beams"):
        resolve(GenerationConfig(num_beams=4))
    gen = SpeculativeGenerator(make_llama(vocab=10), "ngram")
    out = gen.generate([[1, 2, 3]], generation_config=GenerationConfig(max_new_tokens=4, do_sample=False),
                       eos_token_id=[])
    assert len(out.new_tokens[0]) == 4


class Noisy:
    def __call__(self, input_ids, scores):
        return scores + torch.randn_like(scores)


def test_processor_contract(make_llama):
    from transformers import PrefixConstrainedLogitsProcessor

    gen = SpeculativeGenerator(make_llama(vocab=10), "ngram")
    with pytest.raises(ValueError, match="two different outputs"):
        gen.generate([[1, 2, 3]], max_new_tokens=3, logits_processor=[Noisy()])
    with pytest.raises(ValueError, match="batch_id"):
        gen.generate([[1, 2, 3]], max_new_tokens=3,
                     logits_processor=[PrefixConstrainedLogitsProcessor(lambda b, ids: [1], 1)])
    with pytest.raises(TypeError, match="unexpected keyword"):
        gen.generate([[1, 2, 3]], max_new_tokens=3, temprature=0.5)
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        gen.generate([[1, 2, 3]], max_new_tokens=3, stop_strings=["x"])
    with pytest.raises(ValueError, match="every token"):
        gen.generate([[1, 2, 3]], max_new_tokens=3, bad_words_ids=[[i] for i in range(10)])


def test_the_models_own_generation_config_is_followed_with_transformers_precedence(make_llama):
    """Regression: a checkpoint with do_sample=False, max_new_tokens=7 got 128 sampled tokens (only its
    EOS was read). Precedence as in transformers: keyword arguments > the GenerationConfig passed >
    the model's own (the fields its checkpoint set) > our defaults."""
    from transformers import GenerationConfig

    target = make_llama()
    target.generation_config.do_sample = False
    target.generation_config.max_new_tokens = 7
    gen = SpeculativeGenerator(target, "ngram")
    out = gen.generate([[1, 2, 3]], rng=0, eos_token_id=[])
    greedy = target.generate(torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=7)
    assert out.sequences[0] == greedy[0].tolist()
    assert len(gen.generate([[1, 2, 3]], max_new_tokens=3, rng=0, eos_token_id=[]).new_tokens[0]) == 3
    passed = GenerationConfig(do_sample=True, max_new_tokens=5)
    s = resolve(passed, model_config=target.generation_config)
    assert s.max_new_tokens == 5 and s.sampling.temperature == 1.0
    s = resolve(passed, model_config=target.generation_config, temperature=0.5, max_new_tokens=2)
    assert s.max_new_tokens == 2 and s.sampling.temperature == 0.5
    s = resolve(None, model_config=target.generation_config)
    assert s.max_new_tokens == 7 and s.sampling.temperature == 0.0
    assert resolve(None, model_config=make_llama().generation_config).max_new_tokens == 128  # defaults
