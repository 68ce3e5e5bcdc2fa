"""Tiny random causal LMs built from configs (no downloads), shared by the text-generation tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 12, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32,
               attn: str = "sdpa", init_std: float = 0.2, eos: int | None = None) -> LlamaForCausalLM:
    """A random Llama. ``init_std`` 0.2 (10x the usual) makes the next-token law depend clearly
    on the context and on positions, so that a caching or position bug changes the output law."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, bos_token_id=None, eos_token_id=eos, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation=attn, initializer_range=init_std,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture
def make_llama():
    return tiny_llama


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
