"""CUDA: bf16/fp16 models with acceptance in float32, and a draft on another device than the target.

Skipped without a CUDA device (this project's CI is CPU-only; run with ``-m gpu`` on a GPU box).
"""

from __future__ import annotations

import pytest
import torch
from speculate.domains.text import SpeculativeGenerator

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _hf_greedy(target, prompt, n):
    ids = torch.tensor([prompt], device=target.device)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cuda(make_llama, dtype):
    target = make_llama(dtype=dtype).cuda()
    draft = make_llama(layers=1, rng=1, dtype=dtype).cuda()
    gen = SpeculativeGenerator(target, draft, lookahead=4, verify="block")
    out = gen.generate(torch.tensor([[1, 2, 3]] * 64, device="cuda"), max_new_tokens=16,
                       top_p=0.9, rng=0, eos_token_id=[])
    assert all(len(t) == 16 and max(t) < 12 for t in out.new_tokens)
    assert 0 <= out.stats.acceptance_rate <= 1


def test_float32_greedy_on_cuda_matches_generate(make_llama):
    target = make_llama(init_std=0.3).cuda()
    gen = SpeculativeGenerator(target, "early-exit:1", lookahead=3)
    out = gen.generate([1, 5, 7], max_new_tokens=20, temperature=0, eos_token_id=[])
    assert out.new_tokens[0] == _hf_greedy(target, [1, 5, 7], 20)


@pytest.mark.parametrize("target_dev,draft_dev", [("cuda", "cpu"), ("cpu", "cuda")])
def test_draft_on_another_device(make_llama, target_dev, draft_dev):
    target = make_llama(dtype=torch.float64, init_std=0.3).to(target_dev)
    draft = make_llama(layers=1, rng=1, dtype=torch.float32).to(draft_dev)
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    out = gen.generate([1, 5, 7], max_new_tokens=20, temperature=0, eos_token_id=[])
    assert out.new_tokens[0] == _hf_greedy(target, [1, 5, 7], 20)


def test_a_batch_too_large_for_the_gpu_fails_before_allocating(make_llama):
    """The caches' bytes are compared with torch.cuda.mem_get_info (plus PyTorch's unused reserved
    memory) before anything is allocated."""
    from speculate.domains.text import CacheMemoryError

    target = make_llama().cuda()
    gen = SpeculativeGenerator(target, "ngram")
    before = torch.cuda.memory_allocated()
    with pytest.raises(CacheMemoryError, match=r"on cuda:0 .*mem_get_info"):
        gen.generate([[1, 2, 3]] * 64, max_new_tokens=10**9)
    assert torch.cuda.memory_allocated() == before
