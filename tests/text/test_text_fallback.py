"""A model speculate's position-indexed cache refuses runs through transformers' own cache, exactly.

The model forced onto the fallback is a tiny Llama whose ``forward`` drops ``position_ids``: the
fast path's probe refuses it (its logits differ from the uncached forward's), transformers' own
cache, which positions tokens by the cache's length, decodes it correctly. The law tests are those
of ``test_text_exactness.py`` (same prompts, same chi-square over all (prompt, continuation) cells,
ALPHA = 1e-6 per test, power 0.99 against a joint TV of 0.02): 3 tests here, so this file's
false-alarm rate is below 3e-6. Planted while writing them: a rollback that keeps the last
``start`` keys of a row instead of the first (stale slots visible) is refused by the fallback's
probe (the runtime then recomputes, and the mode assertion fails); with the probe bypassed, the
law tests fail on it (thousands of outcomes the law gives probability 0).
"""

from __future__ import annotations

import inspect
import warnings
import zlib

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.models.kv_cache import check_model
from speculate.domains.text.models.pick import FallbackWarning, pick_runtime
from speculate.domains.text.models.probe import CHECKS
from speculate.domains.text.models.transformers_api import TESTED, installed
from speculate.domains.text.models.transformers_cache import TransformersCacheModel
from speculate.domains.text.request.sampling import SamplingConfig
from transformers import LlamaForCausalLM

from tests.text.test_text_exactness import FAST_TV, PROMPTS, assert_law, rows_needed, sample_rows


class NoPositions(LlamaForCausalLM):
    """A Llama whose forward drops ``position_ids`` (its signature is Llama's)."""

    def forward(self, *args, position_ids=None, **kwargs):
        return super().forward(*args, **kwargs)

    forward.__signature__ = inspect.signature(LlamaForCausalLM.forward)


class LengthBiased(LlamaForCausalLM):
    """A Llama whose logits depend on how many tokens one call feeds: no cache can reproduce it."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        out.logits = out.logits + 0.5 * ids.shape[1]
        return out


def forced(model):
    model.__class__ = NoPositions
    return model


def fallback_generator(target, draft, **kw):
    with pytest.warns(FallbackWarning):
        return SpeculativeGenerator(target, draft, **kw)


def test_the_fallback_is_chosen_only_when_the_fast_path_refuses(make_llama):
    model = make_llama(eos=None)
    assert type(pick_runtime(model, "target")).__name__ == "CachedModel"
    forced(model)
    CHECKS.pop(model, None)
    with pytest.raises(ValueError, match="different logits") as e:
        check_model(model)
    assert installed() in str(e.value) and TESTED["floor"] in str(e.value)
    assert "pip install -c constraints.txt" in str(e.value)
    with pytest.warns(FallbackWarning) as w:
        lm = pick_runtime(model, "target")
    assert isinstance(lm, TransformersCacheModel) and lm.mode == "cache"
    msg = str(w[0].message)
    assert "transformers' own cache" in msg and "slower" in msg and installed() in msg


def test_a_model_no_cache_can_reproduce_is_refused_with_both_reasons(make_llama):
    model = make_llama(eos=None)
    model.__class__ = LengthBiased
    with pytest.raises(ValueError, match="transformers' own cache cannot decode it exactly either") as e:
        SpeculativeGenerator(model, "ngram")
    assert "different logits" in str(e.value) and installed() in str(e.value)


@pytest.mark.parametrize("mode", ["cache", "recompute"])
def test_fallback_logits_equal_the_uncached_forward(make_llama, mode):
    """Ragged rows (some sharing a start, so grouped), rollbacks, padded columns, one row leaving:
    every valid column's logits and features equal the model's own uncached forward."""
    model = forced(make_llama(eos=None))
    lm = TransformersCacheModel(model, mode)
    lm.capture = True
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 12, 20) for _ in range(4)]
    seqs[3][:4] = seqs[0][:4]
    lm.reset(4, 20)
    lm.forward(torch.tensor(np.stack([s[:4] for s in seqs])), np.zeros(4, np.int64), valid=np.array([4, 2, 3, 4]))
    lm.keep(np.array([4, 2, 3, 4]))
    rows = np.arange(4)
    feats = {}
    model.get_output_embeddings().register_forward_pre_hook(lambda m, a: feats.update(x=a[0]))
    for step in range(5):
        start = lm.length.copy()
        block = np.stack([seqs[r][s : s + 3] for r, s in zip(rows, start, strict=True)])
        valid = np.array([3, 2, 3, 3][: len(rows)])
        got = lm.forward(torch.from_numpy(block), start, valid=valid)
        got_feats = lm.features
        for i, r in enumerate(rows):
            ref = model(input_ids=torch.from_numpy(seqs[r][None, : start[i] + valid[i]])).logits[0]
            torch.testing.assert_close(got[i, : valid[i]], ref[start[i] :], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_feats[i, : valid[i]], feats["x"][0, start[i] :], rtol=1e-5, atol=1e-5)
        keep = rng.integers(0, valid + 1)  # keep a random prefix: the rest is rolled back
        keep[-1] = min(keep[-1], 1)  # and one row always rolls back at least one fed token
        lm.keep(keep)
        if step == 1:
            lm.select(np.array([0, 2, 3]))
            rows = rows[[0, 2, 3]]


def test_trees_are_refused_on_the_fallback(make_llama):
    lm = TransformersCacheModel(forced(make_llama(eos=None)))
    assert "token tree" in lm.tree_refusal()


# (draft, verify, temperature, top_k, top_p, eos, lookahead, n_new): the draft is forced onto the
# fallback too ("model"), or is the n-gram lookup; one case with the auto lookahead
CASES = [
    ("model", "block", 0.8, 3, 0.9, [0], 2, 3),
    ("ngram", "token", 1.0, 3, None, [], 3, 3),
    ("model", "token", 1.2, 3, None, [], "auto", 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_fallback_output_law_is_the_targets(make_llama, case):
    """Catches a TV deviation of 0.02 of the joint law with probability 0.99 (as the fast path's)."""
    kind, verify, t, k, p, eos, la, n_new = case
    target = forced(make_llama(eos=None))
    draft = forced(make_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=1)) if kind == "model" else "ngram"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        gen = SpeculativeGenerator(target, draft, lookahead=la, verify=verify, cost_ratio=0.3)
    assert isinstance(gen._target_lm, TransformersCacheModel) and gen._target_lm.mode == "cache"
    if kind == "model":
        assert isinstance(gen.draft.lm, TransformersCacheModel) and gen.draft.lm.mode == "cache"
    cfg = SamplingConfig(temperature=t, top_k=k, top_p=p)
    laws = [continuation_law(target, prompt, n_new, cfg, eos) for prompt in PROMPTS]
    n = rows_needed(laws, FAST_TV)
    samples = sample_rows(gen, n, n_new, cfg, eos, rng=zlib.crc32(str(case).encode()))
    assert_law(laws, samples, FAST_TV)


def test_no_runtime_passes_a_deprecated_cache_keyword(make_llama):
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns until 5.40, then
    fails): neither runtime may pass a keyword the installed release deprecates."""
    model = make_llama(eos=None)
    fallback = forced(make_llama(eos=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for lm in (pick_runtime(model), TransformersCacheModel(fallback, "cache")):
            lm.reset(2, 8)
            lm.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]), np.zeros(2, np.int64), valid=np.array([3, 2]))
            lm.keep(np.array([3, 2]))
            lm.forward(torch.tensor([[7], [8]]), lm.length.copy())
