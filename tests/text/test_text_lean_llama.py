"""The lean Llama decoding loop gives the transformers forward's logits (common starts, last-only
logits, grouped-query and multi-head attention, both attention implementations); other models
fall back to the general cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speculate.domains.text.models.kv_cache import CachedModel
from speculate.domains.text.models.lean_llama import LeanLlama, lean_model, supports
from transformers import Qwen2Config, Qwen2ForCausalLM


@pytest.fixture(params=["sdpa-gqa", "eager-gqa", "sdpa-mha"])
def llama(request, make_llama):
    attn, heads = request.param.split("-")
    return make_llama(attn=attn, kv_heads=2 if heads == "gqa" else 4, dtype=torch.float64, layers=3)


def _tol(model):
    # transformers' eager attention takes the softmax in float32 even for a float64 model
    return 1e-6 if model.config._attn_implementation == "eager" else 1e-9


# ragged batches with rollback, dropped rows and grown buffers: tests/text/test_text_kv_cache.py runs its
# test on this loop too


def test_common_start_and_last_only(llama):
    rng = np.random.default_rng(1)
    seqs = rng.integers(0, 12, (2, 20))
    lm = LeanLlama(llama)
    lm.reset(batch=2, capacity=20)
    at = 0
    for w in (5, 1, 3, 1, 2, 4):
        got = lm.forward(torch.from_numpy(seqs[:, at : at + w]), np.array([at, at]), last_only=(w == 3))
        full = llama(input_ids=torch.from_numpy(seqs[:, : at + w])).logits[:, at:]
        torch.testing.assert_close(got, full[:, -1:] if w == 3 else full, rtol=_tol(llama), atol=_tol(llama))
        at += w


def test_lean_model_picks_the_general_cache_for_other_models(make_llama):
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=24, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2)).eval()
    assert isinstance(lean_model(qwen), CachedModel)
    assert isinstance(lean_model(make_llama()), LeanLlama)
    training = make_llama().train()
    assert not supports(training) and isinstance(lean_model(training), CachedModel)
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        LeanLlama(qwen)


def test_reads_the_live_weights_and_dtype(make_llama):
    """Training the draft in place (distill) or moving it to another dtype after the loop was built
    must show in its logits: nothing is copied at construction."""
    m = make_llama(dtype=torch.float32)
    lm = LeanLlama(m)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight.add_(0.5)
        m.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    m.double()
    lm.reset(batch=1, capacity=8)
    got = lm.forward(ids, np.zeros(1, np.int64))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, m(input_ids=ids).logits, rtol=1e-9, atol=1e-9)


def _draft_logits(gen, prompt):
    """The draft's logits for ``prompt`` as the generator's draft runtime computes them."""
    lm = gen.draft.lm
    lm.reset(1, 32)
    return lm.forward(torch.tensor([prompt]), np.zeros(1, np.int64))[0]


def test_a_draft_with_an_adapter_or_a_hook_runs_its_own_forward(make_llama):
    """Regression: the lean loop read the base weights and drafted as if a LoRA adapter injected with
    peft, or a forward hook, were absent (max logit difference 9.86 in the report). Such a draft now
    runs through its own forward, so the draft is the one the user built."""
    import peft
    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.models.lean_cache import modified
    target = make_llama()
    prompt = [1, 2, 3, 4, 5]

    draft = make_llama(layers=1, rng=1)
    assert modified(draft) is None and supports(draft)
    cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    draft = peft.inject_adapter_in_model(cfg, draft).eval()
    assert "adapter" in modified(draft) and not supports(draft)
    gen = SpeculativeGenerator(target, draft)
    assert not isinstance(gen.draft.lm, LeanLlama)
    with torch.no_grad():
        own = draft(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(_draft_logits(gen, prompt), own, rtol=1e-5, atol=1e-5)

    hooked = make_llama(layers=1, rng=1)
    hooked.model.layers[0].mlp.register_forward_hook(lambda m, a, out: out * 3.0)
    assert "forward hook" in modified(hooked)
    gen = SpeculativeGenerator(target, hooked)
    assert not isinstance(gen.draft.lm, LeanLlama)
    with torch.no_grad():
        own = hooked(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(_draft_logits(gen, prompt), own, rtol=1e-5, atol=1e-5)

    wrapped = make_llama(layers=1, rng=1)
    wrapped.model.norm.forward = lambda x: x  # a replaced forward on an instance
    assert "forward replaced" in modified(wrapped) and not supports(wrapped)
