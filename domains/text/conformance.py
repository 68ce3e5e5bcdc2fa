"""The text domain's cases for the shared exactness suite, and the tiny test models they use.

Each case samples rows through :class:`~speculate.domains.text.SpeculativeGenerator` and compares
them with the exact law of :func:`~speculate.domains.text.continuation_law.continuation_law`.
:func:`tiny_llama` builds the small random Llamas of these cases and of ``tests/text``.

>>> cases = conformance_cases()
>>> [c.name for c in cases]                                   # doctest: +NORMALIZE_WHITESPACE
['text: model draft, block, T=0.8 top-k 6 top-p 0.9, EOS', 'text: n-gram draft, token, top-k 5',
 'text: early-exit draft, block, T=1.2 top-k 6, auto lookahead',
 'text: encoder-decoder (BART), encoder-decoder draft, block, top-k 3']
>>> all(c.detectable_tv() <= DEFAULT_TV for c in cases)       # TV caught with probability 0.99
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .continuation_law import continuation_law
from .request.sampling import SamplingConfig

__all__ = ["DEFAULT_TV", "PROMPTS", "SEQ2SEQ", "conformance_cases", "encoder_decoder_case", "model_case", "perturbed",
           "tiny_bart", "tiny_llama"]

#: sizes of the tiny BART-like encoder-decoders (BART, mBART, Marian, ...): ids 0..2 are BOS, pad, EOS
SEQ2SEQ: dict[str, Any] = dict(
    vocab_size=16, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
    bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    tie_word_embeddings=False)

#: three prompts of different lengths (rows get left-padded); the second repeats for n-gram lookups
PROMPTS = ([1, 5, 7], [3, 3, 9, 4, 3, 3], [8, 2])


def tiny_bart(seed: int = 0, dtype: torch.dtype = torch.float64, init_std: float = 0.3) -> Any:
    """A random BART (:data:`SEQ2SEQ`) in eval mode and ``dtype``: ``init_std`` 0.3 makes the decoder's
    law depend clearly on the encoder input (``tests/text/families.py`` builds the other families)."""
    from transformers import AutoConfig, BartForConditionalGeneration

    cfg = AutoConfig.for_model("bart", **SEQ2SEQ, init_std=init_std)
    torch.manual_seed(seed)
    return BartForConditionalGeneration(cfg).to(dtype).eval()


@torch.no_grad()
def perturbed(model: Any, scale: float = 0.3, seed: int = 1) -> Any:
    """A copy of ``model`` with every weight moved by ``scale`` times its own spread (a draft that
    agrees with the target often, but not always)."""
    import copy

    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    for p in d.parameters():
        if p.numel() > 1 and p.is_floating_point():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) * scale * p.std())
    return d


def tiny_llama(vocab: int = 12, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, rng: int | np.random.Generator | None = 0,
               dtype: torch.dtype = torch.float32, attn: str = "sdpa", init_std: float = 0.2,
               eos: int | None = None) -> Any:
    """A random Llama built from a config (no download).

    ``rng``: the weights' seed (an int seeds torch directly; a numpy Generator or None gives a
    seed for it). ``init_std`` 0.2 (10x the usual) makes the next-token law depend clearly on the
    context and on positions, so that a caching or position bug changes the output law.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    seed = rng if isinstance(rng, (int, np.integer)) else np.random.default_rng(rng).integers(2**63 - 1)
    torch.manual_seed(int(seed))
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, bos_token_id=None, eos_token_id=eos, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation=attn, initializer_range=init_std,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


#: the total-variation deviation the shared suite's cases catch with probability 0.99 at the
#: suite's level (``speculate.testing.DEFAULT_ALPHA``); ``tests/text`` runs them at 0.01 (slow)
DEFAULT_TV = 0.02
CHUNK = 20_000  # rows per generate call (bounds the memory of the caches)


def _case(name: str, draft: str, verify: str, cfg: SamplingConfig, eos: list[int],
          lookahead: int | str, tv: float, n_new: int = 2) -> Any:
    """A case on tiny random Llamas (see :func:`model_case`)."""
    target = tiny_llama()
    d = tiny_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=1) if draft == "model" else draft
    return model_case(name, target, d, verify, cfg, eos, lookahead, tv, n_new=n_new)


def model_case(name: str, target: Any, draft: Any, verify: str, cfg: SamplingConfig, eos: list[int],
               lookahead: int | str, tv: float, prompts: tuple[list[int], ...] = PROMPTS,
               n_new: int = 2) -> Any:
    """A case whose outcome is (prompt index, first ``n_new`` tokens), the prompt drawn uniformly
    from ``prompts`` and rows of all prompts left-padded in every batch; its law from
    :func:`continuation_law`, with as many samples as catch a deviation of total variation ``tv``
    (``chi2_sample_size``)."""
    from speculate.testing import ConformanceCase, chi2_sample_size

    from .api import SpeculativeGenerator

    gen = SpeculativeGenerator(target, draft, lookahead=lookahead, verify=verify)
    law = {(i, *s): w / len(prompts) for i, p in enumerate(prompts)
           for s, w in continuation_law(target, p, n_new, cfg, eos).items()}

    def sample(count: int, seed: int) -> list[tuple[int, ...]]:
        rng = np.random.default_rng(seed)
        which = rng.integers(0, len(prompts), count)
        L = max(len(p) for p in prompts)
        out: list[tuple[int, ...]] = []
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for lo in range(0, count, CHUNK):
                part = which[lo : lo + CHUNK]
                ids = torch.tensor([[0] * (L - len(prompts[w])) + prompts[w] for w in part])
                mask = torch.tensor([[0] * (L - len(prompts[w])) + [1] * len(prompts[w]) for w in part])
                res = gen.generate(ids, attention_mask=mask, max_new_tokens=n_new, rng=rng,
                                   temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                   eos_token_id=eos)
                out += [(int(w), *t) for w, t in zip(part, res.new_tokens, strict=True)]
        finally:
            torch.set_num_threads(threads)
        return out

    cells = sum(1 for w in law.values() if w > 0)
    return ConformanceCase(name=name, sample=sample, law=law, n=chi2_sample_size(tv, cells))


def encoder_decoder_case(name: str, target: Any, draft: Any, verify: str, cfg: SamplingConfig,
                         eos: list[int], lookahead: int | str, tv: float,
                         sources: Sequence[tuple[Any, list[int]]], n_new: int = 2,
                         alpha: float | None = None) -> Any:
    """A case for an encoder-decoder ``target``: the outcome is (source index, first ``n_new``
    tokens), the source drawn uniformly from ``sources`` and rows of every source mixed in every
    batch. A source is (encoder input, decoder prompt): token ids (a list; rows are right-padded
    with an attention mask) or features ``[F, T]`` (speech encoders), and the row's decoder prompt
    (decoder start first; of different lengths, so that rows sit at different positions). The law
    is :func:`continuation_law` of each source alone, by full forward passes. ``alpha``: the level
    the sample size is computed for (default the suite's; lower for a Bonferroni correction)."""
    from speculate.testing import DEFAULT_ALPHA, ConformanceCase, chi2_sample_size

    from .api import SpeculativeGenerator

    gen = SpeculativeGenerator(target, draft, lookahead=lookahead, verify=verify)
    speech = isinstance(sources[0][0], torch.Tensor)

    def one(src: Any) -> dict[str, torch.Tensor]:
        return {"input_features": src[None]} if speech else {"input_ids": torch.tensor([src])}

    law = {(i, *s): w / len(sources) for i, (src, dec) in enumerate(sources)
           for s, w in continuation_law(target, dec, n_new, cfg, eos, encoder_inputs=one(src)).items()}

    def sample(count: int, seed: int) -> list[tuple[int, ...]]:
        rng = np.random.default_rng(seed)
        which = rng.integers(0, len(sources), count)
        out: list[tuple[int, ...]] = []
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for lo in range(0, count, CHUNK):
                part = which[lo : lo + CHUNK]
                enc: dict[str, Any] = (
                    {"input_features": torch.stack([sources[w][0] for w in part])} if speech
                    else {"input_ids": [sources[w][0] for w in part]})
                res = gen.generate(**enc, decoder_input_ids=[sources[w][1] for w in part],
                                   max_new_tokens=n_new, rng=rng, temperature=cfg.temperature,
                                   top_k=cfg.top_k, top_p=cfg.top_p, eos_token_id=eos)
                out += [(int(w), *t) for w, t in zip(part, res.new_tokens, strict=True)]
        finally:
            torch.set_num_threads(threads)
        return out

    cells = sum(1 for w in law.values() if w > 0)
    n = chi2_sample_size(tv, cells, alpha=DEFAULT_ALPHA if alpha is None else alpha)
    return ConformanceCase(name=name, sample=sample, law=law, n=n)


def conformance_cases(tv: float = DEFAULT_TV) -> list[Any]:
    """The text domain's cases for the shared exactness suite (``speculate.testing``).

    Each samples a batch of rows with prompts of different lengths through
    :class:`~speculate.domains.text.SpeculativeGenerator` on tiny random Llamas, and gives the exact law of
    (prompt, first two tokens) from :func:`continuation_law`, with enough samples (50,000 to
    90,000) to catch a deviation of total variation ``tv`` with probability 0.99 at level 1e-6
    (``ConformanceCase.detectable_tv``). About 5-8 s of CPU each at the default 0.02. The last case
    is an encoder-decoder (BART) with rows of different encoder inputs in every batch.
    """
    return [
        _case("text: model draft, block, T=0.8 top-k 6 top-p 0.9, EOS", "model", "block",
              SamplingConfig(0.8, 6, 0.9), [0], 2, tv),
        _case("text: n-gram draft, token, top-k 5", "ngram", "token",
              SamplingConfig(1.0, 5, None), [], 3, tv),
        _case("text: early-exit draft, block, T=1.2 top-k 6, auto lookahead", "early-exit:1",
              "block", SamplingConfig(1.2, 6, None), [], "auto", tv),
        _seq2seq_case(tv),
    ]


def _seq2seq_case(tv: float) -> Any:
    """Two sources of different lengths (rows right-padded) with decoder prompts of 1 and 3 tokens,
    a tiny random BART target and a perturbed copy as the draft (its own encoder): the law of
    (source, first two tokens), 18 cells, about 52,000 rows at TV 0.02."""
    target = tiny_bart(dtype=torch.float32)
    return encoder_decoder_case(
        "text: encoder-decoder (BART), encoder-decoder draft, block, top-k 3", target, perturbed(target),
        "block", SamplingConfig(1.0, 3, None), [], 2, tv, [([4, 5, 6, 7, 8], [2]), ([9, 3, 3], [2, 5, 6])])
