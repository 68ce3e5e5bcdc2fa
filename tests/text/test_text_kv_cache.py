"""The position-indexed KV cache gives the same logits as full forward passes, for ragged batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speculate.domains.text.models.facts import model_vocab_size
from speculate.domains.text.models.kv_cache import CachedModel, check_model
from speculate.domains.text.models.lean_llama import LeanLlama, supports
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM


def _gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=24, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=1, eos_token_id=2)).double().eval()


def _qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=24, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2)).double().eval()


@pytest.fixture(params=["llama-sdpa", "llama-eager", "llama-mha", "gpt2", "qwen2"])
def model(request, make_llama):
    if request.param == "gpt2":
        return _gpt2()
    if request.param == "qwen2":
        return _qwen2()
    if request.param == "llama-mha":
        return make_llama(kv_heads=4, dtype=torch.float64)
    return make_llama(attn=request.param.split("-")[1], dtype=torch.float64)


@pytest.fixture(params=["general", "lean"])
def cache(request, model):
    """The general position-indexed cache, or the lean Llama loop (drafts) where it applies."""
    if request.param == "general":
        return CachedModel
    if not supports(model):
        pytest.skip("the lean loop is for LlamaForCausalLM")
    return LeanLlama


def test_ragged_rounds_equal_full_forward(model, cache):
    """Rows advance by different amounts, stale slots are overwritten, rows are dropped."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, model_vocab_size(model), 40) for _ in range(3)]
    lm = cache(model)
    lm.reset(batch=3, capacity=8)  # too small on purpose: the buffers must grow
    lengths = np.array([5, 2, 9])
    block = np.stack([np.pad(s[:L], (0, 9 - L)) for s, L in zip(seqs, lengths, strict=True)])
    lm.forward(torch.from_numpy(block), np.zeros(3, np.int64))
    lm.length[:] = lengths
    rows = np.arange(3)
    for step in range(6):
        W = 4 if step % 2 == 0 else 1
        start = lm.length.copy()
        block = np.stack([seqs[r][s : s + W] for r, s in zip(rows, start, strict=True)])
        got = lm.forward(torch.from_numpy(block), start)  # [R, W, V]
        for i, r in enumerate(rows):
            full = model(input_ids=torch.from_numpy(seqs[r][None, : start[i] + W])).logits[0]
            torch.testing.assert_close(got[i], full[start[i] :], rtol=1e-6, atol=1e-6)  # eager: float32 softmax
        lm.length += rng.integers(0, W + 1, len(rows))  # keep a random prefix of the block
        if step == 2:  # drop the middle row
            lm.select(np.array([0, 2]))
            rows = rows[[0, 2]]


def test_check_model_accepts_supported(model):
    check_model(model)


def test_check_model_rejects_a_model_ignoring_position_ids(make_llama):
    class NoPositions(type(make_llama())):  # a model that drops position_ids
        def forward(self, *args, position_ids=None, **kwargs):
            return super().forward(*args, **kwargs)

    m = make_llama()
    torch.manual_seed(0)
    with torch.no_grad():  # large weights: attention, hence logits, depend on positions
        for prm in m.parameters():
            prm.normal_(0, 0.5)
    check_model(m)  # the same weights pass when positions are honoured
    m.__class__ = NoPositions
    with pytest.raises(ValueError, match="position"):
        check_model(m)


def test_unsupported_attention_implementation(make_llama):
    m = make_llama()
    m.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="sdpa"):
        CachedModel(m)


def test_common_start_uses_the_models_own_causal_mask(model):
    """Rows starting at the same slot (batch 1, or equal lengths) get no explicit mask."""
    rng = np.random.default_rng(1)
    seqs = rng.integers(0, model_vocab_size(model), (2, 20))
    lm = CachedModel(model)
    lm.reset(batch=2, capacity=20)
    at = 0
    for w in (5, 1, 3, 1, 2, 4):
        got = lm.forward(torch.from_numpy(seqs[:, at : at + w]), np.array([at, at]))
        full = model(input_ids=torch.from_numpy(seqs[:, : at + w])).logits[:, at:]
        torch.testing.assert_close(got, full, rtol=1e-6, atol=1e-6)
        assert lm.slots.uniform == at
        at += w


def test_advance_length_keeps_the_pending_tokens_and_the_kept_fed_drafts():
    """After a round a cache holds what it was fed and the row committed, never the last token used."""
    from speculate.domains.text.models.kv_cache import advance_length

    class Lengths:
        length = np.full(6, 10)

        @classmethod
        def keep(cls, n):
            cls.length = cls.length + n

    pending = np.array([1, 1, 2, 1, 1, 1])  # committed tokens fed before the drafts
    fed = np.array([3, 3, 2, 3, 0, 3])  # drafts fed after them
    n_accepted = np.array([3, 1, 2, 3, 0, 2])
    n_used = np.array([4, 2, 3, 1, 1, 0])  # row 3: EOS at the first kept draft; row 5: used nothing
    advance_length(Lengths, pending, fed, n_used, n_accepted)
    # all kept (+1+3), rejected after one (+1+1), two pending and both fed drafts kept, EOS: only
    # the pending token, nothing fed (+1), nothing used (no move)
    assert Lengths.length.tolist() == [14, 12, 14, 11, 11, 10]
