"""lookahead="auto" at batch 1 in text: every rejection rejects the whole round, which is where a rule
that reacts to a round's own outcome would bias the law (the many-row tests average it away).

One chi-square test per case over the first 3 tokens of one prompt (top-2: 8 continuations) against
``continuation_law``, at ALPHA = 1e-6, with rows sized by ``chi2_sample_size`` to catch TV 0.05 with
power 0.99 (TV 0.02 under ``slow``). The draft is the target with a flattened head (its laws far
enough that about a fifth of the rounds reject their first draft). Under ``slow``, the planted fault
(a round where the row rejected its first draft is verified again with fresh uniforms: TV about 0.06
here) fails the same test on the same seed; tests/core/test_core_chain.py catches it on one chain
in the default run.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.sampling import SamplingConfig

import speculate as sp
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import chi2_gof, chi2_sample_size

PROMPT = [3, 1, 4, 1, 5]
N_NEW = 3
CFG = SamplingConfig(temperature=1.0, top_k=2)


def _sample(gen: SpeculativeGenerator, n: int, seed: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [tuple(gen.generate([PROMPT], max_new_tokens=N_NEW, temperature=CFG.temperature, top_k=CFG.top_k,
                                   eos_token_id=[], rng=rng).new_tokens[0]) for _ in range(n)]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("cost_ratio", "tv"), [
    (None, 0.05), pytest.param(0.05, 0.05, marks=pytest.mark.slow), pytest.param(None, 0.02, marks=pytest.mark.slow)])
def test_auto_lookahead_at_batch_1_keeps_the_law(make_llama, cost_ratio, tv, monkeypatch, request):
    target = make_llama(eos=None)
    draft = copy.deepcopy(target)
    draft.lm_head.weight.data *= 0.2  # a flatter copy: rounds that reject their first draft are common
    law = continuation_law(target, PROMPT, N_NEW, CFG)
    n = chi2_sample_size(tv, sum(1 for w in law.values() if w > 0), alpha=ALPHA)
    gen = SpeculativeGenerator(target, draft, lookahead="auto", cost_ratio=cost_ratio, max_lookahead=3)
    got = _sample(gen, n, seed=5)
    r = chi2_gof(got, law)
    assert r.pvalue > ALPHA, r.detail
    if "slow" not in request.keywords:
        return
    real = sp.rounds.verify_round

    def redo(target, proposal, rule, m, k, R, rng):
        out = real(target, proposal, rule, m, k, R, rng)
        return real(target, proposal, rule, m, k, R, rng) if k > 0 and not np.any(out[0]) else out

    monkeypatch.setattr(sp.rounds, "verify_round", redo)
    assert chi2_gof(_sample(gen, n, seed=5), law).pvalue < ALPHA  # the planted fault is caught


def test_auto_at_k0_throughout_is_lookahead_0_token_for_token(make_llama):
    target = make_llama(eos=None)
    draft = make_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=7)
    kw = dict(max_new_tokens=20, temperature=1.0, eos_token_id=[], rng=4)
    auto = SpeculativeGenerator(target, draft, lookahead="auto", cost_ratio=2.0).generate([PROMPT, [2, 7]], **kw)
    plain = SpeculativeGenerator(target, draft, lookahead=0).generate([PROMPT, [2, 7]], **kw)
    assert set(auto.stats.lookahead_counts) == {0}
    assert auto.new_tokens == plain.new_tokens
