"""model.generate(custom_generate=speculate_decoding): transformers' own generate() running our
decoding. Greedy equals plain generate(do_sample=False) on a ragged left-padded batch; sampled
tokens follow the target's law under the same processors (chi-square at ALPHA = 1e-6, rows to
catch a TV bias of 0.05 with probability 0.99, as in test_text_settings.py); a streamer receives
exactly the returned tokens, in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from speculate.domains.text import speculate_decoding
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.processors import Transforms
from speculate.domains.text.request.sampling import SamplingConfig
from transformers import RepetitionPenaltyLogitsProcessor
from transformers.generation.streamers import BaseStreamer

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import chi2_gof, chi2_sample_size

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]


def _batch(prompts, pad=0):
    W = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (W - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (W - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.fixture
def models(make_llama):
    target = make_llama(vocab=40, layers=2, rng=0)
    draft = make_llama(vocab=40, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    target.generation_config.pad_token_id = 0
    target.generation_config.eos_token_id = 3
    return target, draft


def test_greedy_equals_plain_generate(models):
    target, draft = models
    ids, mask = _batch(PROMPTS)
    ref = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=14)
    for d in ({"assistant_model": draft}, {"draft": "early-exit:1"}, {}):
        out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=14,
                              custom_generate=speculate_decoding, **d)
        assert torch.equal(out, ref), d
    ref_p = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=14,
                            repetition_penalty=1.5, no_repeat_ngram_size=2)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=14,
                          repetition_penalty=1.5, no_repeat_ngram_size=2, assistant_model=draft,
                          custom_generate=speculate_decoding)
    assert torch.equal(out, ref_p)
    res = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=14,
                          assistant_model=draft, custom_generate=speculate_decoding,
                          return_dict_in_generate=True)
    assert torch.equal(res.sequences, ref)


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_the_returned_tokens(models):
    target, draft = models
    rec = Recorder()
    torch.manual_seed(0)
    out = target.generate(input_ids=torch.tensor([PROMPTS[1]]), do_sample=True, top_p=0.9, max_new_tokens=20,
                          assistant_model=draft, custom_generate=speculate_decoding, streamer=rec)
    assert rec.ended == 1 and rec.puts[0] == PROMPTS[1]
    assert [t for p in rec.puts[1:] for t in p] == out[0, len(PROMPTS[1]):].tolist()
    assert len(rec.puts) > 2  # several rounds, several puts
    with pytest.raises(ValueError, match="batch size 1"):
        ids, mask = _batch(PROMPTS)
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, assistant_model=draft,
                        custom_generate=speculate_decoding, streamer=Recorder())


def test_sampled_law(models):
    target, draft = models
    target.generation_config.eos_token_id = None
    n_new, tv = 2, 0.05
    cfg = SamplingConfig(temperature=0.9, top_k=4, top_p=0.9)
    tr = Transforms(cfg, [RepetitionPenaltyLogitsProcessor(2.0)])
    laws = [continuation_law(target, p, n_new, cfg, transforms=tr) for p in PROMPTS]
    cells = sum(sum(1 for w in law.values() if w > 0) for law in laws)
    n = -(-chi2_sample_size(tv, cells, alpha=ALPHA, power=0.99) // len(PROMPTS))
    ids, mask = _batch(PROMPTS * n)
    torch.manual_seed(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.9, top_k=4,
                              top_p=0.9, repetition_penalty=2.0, max_new_tokens=n_new,
                              assistant_model=draft, custom_generate=speculate_decoding)
    finally:
        torch.set_num_threads(threads)
    W = ids.shape[1]
    stat, df = 0.0, 0
    for i, law in enumerate(laws):
        got = [tuple(r) for r in out[i :: len(PROMPTS), W:].tolist()]
        r = chi2_gof(got, law)
        assert np.isfinite(r.statistic), r.detail
        stat, df = stat + r.statistic, df + r.df
    assert stats.chi2.sf(stat, df) > ALPHA, f"chi2={stat:.1f} df={df}: biased"


@pytest.mark.parametrize("name", ["BART", "T5", "Marian"])
def test_encoder_decoders_through_generate(name):
    """generate() hands the decoding loop the decoder prompts and the encoder's input
    (``inputs_tensor``): greedy equals plain generate(do_sample=False) on a ragged, right-padded
    batch of different sources, with a draft model and with ngram; the dict output is the
    encoder-decoder one. (That the encoder input matters to these models, so that a row mix-up
    would show, is test_text_encoder_decoder.py's test_the_encoder_matters.)"""
    from families import family, perturbed, tiny_seq2seq

    target = tiny_seq2seq(family(name))
    draft = perturbed(target)
    gc = target.generation_config
    gc.forced_bos_token_id = gc.forced_eos_token_id = None  # not prefix-only: processors we refuse
    sources = [[4, 5, 6, 7, 8], [9, 3, 3], [10, 11, 12, 13, 14, 3, 4]]
    W = max(len(s) for s in sources)
    pad = int(target.config.pad_token_id or 0)
    ids = torch.tensor([s + [pad] * (W - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (W - len(s)) for s in sources])
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    ref = target.generate(**kw)
    for d in ({"assistant_model": draft}, {"draft": "ngram"}):
        out = target.generate(**kw, custom_generate=speculate_decoding, **d)
        assert torch.equal(out, ref), (name, d)
    res = target.generate(**kw, assistant_model=draft, custom_generate=speculate_decoding,
                          return_dict_in_generate=True)
    assert type(res).__name__ == "GenerateEncoderDecoderOutput" and torch.equal(res.sequences, ref)


def test_beam_search_is_refused_not_duplicated(models):
    """Regression: num_beams=2 returned [4, W + G] for 2 prompts (generate() had repeated each row
    per beam) and ran no beam search."""
    target, draft = models
    ids, mask = _batch(PROMPTS[:2])
    with pytest.raises(ValueError, match=r"beam search \(num_beams=2\)"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, num_beams=2,
                        do_sample=False, max_new_tokens=5, custom_generate=speculate_decoding)


@pytest.mark.parametrize("kw", [{}, {"lookahead": "auto", "cost_ratio": 0.3}, {"lookahead": 3}])
def test_seeded_runs_repeat(models, kw):
    """Regression: the default lookahead was 'auto' from measured timings and no cost_ratio could be
    given, so torch.manual_seed did not repeat a run as documented."""
    target, draft = models
    ids, mask = _batch(PROMPTS)
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        outs.append(target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=12,
                                    assistant_model=draft, custom_generate=speculate_decoding, **kw))
    assert torch.equal(outs[0], outs[1])
    a = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=12, rng=7,
                        assistant_model=draft, custom_generate=speculate_decoding, **kw)
    b = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=12, rng=7,
                        assistant_model=draft, custom_generate=speculate_decoding, **kw)
    assert torch.equal(a, b)
