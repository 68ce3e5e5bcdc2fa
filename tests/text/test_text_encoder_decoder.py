"""Encoder-decoder targets: the conformance matrix over ``families.ENCODER_DECODER``, drafts, errors.

Every row marked ``fixed`` (T5, Flan-T5, BART, mBART, Marian, Whisper) is built as a tiny random
model from its config (float64; init std 0.3, T5 factor 1.5, so that the decoder's law depends
clearly on the encoder input: ``test_the_encoder_matters`` asserts a total variation >= 0.25
between the continuation laws of every two sources) with a draft that is a perturbed copy (its own
encoder, run on the same inputs). Three sources per family: token ids of 5, 3 and 7 tokens (rows
right-padded with an attention mask), or three random log-mel feature tensors for Whisper, each
with its own decoder prompt of 1, 3 and 2 tokens (rows start at different decoder positions).

- greedy: a batch of four rows with different encoder inputs and ragged decoder prompts, 16 new
  tokens, lookahead 3: every row equals plain greedy decoding of the target on that row alone
  (argmax of full forward passes); with an EOS id that stops rows at different rounds, the
  finished rows are dropped from the caches and the others keep their own encoder outputs.
- law: the first three sampled tokens (a round verifies two drafts, so the block rule differs from
  the token rule) of rows mixing the three sources, against ``continuation_law`` (full forward
  passes in float64; top-k 3, 81 cells), for the token and block rules: a chi-square test per
  test at level ``ALPHA / MATRIX`` (Bonferroni over the MATRIX = 12 tests of the matrix, so the
  matrix's family-wise level is the suite's ALPHA = 1e-6). Power: each test catches a deviation of
  total variation FAST_TV = 0.1 of the joint law of (source, continuation) with probability 0.99
  in the default run, SLOW_TV = 0.03 under ``slow``. A row that read another row's encoder output
  deviates by at least a third of the smallest TV between two sources' laws (>= 0.25 / 3 for a
  whole source; more for the usual off-by-one mix-ups that swap several rows).
- drafts of each kind: another encoder-decoder (the matrix), a distil-whisper-style
  ``WhisperForCausalLM`` that reads the target's encoder output, ``"ngram"`` (decoder tokens, then
  the source ids) and ``"early-exit:N"``; each by greedy equality and the law of three tokens.
- errors: every request that cannot work raises ``ValueError`` naming the family and the reason
  before any forward pass.
"""

from __future__ import annotations

import copy
import functools
import re
import zlib
from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
import torch
from families import ENCODER_DECODER, family, perturbed, tiny_seq2seq
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import encoder_decoder_case, tiny_llama
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.drafts.factory import make_draft
from speculate.domains.text.drafts.ngram import SourceNgramDraft
from speculate.domains.text.models.encoder_decoder import decoder_layers_path
from speculate.domains.text.request.inputs import EncoderInputs
from speculate.domains.text.request.sampling import SamplingConfig
from speculate.domains.text.request.tokens import TokenBuffer
from transformers import WhisperConfig, WhisperForCausalLM

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import check_conformance

SUPPORTED = [f for f in ENCODER_DECODER if f.status in ("works", "fixed")]
REFUSED = [f for f in ENCODER_DECODER if f.status == "refused"]
RULES = ("token", "block")
MATRIX = len(SUPPORTED) * len(RULES)
ALPHA_EACH = ALPHA / MATRIX  # Bonferroni over the matrix
FAST_TV, SLOW_TV = 0.1, 0.03
SAMPLING = SamplingConfig(temperature=1.0, top_k=3)
TEXT_SOURCES = ([4, 5, 6, 7, 8], [9, 3, 3], [10, 11, 12, 13, 14, 3, 4])
GREEDY_SOURCES = ([4, 5, 6, 7, 8], [9, 3, 3], [10, 11, 12, 13, 14, 3, 4], [6])


@functools.cache
def _pair(name: str):
    target = tiny_seq2seq(family(name))
    return target, perturbed(target)


def _start(model) -> int:
    return int(model.config.decoder_start_token_id)


def _features(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 16, generator=g, dtype=torch.float64) for _ in range(n)]


def _sources(fam, model, n: int = 3):
    """(encoder input, decoder prompt) per source: different inputs, ragged decoder prompts."""
    st = _start(model)
    enc = _features(n, 5) if fam.model_type == "whisper" else (GREEDY_SOURCES if n == 4 else TEXT_SOURCES)
    decs = ([st], [st, 5, 6], [st, 9], [st, 7, 8, 9, 10])[:n]
    return list(zip(enc, decs, strict=True))


def _one(src) -> dict:
    return {"input_features": src[None]} if isinstance(src, torch.Tensor) else {"input_ids": torch.tensor([src])}


def _batch(sources) -> dict:
    if isinstance(sources[0][0], torch.Tensor):
        return {"input_features": torch.stack([s for s, _ in sources])}
    return {"input_ids": [s for s, _ in sources]}


def _greedy(model, src, dec, n, eos=()):
    seq = list(dec)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(**_one(src), decoder_input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] in eos:
                break
    return seq


@functools.cache
def _laws(name: str, draft_kind: str = "model"):
    target, _ = _pair(name)
    return [continuation_law(target, dec, 3, SAMPLING, [], encoder_inputs=_one(src))
            for src, dec in _sources(family(name), target)]


def _single_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------
# the matrix


@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_the_encoder_matters(fam):
    """Different encoder inputs give clearly different decoder laws, so a row mix-up is caught."""
    laws = _laws(fam.name)
    for a, b in combinations(range(len(laws)), 2):
        keys = set(laws[a]) | set(laws[b])
        tv = 0.5 * sum(abs(laws[a].get(k, 0.0) - laws[b].get(k, 0.0)) for k in keys)
        assert tv >= 0.25, f"{fam.name}: sources {a} and {b} give laws only {tv:.3f} apart"


@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_greedy_equals_the_targets_own(fam):
    target, draft = _pair(fam.name)
    assert type(target).__name__ == fam.model_class
    sources = _sources(fam, target, 4)
    want = [_greedy(target, s, d, 16) for s, d in sources]
    out = _single_thread(lambda: SpeculativeGenerator(target, draft, lookahead=3).generate(
        **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=16,
        temperature=0, eos_token_id=[]))
    for r in range(len(sources)):
        assert out.sequences[r] == want[r], f"{fam.name}, row {r}"
        assert out.prompt_lengths[r] == len(sources[r][1])
    assert out.stats.rejections > 0, "the draft never missed: no rollback was exercised"
    # an EOS id that stops some rows early and others not: finished rows leave the caches
    counts = [set(w[len(d) + 1:]) for w, (_, d) in zip(want, sources, strict=True)]
    eos = next((t for t in sorted(set().union(*counts)) if 0 < sum(t in c for c in counts) < len(counts)), None)
    if eos is None:
        pytest.skip("no token stops some rows but not others")
    want = [_greedy(target, s, d, 16, eos=(eos,)) for s, d in sources]
    out = _single_thread(lambda: SpeculativeGenerator(target, draft, lookahead=3).generate(
        **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=16,
        temperature=0, eos_token_id=eos))
    assert out.sequences == want, f"{fam.name} with EOS {eos}"


@pytest.mark.parametrize("fam", [f for f in SUPPORTED if f.model_type != "whisper"], ids=lambda f: f.name)
def test_greedy_equals_generate(fam):
    """The target's own ``generate(do_sample=False)`` on a right-padded batch, row for row, each
    row stopping at the generation config's EOS."""
    target, draft = _pair(fam.name)
    ids = torch.tensor([s + [1] * (7 - len(s)) for s in TEXT_SOURCES])
    mask = torch.tensor([[1] * len(s) + [0] * (7 - len(s)) for s in TEXT_SOURCES])
    ref = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    out = SpeculativeGenerator(target, draft, lookahead=3).generate(
        ids, attention_mask=mask, max_new_tokens=10, temperature=0)
    eos = target.generation_config.eos_token_id
    for r, row in enumerate(ref.tolist()):
        stop = next((j for j in range(1, len(row)) if row[j] == eos), len(row) - 1)
        assert out.sequences[r] == row[: stop + 1], f"{fam.name}, row {r}"


def _law(name, rule, tv, draft=None, target=None, alpha=ALPHA_EACH):
    t, d = _pair(name)
    target = t if target is None else target
    case = encoder_decoder_case(f"{name}, {rule}", target, d if draft is None else draft, rule, SAMPLING,
                                [], 3, tv, _sources(family(name), target), n_new=3, alpha=alpha)
    assert case.detectable_tv(alpha=alpha) <= tv
    _single_thread(lambda: check_conformance(case, seed=zlib.crc32(case.name.encode()), alpha=alpha))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_law_of_the_first_tokens(fam, rule):
    """Catches a TV deviation of FAST_TV = 0.1 with probability 0.99, at level ALPHA / MATRIX."""
    _law(fam.name, rule, FAST_TV)


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_law_of_the_first_tokens_slow(fam, rule):
    """Catches a TV deviation of SLOW_TV = 0.03 with probability 0.99, at level ALPHA / MATRIX."""
    _law(fam.name, rule, SLOW_TV)


# --------------------------------------------------------------------------------------------
# drafts


def _distil_whisper(target, layers: int = 1, d_model: int | None = None):
    """A WhisperForCausalLM with ``layers`` decoder layers initialised from the target's first ones
    and its head (how distil-whisper starts), reading the target's encoder output."""
    cfg = WhisperConfig(**{**family("whisper").config, "decoder_layers": layers,
                           "d_model": d_model or target.config.d_model, "init_std": 0.3})
    torch.manual_seed(3)
    draft = WhisperForCausalLM(cfg).to(torch.float64).eval()
    if d_model is None:
        src = target.model.decoder.state_dict()
        draft.model.decoder.load_state_dict({k: v for k, v in src.items()
                                             if not k.startswith("layers.") or int(k.split(".")[1]) < layers},
                                            strict=False)
        draft.proj_out.weight.data.copy_(target.proj_out.weight)
    return draft


def test_whisper_causal_lm_draft_reads_the_targets_encoder():
    fam = family("whisper")
    target, _ = _pair(fam.name)
    draft = _distil_whisper(target)
    sources = _sources(fam, target, 4)
    want = [_greedy(target, s, d, 16) for s, d in sources]
    gen = SpeculativeGenerator(target, draft, lookahead=3)  # its one-time model check runs the encoder too
    calls = []
    h = target.model.encoder.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = gen.generate(
            **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=16,
            temperature=0, eos_token_id=[])
    finally:
        h.remove()
    assert out.sequences == want
    assert calls == [1], "the target's encoder runs once per generate call, for every row at once"
    assert 0 < out.stats.acceptance_rate < 1
    _law(fam.name, "block", FAST_TV, draft=draft, alpha=ALPHA)


@pytest.mark.parametrize("name", ["T5", "BART", "Whisper"])
def test_early_exit_draft(name):
    target, _ = _pair(name)
    sources = _sources(family(name), target, 4)
    want = [_greedy(target, s, d, 16) for s, d in sources]
    out = SpeculativeGenerator(target, "early-exit:1", lookahead=3).generate(
        **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=16,
        temperature=0, eos_token_id=[])
    assert out.sequences == want
    if name == "BART":
        _law(name, "token", FAST_TV, draft="early-exit:1", alpha=ALPHA)


@pytest.mark.parametrize(("name", "depth"), [("T5", "num_decoder_layers"), ("BART", "decoder_layers"),
                                           ("Whisper", "decoder_layers")])
def test_early_exit_is_the_first_decoder_layers_and_the_head(name, depth):
    """The draft's logits are those of the target with its decoder cut after N layers (T5's decoder
    stack keeps its own causal config), from the target's encoder output."""
    fam = family(name)
    target = tiny_seq2seq(replace(fam, config={**fam.config, depth: 3}))
    draft = make_draft("early-exit:2", target).model
    cut = copy.deepcopy(target)
    path = decoder_layers_path(cut)
    owner = functools.reduce(getattr, path[:-1], cut)
    setattr(owner, path[-1], getattr(owner, path[-1])[:2])
    src, dec = _sources(fam, target)[2]
    with torch.no_grad():
        enc = target.get_encoder()(**_one(src))
        got = draft(encoder_outputs=enc, decoder_input_ids=torch.tensor([[*dec, 4, 5]])).logits
        want = cut(encoder_outputs=enc, decoder_input_ids=torch.tensor([[*dec, 4, 5]])).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert {id(p) for p in draft.parameters()} <= {id(p) for p in target.parameters()}  # shared, no copy


def test_source_lookup_proposes_what_follows_in_the_source():
    d = SourceNgramDraft(max_n=2)
    d.encode(EncoderInputs({}, [np.array([5, 7, 8, 9, 10, 11]), np.array([3, 4])], 2), None)
    buf = TokenBuffer.from_prompts([[0, 7, 8], [0, 6, 0, 6]], extra=8)
    got = d.propose(np.array([0, 1]), buf, 3, np.array([9, 9]), SamplingConfig(), None, 16)
    assert got.outcomes[0, : got.lengths[0]].tolist() == [9, 10, 11]  # from the source
    assert got.outcomes[1, : got.lengths[1]].tolist() == [0, 6]  # from the decoder tokens


@pytest.mark.parametrize("name", ["BART", "Whisper"])
def test_ngram_draft(name):
    target, _ = _pair(name)
    sources = _sources(family(name), target, 4)
    want = [_greedy(target, s, d, 16) for s, d in sources]
    out = SpeculativeGenerator(target, "ngram", lookahead=3).generate(
        **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=16,
        temperature=0, eos_token_id=[])
    assert out.sequences == want
    if name == "BART":
        _law(name, "block", FAST_TV, draft="ngram", alpha=ALPHA)


@pytest.mark.parametrize("name", ["T5", "BART"])
def test_cross_attention_keys_and_values_are_computed_once_per_row(name, monkeypatch):
    """T5 runs in the general cache (its modules are called: a hook counts), BART in the lean loop
    (which reads the weights: its F.linear calls with the cross-attention key weight are counted)."""
    import types

    import speculate.domains.text.models.lean_seq2seq as lean

    target, draft = _pair(name)
    gen = SpeculativeGenerator(target, draft, lookahead=3)  # its one-time model checks run first
    assert type(gen._target_lm).__name__ == ("CachedSeq2Seq" if name == "T5" else "LeanSeq2Seq")
    calls = []
    if name == "T5":
        layer = target.decoder.block[0].layer[1].EncDecAttention.k
        h = layer.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    else:
        w = target.model.decoder.layers[0].encoder_attn.k_proj.weight
        F = lean.F

        def linear(x, weight, *a):
            if weight is w:
                calls.append(x.shape[0])
            return F.linear(x, weight, *a)

        monkeypatch.setattr(lean, "F", types.SimpleNamespace(**{**vars(F), "linear": linear}))
    try:
        out = gen.generate(input_ids=list(GREEDY_SOURCES), max_new_tokens=16, temperature=1.0,
                           eos_token_id=2 if name == "BART" else 1, rng=1)
    finally:
        if name == "T5":
            h.remove()
    assert out.stats.rounds > 2
    assert calls == [len(GREEDY_SOURCES)], "cross-attention keys: once, for all rows, in the prefill"


def test_default_decoder_prompt_is_the_start_token_and_one_prompt_serves_every_row():
    target, draft = _pair("T5")
    gen = SpeculativeGenerator(target, draft, lookahead=2)
    out = gen.generate(input_ids=list(TEXT_SOURCES), max_new_tokens=4, temperature=0, eos_token_id=[])
    assert [s[0] for s in out.sequences] == [_start(target)] * 3
    assert out.prompt_lengths == [1, 1, 1]
    out2 = gen.generate(input_ids=list(TEXT_SOURCES), decoder_input_ids=[_start(target)], max_new_tokens=4,
                        temperature=0, eos_token_id=[])
    assert out2.sequences == out.sequences


def test_left_padded_tensor_is_passed_to_the_encoder_as_given():
    """A [B, S] tensor goes to the encoder with its mask unchanged (the law is the target's given
    exactly that input), so the result is the target's greedy decoding of the padded row."""
    target, draft = _pair("BART")
    ids = torch.tensor([[1, 1, 4, 5, 6], [7, 8, 9, 10, 11]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = SpeculativeGenerator(target, draft, lookahead=3).generate(
        ids, attention_mask=mask, max_new_tokens=8, temperature=0, eos_token_id=[])
    for r in range(2):
        seq = [_start(target)]
        with torch.no_grad():
            for _ in range(8):
                logits = target(input_ids=ids[r : r + 1], attention_mask=mask[r : r + 1],
                                decoder_input_ids=torch.tensor([seq])).logits
                seq.append(int(logits[0, -1].argmax()))
        assert out.sequences[r] == seq


# --------------------------------------------------------------------------------------------
# errors, before any work


def _no_forward(models, fn, match):
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in models]
    try:
        with pytest.raises(ValueError, match=re.compile(match, re.S)):
            fn()
    finally:
        for h in handles:
            h.remove()
    assert not calls, "work was done before the error"


@pytest.mark.parametrize("fam", REFUSED, ids=lambda f: f.name)
def test_refused_families_before_any_work(fam):
    model = tiny_seq2seq(fam)
    assert type(model).__name__ == fam.model_class
    _no_forward([model], lambda: SpeculativeGenerator(model, "ngram"), fam.refusal)


def test_bad_requests_raise_before_any_work():
    t5, t5_draft = _pair("T5")
    whisper, _ = _pair("Whisper")
    gen = SpeculativeGenerator(t5, t5_draft, lookahead=2)
    wgen = SpeculativeGenerator(whisper, "ngram")
    feats = torch.stack(_features(2, 1))
    cases = [
        (lambda: gen.generate(input_ids=[[4, 5]], input_features=feats), "not both"),
        (lambda: gen.generate(input_features=feats), r"T5ForConditionalGeneration has a text encoder"),
        (lambda: gen.generate(max_new_tokens=3), r"T5ForConditionalGeneration is an encoder-decoder"),
        (lambda: wgen.generate(input_ids=[[4, 5]]), r"WhisperForConditionalGeneration has a speech encoder"),
        (lambda: wgen.generate(input_features=feats[:, :, :10]), r"reads exactly 16"),
        (lambda: wgen.generate(input_features=feats[:, :4]), r"num_mel_bins=8"),
        (lambda: gen.generate(input_ids=[[4, 5], [6]], decoder_input_ids=[[0], [0], [0]]),
         "one decoder prompt per row"),
        (lambda: gen.generate(input_ids=[[4, 5]], decoder_input_ids=[[0, 99]]), "decoder_input_ids: .*outside"),
        (lambda: gen.generate(input_ids=[[4, 99]]), "outside"),
        (lambda: SpeculativeGenerator(_pair("BART")[0], "ngram").generate(
            input_ids=[[4, 5]], max_new_tokens=100), "learned decoder positions"),
        (lambda: gen.generate(input_ids=[[4, 5]] * 64, max_new_tokens=1 << 31),  # terabytes of caches
         r"not enough memory on cpu.*target KV cache"),
    ]
    for fn, match in cases:
        _no_forward([t5, t5_draft, whisper], fn, match)


def test_bad_pairs_raise_before_any_work():
    t5, _ = _pair("T5")
    whisper, _ = _pair("Whisper")
    llama = tiny_llama(vocab=16, dtype=torch.float64)
    wide = _distil_whisper(whisper, d_model=48)
    big_vocab = tiny_seq2seq(replace(family("T5"), config={**family("T5").config, "vocab_size": 400}))
    SpeculativeGenerator(llama, "ngram")  # the targets' one-time probes are not part of the requests
    SpeculativeGenerator(t5, "ngram")
    SpeculativeGenerator(whisper, "ngram")
    cases = [
        ([whisper, wide], lambda: SpeculativeGenerator(whisper, wide), r"width 48.*width 32"),
        ([t5, llama], lambda: SpeculativeGenerator(t5, llama), r"LlamaForCausalLM is a decoder-only LM.*T5"),
        ([t5, llama], lambda: SpeculativeGenerator(llama, t5), r"T5ForConditionalGeneration reads an encoder"),
        ([t5, big_vocab], lambda: SpeculativeGenerator(t5, big_vocab), r"vocabular"),
        ([wide], lambda: SpeculativeGenerator(wide, "ngram"), r"WhisperForCausalLM is a decoder that reads"),
        ([llama], lambda: SpeculativeGenerator(llama, "ngram").generate([[1, 2]], input_features=torch.zeros(1, 8, 16)),
         r"LlamaForCausalLM is a decoder-only LM: input_features"),
        ([llama], lambda: SpeculativeGenerator(llama, "ngram").generate([[1, 2]], decoder_input_ids=[[0]]),
         r"decoder_input_ids belong to encoder-decoder"),
    ]
    for models, fn, match in cases:
        _no_forward(models, fn, match)


@pytest.mark.parametrize("fam", [f for f in SUPPORTED if f.model_type not in ("t5",)], ids=lambda f: f.name)
def test_rows_ending_at_the_last_learned_position_next_to_rows_still_drafting(fam):
    """The longest row's prompt plus max_new_tokens fills the decoder's position table exactly,
    while shorter rows still draft a full block: the padded columns of its last blocks lie past the
    table (they are never kept) and must neither fail nor change its tokens."""
    from speculate.domains.text.models.encoder_decoder import _positions

    target, draft = _pair(fam.name)
    limit = _positions(target).limit
    assert limit is not None
    sources = _sources(fam, target, 4)
    n = limit - max(len(d) for _, d in sources)
    want = [_greedy(target, s, d, n) for s, d in sources]
    out = _single_thread(lambda: SpeculativeGenerator(target, draft, lookahead=6).generate(
        **_batch(sources), decoder_input_ids=[d for _, d in sources], max_new_tokens=n,
        temperature=0, eos_token_id=[]))
    assert out.sequences == want
    assert max(len(s) for s in out.sequences) == limit
