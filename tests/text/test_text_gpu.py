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


def test_target_spread_over_two_devices_with_device_map(make_llama, tmp_path):
    """A target loaded with ``device_map`` (half its layers on the GPU, half on the CPU, through
    accelerate's hooks) and a draft on the CPU: each layer's cache sits with its layer, and greedy
    output equals the target's own on one device."""
    pytest.importorskip("accelerate")
    target = make_llama(dtype=torch.float32, init_std=0.3, layers=4)
    target.save_pretrained(tmp_path)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": 0 if i < 2 else "cpu" for i in range(4)}}
    spread = type(target).from_pretrained(tmp_path, device_map=device_map, dtype=torch.float32).eval()
    assert {p.device.type for p in spread.parameters()} == {"cuda", "cpu"}
    gen = SpeculativeGenerator(spread, make_llama(layers=1, rng=1), lookahead=3)
    out = gen.generate([[1, 5, 7], [2, 3]], max_new_tokens=20, temperature=0, eos_token_id=[])
    assert out.new_tokens == [_hf_greedy(target, [1, 5, 7], 20), _hf_greedy(target, [2, 3], 20)]


@pytest.mark.parametrize("name,target_dev,draft_dev", [("Whisper", "cuda", "cpu"), ("BART", "cuda", "cuda"),
                                                        ("Whisper", "cpu", "cuda")])
def test_encoder_decoders_on_cuda_and_across_devices(name, target_dev, draft_dev):
    """The lean decoder loop on the GPU, and a draft that reads the target's encoder output on
    another device: greedy equals the target's own greedy decoding, for rows of different inputs."""
    from families import family, perturbed, tiny_seq2seq
    from speculate.domains.text.models.lean_seq2seq import LeanSeq2Seq

    target = tiny_seq2seq(family(name)).float()
    draft = perturbed(target).float().to(draft_dev)
    target = target.to(target_dev)
    g = torch.Generator().manual_seed(0)
    if name == "Whisper":
        cfg = target.config
        inputs = {"input_features": torch.randn(3, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g)}
    else:
        inputs = {"input_ids": [[4, 5, 6, 7, 8], [9, 3, 3], [10, 11, 12, 13]]}
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    assert isinstance(gen._target_lm, LeanSeq2Seq)
    out = gen.generate(**inputs, max_new_tokens=8, temperature=0, eos_token_id=[])
    start = int(target.config.decoder_start_token_id)
    for r, seq in enumerate(out.sequences):
        one = ({"input_features": inputs["input_features"][r : r + 1].to(target_dev)} if name == "Whisper"
               else {"input_ids": torch.tensor([inputs["input_ids"][r]], device=target_dev)})
        want = [start]
        with torch.no_grad():
            for _ in range(8):
                logits = target(**one, decoder_input_ids=torch.tensor([want], device=target_dev)).logits
                want.append(int(logits[0, -1].argmax()))
        assert seq == want


@pytest.mark.parametrize("verify", ["token", "block"])
def test_chains_are_verified_on_the_device(make_llama, verify):
    """A CUDA target drafts and verifies on the device by default (routes '<rule>-device'), with the
    host path's tokens for the same seed (the same uniforms, in the same order)."""
    target = make_llama(init_std=0.3).cuda()
    draft = make_llama(layers=1, rng=1).cuda()
    kw = dict(max_new_tokens=24, eos_token_id=[], rng=5)
    dev = SpeculativeGenerator(target, draft, lookahead=3, verify=verify).generate([[1, 2, 3], [4, 5]], **kw)
    host = SpeculativeGenerator(target, draft, lookahead=3, verify=verify, verify_on_device=False).generate(
        [[1, 2, 3], [4, 5]], **kw)
    assert set(dev.stats.routes) == {f"{verify}-device"} and set(host.stats.routes) == {verify}
    assert dev.new_tokens == host.new_tokens


def _feature_draft_on(device: str, dtype: torch.dtype) -> None:
    """A feature draft's decoding form (drafting: a cache, no autograd) against its modules on
    ``device`` in ``dtype``, and greedy EAGLE decoding against the target's own greedy output."""
    import numpy as np
    from speculate.domains.text.conformance import tiny_llama
    from speculate.domains.text.training.feature_draft import FeatureDraft

    target = tiny_llama(vocab=64, hidden=32, layers=2, dtype=dtype).to(device)
    draft = FeatureDraft.for_target(target)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_((0.3 * torch.randn(p.shape, generator=g)).to(p.dtype))
    feats = torch.randn(2, 6, 32, generator=g).to(device, dtype)
    tokens, pos = torch.randint(0, 64, (2, 6), generator=g).to(device), np.arange(6)[None].repeat(2, 0)
    with torch.no_grad():
        fast = draft(feats, tokens, pos, draft.new_cache(2, 8), pos)[1]
    slow = draft(feats, tokens, pos, draft.new_cache(2, 8), pos)[1].detach()
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(fast.float(), slow.float(), **tol)
    if dtype == torch.float32:
        gen = SpeculativeGenerator(target, draft, lookahead=3)
        out = gen.generate([1, 5, 7], max_new_tokens=20, temperature=0, eos_token_id=[])
        assert out.new_tokens[0] == _hf_greedy(target, [1, 5, 7], 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feature_draft_decoding_form_on_cuda(dtype):
    _feature_draft_on("cuda", dtype)
