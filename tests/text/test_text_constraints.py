"""Constrained decoding (json_schema=, regex=, grammar=): exact law, validity, bad input.

The exact law of the first three constrained tokens is computed without the code under test: the
language of the regex is enumerated (16 strings), and a stateless processor masks each prefix to
the bytes that keep it a prefix of one of them (EOS once it is whole); ``continuation_law`` then
scores every prefix in float64. The sampled law must match it (chi-square at alpha 1e-6, sample size
for total variation 0.05 with power 0.99; one check per case: token and block rules x model and n-gram
drafts, two of the four under the ``slow`` marker).
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


def _case(target, draft, verify, tv=0.05, **kw):
    gen = SpeculativeGenerator(target, draft, lookahead=kw.pop("lookahead", 3), verify=verify, tokenizer=TOK, **kw)
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


@pytest.mark.parametrize(("verify", "kind"), [
    ("block", "model"), ("token", "ngram"),
    pytest.param("token", "model", marks=pytest.mark.slow), pytest.param("block", "ngram", marks=pytest.mark.slow)])
def test_the_constrained_law_is_the_constrained_targets(verify, kind):
    target = _target()
    draft = perturbed(target, scale=0.3) if kind == "model" else "ngram"
    check_conformance(_case(target, draft, verify), seed=11)


def test_the_constrained_law_with_token_trees():
    """Token trees (Medusa heads, a static tree of 2 x 2): every node masked with the state after its path."""
    from speculate.domains.text.training.heads import MedusaHeads

    target = _target()
    heads = MedusaHeads.for_target(target, n_heads=2).double().eval()
    check_conformance(_case(target, heads, "token", tree=[2, 2], lookahead=None), seed=13)


def test_a_target_masked_with_the_committed_state_is_caught(monkeypatch):
    """The bug this design guards against: every verified position masked with the state after the
    committed tokens (the drafts before it ignored)."""
    real = cmod.Constraints.chain_masks

    def stale(self, tokens, rows, drafts, first, J):
        one = real(self, tokens, rows, None, 0, 1)  # [R, 1, V]: the committed state's mask
        return np.repeat(one, J, axis=1)

    monkeypatch.setattr(cmod.Constraints, "chain_masks", stale)
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


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}


def _embedded_validity(n_rows: int):
    import re

    jsonschema = pytest.importorskip("jsonschema")
    from speculate.domains.text import load_pair

    target, draft, tok = load_pair()
    gen = SpeculativeGenerator(target, draft, lookahead=4, tokenizer=tok)
    prompts = ["def f():\n    return ", "config = ", "# a record\n", "x = "]
    out = gen.generate([prompts[i % 4] for i in range(n_rows)], max_new_tokens=96, rng=5, json_schema=SCHEMA,
                       batch_size=64)
    assert out.finish_reasons.count("stop") == n_rows  # compact JSON of this schema fits in 96 bytes
    for text in out.texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    regex = r"[a-z_]{1,12}\([0-9]{1,3}\)"
    out = gen.generate([prompts[i % 4] for i in range(n_rows)], max_new_tokens=24, rng=6, regex=regex, batch_size=64)
    assert out.finish_reasons.count("stop") == n_rows  # at most 17 bytes
    assert all(re.fullmatch(regex, t) for t in out.texts)


def test_the_embedded_pair_gives_valid_json_and_regex_matches():
    _embedded_validity(64)


@pytest.mark.slow
def test_a_thousand_generations_of_the_embedded_pair_are_valid():
    _embedded_validity(1000)


def test_speculate_decoding_and_the_cli_take_a_constraint(tmp_path):
    import subprocess
    import sys

    from speculate.domains.text import load_pair, speculate_decoding

    target, draft, tok = load_pair()
    ids = tok(["config = "], return_tensors="pt")
    out = target.generate(**ids, custom_generate=speculate_decoding, assistant_model=draft, grammar_tokenizer=tok,
                          json_schema=SCHEMA, max_new_tokens=96, do_sample=True, rng=0)
    text = tok.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True)
    assert set(json.loads(text)) == {"name", "n", "ok"}
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    r = subprocess.run([sys.executable, "-m", "speculate", "generate", "--prompt", "x = ", "--json-schema", str(schema),
                        "--max-new-tokens", "96", "--json", "--threads", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["finish_reasons"] == ["stop"] and set(json.loads(res["texts"][0])) == {"name", "n", "ok"}


class NoRepeat:
    """A user's constraint (the RowConstraint protocol): never the same token twice in a row."""

    def __init__(self):
        self.seen: list[int] = []

    def advance(self, tokens):
        for i, t in enumerate(tokens):
            if self.seen and t == self.seen[-1]:
                return i  # consumed the tokens before this one
            self.seen.append(int(t))
        return len(tokens)

    def rollback(self, n):
        del self.seen[len(self.seen) - n:]

    def allowed(self, vocab):
        ok = np.ones(vocab, bool)
        if self.seen:
            ok[self.seen[-1]] = False
        return ok


class NoRepeatOracle:
    """The same rule, stateless, from the prefix alone (for the exact law)."""

    def __init__(self, prompt_len):
        self.prompt_len = prompt_len

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for i, ids in enumerate(input_ids.tolist()):
            if len(ids) > self.prompt_len:
                out[i, ids[-1]] = float("-inf")
        return out


def test_a_users_own_constraint_has_the_exact_law():
    target = tiny_llama(vocab=16, dtype=torch.float64, init_std=0.3, rng=4)
    cfg = SamplingConfig(temperature=1.0, top_k=3, top_p=None)
    prompts = ([1, 5, 5, 2], [3, 3])
    law = {}
    for i, p in enumerate(prompts):
        tr = Transforms(cfg, user=[NoRepeatOracle(len(p))])
        law |= {(i, *s): w / 2 for s, w in continuation_law(target, p, 3, cfg, [], transforms=tr).items()}
    gen = SpeculativeGenerator(target, perturbed(target), lookahead=2, verify="block")

    def sample(count, seed):
        rng = np.random.default_rng(seed)
        which = rng.integers(0, 2, count)
        out = []
        for lo in range(0, count, 1024):
            part = which[lo : lo + 1024]
            res = gen.generate([prompts[w] for w in part], max_new_tokens=3, rng=rng, top_k=3, eos_token_id=[],
                               constraint=NoRepeat())
            out += [(int(w), *t) for w, t in zip(part, res.new_tokens, strict=True)]
        return out

    cells = sum(1 for w in law.values() if w > 0)
    check_conformance(ConformanceCase("a user's constraint (no repeat), block, top-k 3", sample, law,
                                      chi2_sample_size(0.05, cells)), seed=2)


@pytest.mark.parametrize("kind", ["model", "ngram", "early-exit:1", "medusa", "eagle"])
def test_every_chain_draft_decodes_greedily_like_plain_constrained_decoding(kind):
    from speculate.domains.text.training.feature_draft import FeatureDraft
    from speculate.domains.text.training.heads import MedusaHeads

    target = _target()
    draft = {"model": perturbed(target, scale=0.3), "ngram": "ngram", "early-exit:1": "early-exit:1",
             "medusa": MedusaHeads.for_target(target, n_heads=3).double().eval(),
             "eagle": FeatureDraft.for_target(target).double().eval()}[kind]
    prompts = ["id: ", "key=", "x"]
    regex = ["[ab][0-3][xy]", "(yes|no|maybe)", "[0-9]{2,5}"]
    plain = SpeculativeGenerator(target, "ngram", lookahead=0, tokenizer=TOK)
    want = plain.generate(prompts, max_new_tokens=8, temperature=0, regex=regex, eos_token_id=[EOS])
    gen = SpeculativeGenerator(target, draft, lookahead=3, tokenizer=TOK)
    got = gen.generate(prompts, max_new_tokens=8, temperature=0, regex=regex, eos_token_id=[EOS], batch_size=2)
    assert got.new_tokens == want.new_tokens and got.finish_reasons == want.finish_reasons == ["stop"] * 3
