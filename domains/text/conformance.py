"""Exact laws of short continuations, tiny test models, and the text domain's conformance cases.

:func:`continuation_law` computes, with full (uncached) forward passes of a float64 copy of the
target, the exact probability of every continuation of a prompt of up to ``n_new`` tokens under a
sampling setting (a continuation ends early at EOS). The speculative generator must sample from
exactly this law whatever the draft, the verification rule and the batch; ``tests/text`` and the
shared conformance suite compare the two with chi-square tests.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> _ = torch.manual_seed(0)
>>> m = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)).eval()
>>> law = continuation_law(m, [1, 2, 3], 2, SamplingConfig(top_k=2))
>>> len(law), round(sum(law.values()), 12)
(4, 1.0)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .sampling import SamplingConfig, probabilities

__all__ = ["PROMPTS", "conformance_cases", "continuation_law", "tiny_llama"]

#: three prompts of different lengths (rows get left-padded); the second repeats for n-gram lookups
PROMPTS = ([1, 5, 7], [3, 3, 9, 4, 3, 3], [8, 2])


def tiny_llama(vocab: int = 12, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32,
               attn: str = "sdpa", init_std: float = 0.2, eos: int | None = None) -> Any:
    """A random Llama built from a config (no download).

    ``init_std`` 0.2 (10x the usual) makes the next-token law depend clearly on the context and
    on positions, so that a caching or position bug changes the output law.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, bos_token_id=None, eos_token_id=eos, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation=attn, initializer_range=init_std,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


@torch.inference_mode()
def continuation_law(
    model: Any, prompt: Sequence[int], n_new: int, cfg: SamplingConfig,
    eos: Sequence[int] = (),
) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``n_new`` generated tokens (a continuation stops at EOS).

    Every prefix of positive probability is scored by a full forward pass (one batch per depth)
    of a float64 copy of ``model``; probabilities are the sampling transforms in float64.
    """
    m64 = copy.deepcopy(model).to(torch.float64).eval()
    dev = next(m64.parameters()).device
    stop = {int(e) for e in eos}
    law: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for depth in range(n_new):
        if not frontier:
            break
        ids = torch.tensor([[*prompt, *s] for s, _ in frontier], device=dev)  # [F, L + depth]
        logits = m64(input_ids=ids).logits[:, -1]  # [F, V]
        pr = probabilities(logits, cfg, dtype=torch.float64).cpu().numpy()  # [F, V]
        nxt = []
        for (seq, w), row in zip(frontier, pr, strict=True):
            for tok in np.flatnonzero(row > 0):
                s, pw = (*seq, int(tok)), w * float(row[tok])
                if int(tok) in stop or depth == n_new - 1:
                    law[s] = law.get(s, 0.0) + pw
                else:
                    nxt.append((s, pw))
        frontier = nxt
    return law


def _case(name: str, draft: str, verify: str, cfg: SamplingConfig, eos: list[int],
          lookahead: int | str, n_new: int = 2, n: int = 9000) -> Any:
    """A case whose outcome is (prompt index, first ``n_new`` tokens), the prompt drawn uniformly."""
    from speculate.testing import ConformanceCase

    from .generator import SpeculativeGenerator

    target = tiny_llama()
    d = tiny_llama(layers=1, hidden=16, heads=2, kv_heads=1, seed=1) if draft == "model" else draft
    gen = SpeculativeGenerator(target, d, lookahead=lookahead, verify=verify)
    law = {(i, *s): w / len(PROMPTS) for i, p in enumerate(PROMPTS)
           for s, w in continuation_law(target, p, n_new, cfg, eos).items()}

    def sample(count: int, seed: int) -> list[tuple[int, ...]]:
        rng = np.random.default_rng(seed)
        which = rng.integers(0, len(PROMPTS), count)
        L = max(len(p) for p in PROMPTS)
        ids = torch.tensor([[0] * (L - len(PROMPTS[w])) + PROMPTS[w] for w in which])
        mask = torch.tensor([[0] * (L - len(PROMPTS[w])) + [1] * len(PROMPTS[w]) for w in which])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = gen.generate(ids, attention_mask=mask, max_new_tokens=n_new, seed=rng,
                               temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                               eos_token_id=eos)
        finally:
            torch.set_num_threads(threads)
        return [(int(w), *t) for w, t in zip(which, out.new_tokens, strict=True)]

    return ConformanceCase(name=name, sample=sample, law=law, n=n)


def conformance_cases() -> list[Any]:
    """The text domain's cases for the shared exactness suite (``speculate.testing``).

    Each samples a batch of rows with prompts of different lengths through
    :class:`~speculate.domains.text.SpeculativeGenerator` on tiny random Llamas, and gives the exact law of
    (prompt, first two tokens) from :func:`continuation_law`. A few seconds each on one CPU core.
    """
    return [
        _case("text: model draft, block, T=0.8 top-k 6 top-p 0.9, EOS", "model", "block",
              SamplingConfig(0.8, 6, 0.9), [0], 2),
        _case("text: n-gram draft, token, top-k 5", "ngram", "token",
              SamplingConfig(1.0, 5, None), [], 3),
        _case("text: early-exit draft, block, T=1.2 top-k 6, auto lookahead", "early-exit:1",
              "block", SamplingConfig(1.2, 6, None), [], "auto"),
    ]
