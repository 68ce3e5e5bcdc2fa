"""The sampling transforms match transformers' logits warpers and reject bad settings."""

from __future__ import annotations

import pytest
import torch
from speculate.domains.text.sampling import SamplingConfig, probabilities, transform_logits
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
