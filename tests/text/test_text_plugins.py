"""Conformance over every plug-in of the text domain: each model runtime (``models/``) and each kind
of draft (``drafts/``), Gymnasium-style: one table, the same checks for every entry.

- Every runtime implements ``ModelRuntime`` and passes the one probe (ragged rows, a rollback, a
  dropped row, one row alone, against the model's own uncached forward); a runtime with a planted
  rollback bug fails it.
- Every kind of ``drafts.factory.KINDS`` is a ``Draft`` made by the factory from what users pass
  (the table must name every kind: a new kind without a row here fails), and decodes greedily
  exactly like its target.
- A new kind of draft is one class and one ``register_draft`` line (here: this file alone), and
  passes the exact-law check at TV 0.05 (alpha 1e-6, power 0.99, one check); the generator's own
  modules name no draft class and no runtime class.
"""

from __future__ import annotations

import ast
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import model_case, perturbed, tiny_bart, tiny_llama
from speculate.domains.text.drafts import KINDS, Draft, Drafted, make_draft, register_draft
from speculate.domains.text.drafts.eagle import EagleDraft
from speculate.domains.text.drafts.medusa import MedusaDraft
from speculate.domains.text.drafts.model import EarlyExitDraft, ModelDraft
from speculate.domains.text.drafts.ngram import NgramDraft
from speculate.domains.text.drafts.seq2seq import Seq2SeqDraft
from speculate.domains.text.drafts.suffix import SuffixDraft
from speculate.domains.text.models import encoder_decoder, kv_cache, lean_llama, lean_seq2seq, transformers_cache
from speculate.domains.text.models.probe import probe
from speculate.domains.text.models.runtime import ModelRuntime
from speculate.domains.text.request.sampling import SamplingConfig
from speculate.domains.text.training.feature_draft import FeatureDraft
from speculate.domains.text.training.heads import MedusaHeads

from speculate.testing import check_conformance

TEXT = Path(__file__).resolve().parents[2] / "domains" / "text"


def _llama():
    return tiny_llama(vocab=16, dtype=torch.float64, init_std=0.3)


#: every runtime, with the model it serves and its encoder step (encoder-decoders)
RUNTIMES = {
    "CachedModel": (kv_cache.CachedModel, _llama, None),
    "TransformersCacheModel (cache)": (partial(transformers_cache.TransformersCacheModel, mode="cache"), _llama, None),
    "TransformersCacheModel (recompute)": (partial(transformers_cache.TransformersCacheModel, mode="recompute"),
                                           _llama, None),
    "LeanLlama (static steps)": (lean_llama._static, _llama, None),
    "CachedSeq2Seq": (encoder_decoder.CachedSeq2Seq, tiny_bart, encoder_decoder.probe_encoder),
    "LeanSeq2Seq": (lean_seq2seq.LeanSeq2Seq, tiny_bart, encoder_decoder.probe_encoder),
}


@pytest.mark.parametrize("name", RUNTIMES)
def test_every_runtime_implements_the_protocol_and_passes_the_probe(name):
    make, build, encoder = RUNTIMES[name]
    model = build()
    assert isinstance(make(model), ModelRuntime)
    assert probe(model, make, encoder) is None


@pytest.mark.parametrize("bug", ["one start for all rows", "a rolled-back slot stays visible"])
def test_the_probe_refuses_a_runtime_with_a_planted_bug(bug):
    class Buggy(kv_cache.CachedModel):
        def forward(self, tokens, start, *args, **kw):
            start = np.asarray(start)
            if bug == "one start for all rows":  # ragged rows written and positioned at row 0's start
                start = np.full_like(start, start[0])
            elif len(start) == 2 and tokens.shape[1] == 3 and start.tolist() == [5, 5]:  # row 0 after its rollback
                start = np.array([7, 5])  # reads (and writes past) the two slots it rolled back
            return super().forward(tokens, start, *args, **kw)

    assert "different logits" in (probe(_llama(), Buggy) or "")


def _specs():
    """What users pass as ``draft=`` for each kind, with the target it serves."""
    target = _llama()
    bart = tiny_bart()
    return {
        NgramDraft: ("ngram:2", target),
        SuffixDraft: ("suffix", target),
        EarlyExitDraft: ("early-exit:1", target),
        ModelDraft: (perturbed(target), target),
        MedusaDraft: (MedusaHeads.for_target(target, n_heads=3).double().eval(), target),
        EagleDraft: (FeatureDraft.for_target(target).double().eval(), target),
        Seq2SeqDraft: (perturbed(bart), bart),
    }


def test_the_factory_makes_every_kind():
    specs = _specs()
    assert set(KINDS) == set(specs), "a kind of draft without a row in _specs"
    for kind, (spec, target) in specs.items():
        assert issubclass(kind, Draft) and "from_spec" in kind.__dict__
        assert any("propose" in vars(c) for c in kind.__mro__ if c is not Draft)
        assert type(make_draft(spec, target)) is kind


@pytest.mark.parametrize("kind", [NgramDraft, SuffixDraft, EarlyExitDraft, ModelDraft, MedusaDraft, EagleDraft])
def test_every_decoder_only_kind_decodes_greedily_like_its_target(kind):
    spec, target = _specs()[kind]
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ids = torch.tensor([prompt])
    want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    gen = SpeculativeGenerator(target, spec, lookahead=3)
    assert gen.generate([prompt], max_new_tokens=12, temperature=0, eos_token_id=[], rng=0).new_tokens[0] == want


class RepeatLast(Draft):
    """A new kind of draft: the row's last token again, ``k`` times, as point masses."""

    @classmethod
    def from_spec(cls, draft, target, options):
        return cls() if draft == "repeat-last" else None

    def propose(self, rows, tokens, k, need, cfg, rng, vocab):
        last = tokens.ids[rows, tokens.n[rows] - 1]  # [R]
        return Drafted(np.repeat(last[:, None], k, axis=1), None, np.minimum(need - 1, k))  # q None: point masses


@pytest.fixture
def repeat_last():
    register_draft(RepeatLast)  # the one registration line
    yield
    KINDS.remove(RepeatLast)


def test_a_new_kind_of_draft_is_one_class_and_one_line(repeat_last):
    target = tiny_llama(vocab=8, dtype=torch.float64)
    gen = SpeculativeGenerator(target, "repeat-last", lookahead=2)
    assert type(gen.draft) is RepeatLast and gen.lookahead == 2
    out = gen.generate([[1, 1, 1, 2]], max_new_tokens=6, rng=0)
    assert len(out.new_tokens[0]) == 6 and out.stats.rounds >= 1
    case = model_case("a new kind: repeat-last, block, T=1 top-k 4", target, "repeat-last", "block",
                      SamplingConfig(1.0, 4, None), [], 2, tv=0.05, prompts=([1, 1, 1], [2, 3, 2, 2]))
    assert case.detectable_tv() <= 0.05
    check_conformance(case, seed=3)  # alpha 1e-6


def test_the_generator_names_no_draft_class_and_no_runtime_class():
    """What makes "one new file plus one registration line" true: the generator, its modes and the
    process reach drafts through the base class and the factory, models through the runtime protocol."""
    banned = {k.__name__ for k in KINDS} | {"MedusaHeads", "FeatureDraft", "SourceNgramDraft", "CachedModel",
                                            "CachedSeq2Seq", "LeanLlama", "LeanSeq2Seq", "TransformersCacheModel"}
    for module in ("api.py", "generation.py", "process.py"):
        tree = ast.parse((TEXT / module).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not names & banned, f"{module} names {sorted(names & banned)}"
