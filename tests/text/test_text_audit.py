"""The text audit (speculate.domains.text.audit, `speculate audit`): its oracle is the exact law, its
adapters draw what the samplers draw, its refusals come before any sampling.

- The oracle equals ``continuation_law`` exactly (same float64 enumeration) and, for transformers'
  reading of the settings, an independent enumeration through transformers' OWN logits processors
  (``model._get_logits_processor``: the ones ``generate`` builds), to 1e-9, for every setting it
  accepts.
- Exact samplers pass: transformers' plain ``generate`` and assisted generation in plain settings,
  and our ``SpeculativeGenerator`` (token and block rules), each audited at the suite's level
  ``ALPHA`` (1e-6) sized for TV 0.1 at power 0.99. The false-alarm rate of the whole text pipeline
  (oracle + adapter + audit) is measured on plain ``generate``: 100 audits at level 0.05 must
  reject at most as often as a binomial(100, 0.05) allows at level ALPHA / 2 (two rate checks in
  this file, Bonferroni).
"""

from __future__ import annotations

import copy
import json
import sys
import textwrap

import numpy as np
import pytest
import torch
from scipy import stats
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.audit import (
    audit_generate,
    audit_speculate,
    hf_sampler,
    speculate_sampler,
    text_oracle,
)
from speculate.domains.text.audit_cli import main as audit_main
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.sampling import SamplingConfig

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import audit

PROMPT = [1, 5, 7, 1, 5]
V = 10


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_llama(vocab=V), tiny_llama(vocab=V, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)


def hf_enumeration(model, prompt, m, **kw):
    """The law of ``m`` new tokens by enumeration through transformers' own processors (float64)."""
    from transformers import LogitsProcessorList

    gc, _ = model._prepare_generation_config(None, max_new_tokens=m, **kw)
    m64 = copy.deepcopy(model).double()
    m64._prepare_special_tokens(gc, True, device="cpu")
    procs = m64._get_logits_processor(gc, input_ids_seq_length=len(prompt), encoder_input_ids=None,
                                      prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(),
                                      device="cpu", model_kwargs={})
    eos = set() if gc.eos_token_id is None else set(np.atleast_1d(gc.eos_token_id).tolist())
    law, frontier = {}, [((), 1.0)]
    with torch.no_grad():
        for depth in range(m):
            nxt = []
            for seq, w in frontier:
                ids = torch.tensor([[*prompt, *seq]])
                scores = procs(ids, m64(ids).logits[:, -1])[0]
                if gc.do_sample:
                    pr = scores.softmax(-1)
                else:
                    pr = torch.zeros_like(scores)
                    pr[scores.argmax()] = 1.0
                for t in torch.nonzero(pr > 0).flatten().tolist():
                    s = (*seq, t)
                    if t in eos or depth == m - 1:
                        law[s] = law.get(s, 0.0) + w * float(pr[t])
                    else:
                        nxt.append((s, w * float(pr[t])))
            frontier = nxt
    return law


HF_SETTINGS = [
    {},  # transformers' default: greedy
    {"do_sample": True},  # top_k 50 by default (>= V: no-op)
    {"do_sample": True, "temperature": 0.7, "top_k": 4, "top_p": 0.9},
    {"do_sample": True, "min_p": 0.15},
    {"do_sample": True, "typical_p": 0.8, "temperature": 1.3},
    {"do_sample": True, "repetition_penalty": 1.6, "no_repeat_ngram_size": 2, "bad_words_ids": [[3], [5, 6]]},
    {"do_sample": True, "min_new_tokens": 2, "eos_token_id": 0, "top_k": 5},
    {"do_sample": False, "repetition_penalty": 2.0},
]


@pytest.mark.parametrize("kw", HF_SETTINGS, ids=lambda k: ",".join(k) or "default")
def test_oracle_is_transformers_own_law(models, kw):
    target, _ = models
    law = text_oracle(target, PROMPT, 3, **kw)
    ref = hf_enumeration(target, PROMPT, 3, **kw)
    assert law.table.keys() == ref.keys()
    assert max(abs(law.table[k] - ref[k]) for k in ref) < 1e-9
    assert abs(sum(law.table.values()) - 1) < 1e-12


def test_oracle_is_continuation_law(models):
    target, _ = models
    cfg = SamplingConfig(temperature=0.8, top_k=4, top_p=0.95)
    law = text_oracle(target, PROMPT, 3, semantics="speculate", temperature=0.8, top_k=4, top_p=0.95, eos_token_id=[2])
    assert law.table == continuation_law(target, PROMPT, 3, cfg, [2])


# ----------------------------------------------------------------------------------- exact samplers


def test_transformers_plain_generate_false_alarm_rate(models):
    """100 audits of plain generate (sampling, top-k 4) at level 0.05: at most the binomial rate."""
    target, _ = models
    law = text_oracle(target, PROMPT, 2, do_sample=True, top_k=4)
    sampler = hf_sampler(target, PROMPT, 2, do_sample=True, top_k=4)
    sims = 100
    rej = sum(audit(sampler, law, tv=0.2, alpha=0.05, power=0.9, seed=s, progress=False).biased
              for s in range(sims))
    assert stats.binom.sf(rej - 1, sims, 0.05) > ALPHA / 2, f"{rej}/{sims} false alarms at level 0.05"


@pytest.mark.parametrize("variant", ["plain", "assisted", "prompt-lookup"])
def test_transformers_exact_variants_pass(models, variant):
    target, draft = models
    extra = {"plain": {}, "assisted": {"assistant_model": draft},
             "prompt-lookup": {"prompt_lookup_num_tokens": 2}}[variant]
    r = audit_generate(target, PROMPT, 2, do_sample=True, top_k=4, temperature=0.9, tv=0.1, alpha=ALPHA,
                       progress=False, **extra)
    assert r.verdict == "consistent", str(r)


@pytest.mark.parametrize("verify", ["token", "block"])
def test_speculative_generator_passes(models, verify):
    target, draft = models
    gen = SpeculativeGenerator(target, draft, lookahead=3, verify=verify)
    r = audit_speculate(gen, PROMPT, 3, top_k=3, eos_token_id=[0], tv=0.1, alpha=ALPHA, progress=False)
    assert r.verdict == "consistent", str(r)


def test_two_sample_mode_against_plain_generate(models):
    target, _ = models
    r = audit_generate(target, PROMPT, 2, reference="plain", do_sample=True, top_k=4, prompt_lookup_num_tokens=2,
                       tv=0.15, alpha=ALPHA, progress=False)
    assert r.mode == "two-sample" and r.verdict == "consistent", str(r)


# ------------------------------------------------------------------------------- bad input, refusals


class NoGenerate:
    """Counts generate calls: refusals must come before any."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __enter__(self):
        real = self.model.generate

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)

        self.model.generate = counted
        return self

    def __exit__(self, *exc):
        del self.model.generate


@pytest.mark.parametrize("kw, match", [
    ({"do_sample": True, "guidance_scale": 1.5}, "guidance_scale"),
    ({"do_sample": True, "num_beams": 2}, "num_beams"),
    ({"do_sample": True, "epsilon_cutoff": 3e-4}, "epsilon_cutoff"),
    ({"do_sample": True, "sequence_bias": {(3,): 2.0}}, "sequence_bias"),
    ({"do_sample": True, "suppress_tokens": [3]}, "suppress_tokens"),
    ({"do_sample": True, "foo": 1}, "foo"),
    ({"do_sample": True, "top_k": 0}, None),  # accepted: top_k 0 turns transformers' default 50 off
])
def test_settings_the_oracle_cannot_reproduce_are_refused_before_sampling(models, kw, match):
    target, _ = models
    with NoGenerate(target) as g:
        if match is None:
            audit_generate(target, PROMPT, 1, tv=0.3, progress=False, **kw)
            assert g.calls > 0
            return
        with pytest.raises((ValueError, TypeError), match=match):
            audit_generate(target, PROMPT, 2, progress=False, **kw)
        assert g.calls == 0


def test_watermark_refused(models):
    from transformers import WatermarkingConfig

    target, _ = models
    with pytest.raises(ValueError, match="watermarking_config"):
        text_oracle(target, PROMPT, 2, do_sample=True, watermarking_config=WatermarkingConfig())


def test_other_refusals(models):
    target, _ = models
    for kw, err, match in [
        ({"tokens": 0}, ValueError, "tokens"),
        ({"prompt": [1, 99]}, ValueError, "0..9"),
        ({"prompt": [1.5, 2.0]}, TypeError, "token ids"),
        ({"tokens": 7, "do_sample": True}, ValueError, "prefixes"),
        ({"semantics": "speculate", "stop_strings": ["x"]}, ValueError, "stop_strings"),
        ({"semantics": "speculate", "bogus": 1}, TypeError, "bogus"),
    ]:
        kw = {"prompt": PROMPT, "tokens": 2, **kw}
        with pytest.raises(err, match=match):
            text_oracle(target, kw.pop("prompt"), kw.pop("tokens"), **kw)


def test_running_past_eos_is_an_impossible_outcome(models):
    """A sampler that ignores EOS (transformers #47931's symptom) is rejected at once, the outcome named."""
    target, _ = models
    first = max(text_oracle(target, PROMPT, 1, do_sample=True, top_k=3).table.items(), key=lambda kv: kv[1])[0][0]
    law = text_oracle(target, PROMPT, 3, do_sample=True, top_k=3, eos_token_id=[first])  # the likeliest: EOS
    assert (first,) in law.table
    sampler = hf_sampler(target, PROMPT, 3, do_sample=True, top_k=3)  # no EOS in the model's config
    r = audit(sampler, law, progress=False)  # rows run past the EOS
    assert r.biased and r.impossible is not None and first in r.impossible[:-1] and r.pvalue == 0.0, str(r)


# ------------------------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def folders(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("audit_models")
    target, draft = models
    target.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    return root


def _run(capsys, *argv):
    code = audit_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_assisted_json(folders, capsys):
    code, out, _ = _run(capsys, "--target", str(folders / "target"), "--draft", str(folders / "draft"),
                        "--prompt-ids", "1,5,7,1,5", "--tokens", "2", "--top-k", "4", "--tv", "0.15", "--json")
    d = json.loads(out)
    assert code == 0 and d["report"]["verdict"] == "consistent", out
    assert d["versions"]["transformers"] and "assistant_model=<model>" in d["sampler"]
    assert d["command"].startswith("speculate audit --target")


def test_cli_speculate_and_text(folders, capsys):
    code, out, _ = _run(capsys, "--target", str(folders / "target"), "--draft", "ngram", "--sampler", "speculate",
                        "--prompt-ids", "1,5,7,1,5", "--tokens", "2", "--top-k", "4", "--temperature", "0.8",
                        "--tv", "0.15")
    assert code == 0 and "CONSISTENT" in out and "SpeculativeGenerator.generate" in out, out


def test_cli_user_function_and_refusals(folders, capsys, tmp_path, monkeypatch):
    (tmp_path / "my_samplers.py").write_text(textwrap.dedent("""
        def always_one(n, seed):          # a broken sampler: the same two tokens every time
            return [[1, 1]] * n
        def factory(target, draft, tokenizer, prompt, tokens, settings):
            from speculate.domains.text.audit import hf_sampler
            return hf_sampler(target, prompt, tokens, **settings)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["--target", str(folders / "target"), "--draft", "none", "--prompt-ids", "1,5,7", "--tokens", "2",
            "--top-k", "4", "--tv", "0.2"]
    code, out, _ = _run(capsys, *base, "--sampler", "my_samplers:always_one")
    assert code == 1 and "BIASED" in out, out
    code, out, _ = _run(capsys, *base, "--sampler", "my_samplers:factory")
    assert code == 0 and "CONSISTENT" in out, out
    code, _, err = _run(capsys, *base, "--sampler", "hf-plain", "--guidance-scale", "1.5")
    assert code == 2 and "guidance_scale" in err and "two-sample" in err
    code, _, err = _run(capsys, *base, "--sampler", "hf-assisted")
    assert code == 2 and "draft" in err
    sys.modules.pop("my_samplers", None)


def test_speculate_cli_forwards_audit(capsys):
    from speculate.cli import main

    with pytest.raises(SystemExit) as e:
        main(["audit", "--help"])
    assert e.value.code == 0 and "--sampler" in capsys.readouterr().out


def test_speculate_sampler_draws_new_tokens(models):
    target, draft = models
    gen = SpeculativeGenerator(target, draft, lookahead=2)
    rows = speculate_sampler(gen, PROMPT, 3, top_k=3)(5, 0)
    assert len(rows) == 5 and all(len(r) == 3 for r in rows)
