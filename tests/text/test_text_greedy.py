"""Temperature 0: the tokens equal target.generate(do_sample=False), batched or not.

Models run in float64 so that batched (k+1 tokens) and single-token matmuls cannot flip an argmax
(in float32 a near-tie can, see the README's caveat).
"""

from __future__ import annotations

import pytest
import torch
from speculate.domains.text import SpeculativeGenerator

PROMPTS = [[1, 5, 7, 2], [3, 3, 9], [8], [4, 6, 10, 11, 0, 5, 5]]


def _hf_greedy(target, prompt, n, eos=None):
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, eos_token_id=eos, pad_token_id=0)
    toks = out[0, len(prompt):].tolist()
    if eos is not None and eos in toks:
        toks = toks[: toks.index(eos) + 1]
    return toks


def _batch(prompts):
    L = max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("draft", ["model", "ngram", "early-exit:1"])
@pytest.mark.parametrize("lookahead", [1, 4])
def test_greedy_equals_hf_generate(make_llama, draft, lookahead):
    target = make_llama(layers=2, dtype=torch.float64, init_std=0.3)
    d = make_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=3, dtype=torch.float64) \
        if draft == "model" else draft
    gen = SpeculativeGenerator(target, d, lookahead=lookahead, verify="block")
    ids, mask = _batch(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=30, temperature=0,
                       eos_token_id=[])
    for r, p in enumerate(PROMPTS):
        assert out.sequences[r] == p + _hf_greedy(target, p, 30), f"row {r}"
    assert out.stats.rounds > 0 and out.stats.tokens_per_call >= 1


def test_batch_rows_equal_rows_alone(make_llama):
    target = make_llama(dtype=torch.float64, init_std=0.3)
    draft = make_llama(layers=1, rng=5, dtype=torch.float64)
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    ids, mask = _batch(PROMPTS)
    batched = gen.generate(ids, attention_mask=mask, max_new_tokens=25, temperature=0,
                           eos_token_id=[])
    for r, p in enumerate(PROMPTS):
        alone = gen.generate(torch.tensor([p]), max_new_tokens=25, temperature=0, eos_token_id=[])
        assert batched.sequences[r] == alone.sequences[0]


def test_greedy_stops_at_eos_like_hf(make_llama):
    target = make_llama(dtype=torch.float64, init_std=0.3)
    ref = [_hf_greedy(target, p, 30) for p in PROMPTS]
    eos = ref[0][4]  # a token row 0 emits 5th: rows stop at different points
    gen = SpeculativeGenerator(target, "early-exit:1", lookahead=4)
    ids, mask = _batch(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=30, temperature=0,
                       eos_token_id=eos)
    for r, p in enumerate(PROMPTS):
        assert out.new_tokens[r] == _hf_greedy(target, p, 30, eos=eos)
    assert out.new_tokens[0][-1] == eos and len(out.new_tokens[0]) <= 5


def test_right_padding_equals_left_padding(make_llama):
    target = make_llama(dtype=torch.float64, init_std=0.3)
    gen = SpeculativeGenerator(target, "ngram", lookahead=3)
    ids, mask = _batch(PROMPTS)
    left = gen.generate(ids, attention_mask=mask, max_new_tokens=12, temperature=0,
                        eos_token_id=[])
    L = max(map(len, PROMPTS))
    ids = torch.tensor([p + [0] * (L - len(p)) for p in PROMPTS])
    mask = torch.tensor([[1] * len(p) + [0] * (L - len(p)) for p in PROMPTS])
    right = gen.generate(ids, attention_mask=mask, max_new_tokens=12, temperature=0,
                         eos_token_id=[])
    assert right.sequences == left.sequences


@pytest.mark.parametrize("draft", ["model", "early-exit:1", "ngram"])
def test_greedy_drafts_are_argmaxes_not_samples(make_llama, draft):
    """Temperature 0 (verify="greedy") keeps drafts while they equal the target's argmax. A draft
    that sampled from its distribution would still give the target's tokens but accept less; here
    every drafted token of the model drafts is the draft model's argmax given the row's tokens
    (full forward passes in float64), no draft probabilities are passed on (q is None), and the
    drafts do not depend on the seed. The n-gram draft is a deterministic lookup (point masses)."""
    target = make_llama(layers=2, dtype=torch.float64, init_std=0.3)
    d = make_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=3, dtype=torch.float64, init_std=0.3) \
        if draft == "model" else draft
    gen = SpeculativeGenerator(target, d, lookahead=4, verify="block")
    seen = []
    propose = gen.draft.propose

    def spy(rows, tokens, k, need, cfg, rng, vocab):
        got = propose(rows, tokens, k, need, cfg, rng, vocab)
        assert got.q is None
        seen.append([(tokens.ids[r, : tokens.n[r]].tolist(), got.outcomes[i, : got.lengths[i]].tolist())
                     for i, r in enumerate(rows)])
        return got

    gen.draft.propose = spy
    ids, mask = _batch(PROMPTS)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=16, temperature=0, eos_token_id=[], rng=0)
    first = seen
    seen = []
    again = gen.generate(ids, attention_mask=mask, max_new_tokens=16, temperature=0, eos_token_id=[], rng=1)
    assert again.sequences == out.sequences and seen == first  # no randomness anywhere
    assert sum(len(dr) for rnd in first for _, dr in rnd) == out.stats.proposed > 0
    if draft == "ngram":
        return
    model = gen.draft.model
    with torch.inference_mode():
        for rnd in first:
            for prefix, drafted in rnd:
                for i, tok in enumerate(drafted):
                    logits = model(input_ids=torch.tensor([prefix + drafted[:i]])).logits[0, -1]
                    assert tok == int(logits.argmax()), (prefix, drafted, i)
