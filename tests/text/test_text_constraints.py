"""Constrained decoding (json_schema=, regex=, grammar=): exact law, validity, bad input.

The exact law of the first three constrained tokens is computed without the code under test: the
language of the regex is enumerated (16 strings), and a stateless processor masks each prefix to
the bytes that keep it a prefix of one of them (EOS once it is whole); ``continuation_law`` then
scores every prefix in float64. The sampled law must match it (chi-square at alpha 1e-6, sample size
for total variation 0.05 with power 0.99; 4 checks: token and block rules x model and n-gram drafts).
Planted bugs must be caught: the target masked with the state after the committed tokens only (loud:
a committed token the state refuses raises), and the mask applied after top-p (silent: valid text,
wrong law; the chi-square test fails).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from speculate.domains.text import ByteTokenizer, SpeculativeGenerator
from speculate.domains.text.conformance import perturbed, tiny_llama
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request import constraints as cmod
from speculate.domains.text.request.processors import Transforms
from speculate.domains.text.request.sampling import SamplingConfig

from speculate.testing import ConformanceCase, check_conformance, chi2_sample_size

pytest.importorskip("llguidance")

TOK = ByteTokenizer()
EOS = TOK.eos_token_id
REGEX = "[ab][0-3][xy]"
LANGUAGE = [f"{a}{d}{c}" for a in "ab" for d in "0123" for c in "xy"]
PROMPTS = ([TOK.bos_token_id, *b"id: "], [TOK.bos_token_id, *b"key="])
CFG = SamplingConfig(temperature=0.9, top_k=None, top_p=0.95)


class LanguageMask:
    """The oracle: bytes that keep the generated text a prefix of a string of LANGUAGE; EOS once whole."""

    def __init__(self, prompt_len: int) -> None:
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        for i, ids in enumerate(input_ids.tolist()):
            done = bytes(ids[self.prompt_len:]).decode("latin-1")
            ok = {ord(s[len(done)]) for s in LANGUAGE if s.startswith(done) and len(s) > len(done)}
            ok |= {EOS} if done in LANGUAGE else set()
            for t in ok:
                out[i, t] = scores[i, t]
        return out


def _target():
    return tiny_llama(vocab=259, hidden=32, layers=2, dtype=torch.float64, init_std=0.3, rng=3)


def _law(target):
    law = {}
    for i, p in enumerate(PROMPTS):
        tr = Transforms(CFG, user=[LanguageMask(len(p))])
        for s, w in continuation_law(target, p, 3, CFG, [EOS], transforms=tr).items():
            law[(i, *s)] = w / len(PROMPTS)
    return law


def _case(target, draft, verify, tv=0.05):
    gen = SpeculativeGenerator(target, draft, lookahead=3, verify=verify, tokenizer=TOK)
    law = _law(target)

    def sample(count, seed):
        rng = np.random.default_rng(seed)
        which = rng.integers(0, len(PROMPTS), count)
        out = []
        for lo in range(0, count, 512):
            part = which[lo : lo + 512]
            res = gen.generate([list(PROMPTS[w]) for w in part], max_new_tokens=3, rng=rng, eos_token_id=[EOS],
                               temperature=CFG.temperature, top_p=CFG.top_p, regex=REGEX)
            out += [(int(w), *t) for w, t in zip(part, res.new_tokens, strict=True)]
        return out

    cells = sum(1 for w in law.values() if w > 0)
    return ConformanceCase(name=f"constrained {verify} {draft if isinstance(draft, str) else 'model'}",
                           sample=sample, law=law, n=chi2_sample_size(tv, cells))


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_the_constrained_law_is_the_constrained_targets(verify, kind):
    target = _target()
    draft = perturbed(target, scale=0.3) if kind == "model" else "ngram"
    check_conformance(_case(target, draft, verify), seed=11)


def test_a_target_masked_with_the_committed_state_is_caught(monkeypatch):
    """The bug this design guards against: every verified position masked with the state after the
    committed tokens (the drafts before it ignored)."""
    real = cmod.Constraints.masks

    def stale(self, tokens, rows, extras):
        return real(self, tokens, rows, [e[:0] for e in extras])

    monkeypatch.setattr(cmod.Constraints, "masks", stale)
    target = _target()
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        check_conformance(_case(target, perturbed(target, scale=0.3), "block"), seed=11)


def test_a_mask_applied_after_top_p_is_caught(monkeypatch):
    """A silent bug (valid text, wrong law): top-p cut on the unconstrained law, the mask applied after."""
    from speculate.domains.text.request import processors

    real = processors.Transforms.probs

    def late(self, logits, tokens, rows, drafts, first=0, dtype=torch.float32):
        cons, self.constraints = self.constraints, None
        try:
            p = real(self, logits, tokens, rows, drafts, first, dtype)  # top-p without the mask
        finally:
            self.constraints = cons
        if cons is None:
            return p
        right = real(self, logits, tokens, rows, drafts, first, dtype)
        p = p * (right > 0)
        total = p.sum(-1, keepdim=True)
        return torch.where(total > 0, p / total.clamp_min(1e-30), right)  # where top-p left nothing: the right law

    monkeypatch.setattr(processors.Transforms, "probs", late)
    target = _target()
    with pytest.raises(AssertionError):
        check_conformance(_case(target, perturbed(target, scale=0.3), "block"), seed=11)


def test_json_schema_output_parses_and_validates():
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                                "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"], "additionalProperties": False}
    target = _target()
    gen = SpeculativeGenerator(target, perturbed(target, scale=0.3), lookahead=3, tokenizer=TOK)
    out = gen.generate(["A record: "] * 16, max_new_tokens=60, rng=0, json_schema=schema, eos_token_id=[EOS])
    for text, reason in zip(out.texts, out.finish_reasons, strict=True):
        if reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:  # the budget ended mid-object: a prefix, never presented as finished
            assert reason == "length"
    assert out.finish_reasons.count("stop") >= 8


def test_one_constraint_per_row_and_regex_matches():
    import re

    target = _target()
    gen = SpeculativeGenerator(target, "ngram", lookahead=3, tokenizer=TOK)
    out = gen.generate(["x", "y", "z"], max_new_tokens=12, rng=1, regex=["[0-9]{3}", "(yes|no)", None],
                       eos_token_id=[EOS])
    assert re.fullmatch("[0-9]{3}", out.texts[0]) and re.fullmatch("(yes|no)", out.texts[1])
    assert out.finish_reasons[:2] == ["stop", "stop"]


@pytest.mark.parametrize("kw, match", [
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"regex": "[a-"}, "regex of row 0"),
    ({"grammar": "start: ???"}, "grammar of row 0"),
    ({"regex": "a", "json_schema": {}}, "one of json_schema=, regex=, grammar="),
    ({"regex": ["a", "b"]}, "2 constraints for 1 prompts"),
])
def test_bad_constraints_are_refused_before_any_work(kw, match):
    gen = SpeculativeGenerator(_target(), "ngram", tokenizer=TOK)
    with pytest.raises((ValueError, TypeError), match=match):
        gen.generate(["x"], max_new_tokens=4, rng=0, **kw)


def test_a_constraint_needs_the_tokenizer():
    gen = SpeculativeGenerator(_target(), "ngram")
    with pytest.raises(ValueError, match="needs the generator's tokenizer"):
        gen.generate([[1, 2]], max_new_tokens=4, regex="a+")
