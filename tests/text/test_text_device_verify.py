"""Chains drafted and verified where the logits are (``verify_on_device``, speculate/verify/device.py),
run here on the CPU: the path a CUDA target takes, without a GPU.

- Same seed, same tokens: the device path draws the round's uniforms in the host path's order, so
  its output equals the host path's (Numba kernels) token for token, for the token, block and greedy
  rules, a draft model, n-gram drafts and Medusa heads (whose law is drawn on the host); the routes
  say where verification ran.
- The law of the first tokens equals the target's exact law (the chi-square test of
  ``test_text_exactness``: ALPHA = 1e-6 per test, power 0.99 at a joint TV of FAST_TV = 0.02).
- Greedy output equals the target's own greedy decoding; NaN logits raise (never passed on); a bad
  ``verify_on_device`` is refused.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.sampling import SamplingConfig

from tests.text.test_text_exactness import FAST_TV, PROMPTS, assert_law, rows_needed, sample_rows

BATCH = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]


def _draft(kind, make_llama, target):
    if kind == "model":
        return make_llama(layers=1, rng=1)
    if kind == "heads":  # Medusa heads: their law is a host Categorical, sent to the device to verify
        from tests.text.test_text_tree_drafts import _drafter
        return _drafter("heads", target)
    return "ngram"


@pytest.mark.parametrize("draft", ["model", "ngram", "heads"])
@pytest.mark.parametrize("verify", ["token", "block", "greedy"])
def test_device_path_gives_the_host_paths_tokens(make_llama, draft, verify):
    target = make_llama(init_std=0.3)
    d = _draft(draft, make_llama, target)
    kw = dict(max_new_tokens=24, eos_token_id=[], rng=11, temperature=0 if verify == "greedy" else 1.0)
    host = SpeculativeGenerator(target, d, lookahead=3, verify="block" if verify == "greedy" else verify)
    dev = SpeculativeGenerator(target, d, lookahead=3, verify="block" if verify == "greedy" else verify,
                               verify_on_device=True)
    a, b = host.generate(BATCH, **kw), dev.generate(BATCH, **kw)
    assert b.new_tokens == a.new_tokens
    assert set(b.stats.routes) == {f"{verify}-device"} and set(a.stats.routes) == {verify}
    assert 0 < b.stats.acceptance_rate < 1  # rejections happened: the residual draws were compared


@pytest.mark.parametrize("verify", ["token", "block"])
def test_output_law_is_the_targets(make_llama, verify):
    """Catches a TV deviation of FAST_TV = 0.02 of the joint law of 3 tokens with probability 0.99."""
    target = make_llama(eos=None)
    gen = SpeculativeGenerator(target, make_llama(layers=1, rng=1, eos=None), lookahead=3, verify=verify,
                               verify_on_device=True)
    cfg = SamplingConfig(temperature=1.0, top_k=4)
    laws = [continuation_law(target, prompt, 3, cfg, [0]) for prompt in PROMPTS]
    n = rows_needed(laws, FAST_TV)
    samples = sample_rows(gen, n, 3, cfg, [0], rng=zlib.crc32(f"device-{verify}".encode()))
    assert_law(laws, samples, FAST_TV)


def test_greedy_equals_the_targets_own(make_llama):
    target = make_llama(init_std=0.3)
    gen = SpeculativeGenerator(target, make_llama(layers=1, rng=2), lookahead=4, verify_on_device=True)
    out = gen.generate([[3, 1, 4]], max_new_tokens=20, temperature=0, eos_token_id=[])
    ids = torch.tensor([[3, 1, 4]])
    for _ in range(20):
        ids = torch.cat([ids, target(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert out.new_tokens[0] == ids[0, 3:].tolist()


def test_nan_logits_raise_and_bad_flag_is_refused(make_llama):
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram", lookahead=2, verify_on_device=True)  # checks the model once
    with torch.no_grad():
        target.lm_head.weight[3] = float("nan")  # broken after the check: the round must catch it
    with pytest.raises(ValueError, match="NaN"):
        gen.generate([[1, 2, 3]], max_new_tokens=5, rng=0, eos_token_id=[])
    with pytest.raises(ValueError, match="verify_on_device"):
        SpeculativeGenerator(make_llama(), "ngram", verify_on_device="yes")
