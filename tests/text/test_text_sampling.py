"""The sampling transforms match transformers' logits warpers and reject bad settings."""

from __future__ import annotations

import pytest
import torch
from speculate.domains.text.request.sampling import SamplingConfig, probabilities, transform_logits
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@pytest.mark.parametrize("t,k,p", [(1.0, None, 0.9), (0.7, 5, None), (1.3, 10, 0.5),
                                   (0.5, None, 0.3), (1.0, 3, 0.95), (2.0, 1, None)])
def test_matches_transformers_warpers(t, k, p):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 40, generator=g) * 3
    ref = x.clone()
    if t != 1.0:
        ref = TemperatureLogitsWarper(t)(None, ref)
    if k:
        ref = TopKLogitsWarper(k)(None, ref)
    if p:
        ref = TopPLogitsWarper(p)(None, ref)
    ours = transform_logits(x, SamplingConfig(t, k, p))
    assert torch.equal(torch.isinf(ref), torch.isinf(ours))
    torch.testing.assert_close(probabilities(x, SamplingConfig(t, k, p)), ref.softmax(-1))


def test_batch_axes_and_dtypes():
    x = torch.randn(3, 5, 17, dtype=torch.bfloat16)
    pr = probabilities(x, SamplingConfig(0.8, 4, 0.9))
    assert pr.dtype == torch.float32 and pr.shape == (3, 5, 17)
    assert ((pr > 0).sum(-1) <= 4).all()
    torch.testing.assert_close(pr.sum(-1), torch.ones(3, 5))


def test_greedy_is_one_hot_on_first_argmax():
    x = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    assert probabilities(x, SamplingConfig(temperature=0)).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="greedy"):
        transform_logits(x, SamplingConfig(temperature=0))


@pytest.mark.parametrize("kw,msg", [({"temperature": -1}, "temperature"),
                                    ({"temperature": float("nan")}, "temperature"),
                                    ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k"),
                                    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.01}, "top_p")])
def test_bad_settings_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingConfig(**kw)


@pytest.mark.parametrize("kind", ["model", "ngram", "tree", "device"])
def test_logprobs_are_each_tokens_log_probability_under_the_target_law(make_llama, kind):
    """output_logprobs=True: each new token's log-probability under the target's law after the sampling
    settings (what the verifier used), for chains, n-gram, token trees and verification on the device
    (here with the device set to the CPU); at temperature 0 the greedy law (0.0)."""
    import math

    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.training.heads import MedusaHeads

    target = make_llama(vocab=24, eos=None, init_std=0.5)
    kw = {}
    if kind == "model":
        draft = make_llama(vocab=24, layers=1, rng=3)
    elif kind == "tree":
        draft, kw = MedusaHeads.for_target(target, n_heads=2), {"tree": [2, 2]}
    else:
        draft = "ngram"
    if kind == "device":
        kw["verify_on_device"] = True
    gen = SpeculativeGenerator(target, draft, **kw)
    prompts = [[1, 5, 2, 7, 1, 5], [3, 3]]
    cfg = SamplingConfig(temperature=0.8, top_k=6, top_p=0.95)
    out = gen.generate(prompts, max_new_tokens=9, temperature=0.8, top_k=6, top_p=0.95, rng=1,
                       eos_token_id=[], output_logprobs=True)
    assert out.stats.rounds < 18  # several tokens per round: drafted tokens were kept
    for seq, n, lps in zip(out.sequences, out.prompt_lengths, out.logprobs, strict=True):
        assert len(lps) == len(seq) - n == 9
        with torch.no_grad():
            logits = target(input_ids=torch.tensor([seq])).logits[0, n - 1 : len(seq) - 1]  # [9, V]
        p = probabilities(logits.double(), cfg)
        want = [math.log(float(p[i, t])) for i, t in enumerate(seq[n:])]
        assert lps == pytest.approx(want, abs=2e-4)
    greedy = gen.generate(prompts, max_new_tokens=5, temperature=0, rng=1, output_logprobs=True)
    assert all(lp == [0.0] * len(lp) for lp in greedy.logprobs)
    assert gen.generate(prompts, max_new_tokens=3, rng=1).logprobs is None  # only when asked
    chunks = gen.generate(prompts, max_new_tokens=4, rng=1, output_logprobs=True, batch_size=1)
    assert [len(x) for x in chunks.logprobs] == [4, 4]
