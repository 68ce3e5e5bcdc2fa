"""The lean Whisper / BART decoding loop gives the transformers forward's logits (common starts,
last-only logits, ragged rows of different encoder outputs with padded sources, rollback, dropped
rows; Whisper target, distil-whisper draft and BART; sdpa and eager attention); other models, and a
lean loop that fails the probe, fall back to the general cache. End to end, the encoder-decoder
conformance matrix (greedy equality and output laws for Whisper and BART) runs through this loop:
tests/text/test_text_encoder_decoder.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import family, perturbed, tiny_seq2seq
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.models.encoder_decoder import CachedSeq2Seq, encode, probe_encoder
from speculate.domains.text.models.lean_seq2seq import LeanSeq2Seq, lean_seq2seq, supports
from speculate.domains.text.models.probe import probe
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    WhisperConfig,
    WhisperForCausalLM,
    WhisperForConditionalGeneration,
)

KINDS = ["whisper", "distil-whisper", "bart"]


def _model(kind: str = "whisper", attn: str = "sdpa"):
    torch.manual_seed(7)
    if kind == "bart":  # embeddings scaled, and a bias on the logits, so that both matter
        cfg = {**family("BART").config, "init_std": 0.3, "scale_embedding": True, "attn_implementation": attn}
        m = BartForConditionalGeneration(BartConfig(**cfg))
        m.final_logits_bias.normal_()
        return m.to(torch.float64).eval()
    cfg = {**family("whisper").config, "init_std": 0.3, "attn_implementation": attn}
    cls = WhisperForCausalLM if kind == "distil-whisper" else WhisperForConditionalGeneration
    return cls(WhisperConfig(**cfg)).to(torch.float64).eval()


def _whisper(attn: str = "sdpa", causal: bool = False):
    return _model("distil-whisper" if causal else "whisper", attn)


def _tol(model):
    # transformers' eager attention takes the softmax in float32 even for a float64 model
    return 1e-6 if model.config._attn_implementation == "eager" else 1e-9


def _encoder_state(model, rows: int = 2):
    g = torch.Generator().manual_seed(1)
    if isinstance(model, WhisperForCausalLM):  # reads another model's encoder output
        from speculate.domains.text.models.encoder_decoder import EncoderState
        return EncoderState(torch.randn(rows, 5, model.config.d_model, generator=g, dtype=torch.float64), None)
    if isinstance(model, BartForConditionalGeneration):  # the second row's source is padded
        ids = torch.randint(3, model.config.vocab_size, (rows, 6), generator=g)
        mask = torch.ones(rows, 6, dtype=torch.long)
        mask[1:, 4:] = 0
        return encode(model, {"input_ids": ids, "attention_mask": mask})
    cfg = model.config
    feats = torch.randn(rows, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g, dtype=torch.float64)
    return encode(model, {"input_features": feats})


def _full(model, state, seqs):
    if isinstance(model, WhisperForCausalLM):
        return model(input_ids=seqs, encoder_outputs=state.hidden, use_cache=False).logits
    from transformers.modeling_outputs import BaseModelOutput
    return model(encoder_outputs=BaseModelOutput(last_hidden_state=state.hidden), attention_mask=state.mask,
                 decoder_input_ids=seqs, use_cache=False).logits


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", KINDS)
def test_common_start_and_last_only(attn, kind):
    model = _model(kind, attn)
    state = _encoder_state(model)
    seqs = torch.from_numpy(np.random.default_rng(1).integers(0, model.config.vocab_size, (2, 12)))
    lm = LeanSeq2Seq(model)
    lm.encoder = state
    lm.reset(batch=2, capacity=4)  # grows on the way
    at = 0
    with torch.inference_mode():
        full = _full(model, state, seqs)
        for w in (5, 1, 3, 1, 2):
            got = lm.forward(seqs[:, at : at + w], np.array([at, at]), last_only=(w == 3))
            want = full[:, at : at + w]
            torch.testing.assert_close(got, want[:, -1:] if w == 3 else want, rtol=_tol(model), atol=_tol(model))
            at += w


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", KINDS)
def test_ragged_rows_rollback_and_dropped_rows_pass_the_probe(attn, kind):
    """The probe of check_seq2seq (ragged rows of different encoder inputs, a rollback, a dropped
    row against full forward passes) passes, and a lean loop that forgets to drop a row's
    cross-attention keys fails it: the probe that guards lean_seq2seq has the power to refuse."""
    model = _model(kind, attn)
    assert probe(model, LeanSeq2Seq, probe_encoder) is None

    class Forgetful(LeanSeq2Seq):
        def select(self, keep):
            ck, cv = self.ck, self.cv
            super().select(keep)
            self.ck, self.cv = [t[: len(keep)] for t in ck], [t[: len(keep)] for t in cv]  # row 0's, not row 1's

    assert "different logits" in probe(model, Forgetful, probe_encoder)


def test_lean_seq2seq_picks_the_lean_loop_only_where_it_applies():
    whisper = _whisper()
    assert isinstance(lean_seq2seq(whisper), LeanSeq2Seq)
    assert isinstance(lean_seq2seq(_whisper(causal=True)), LeanSeq2Seq)
    assert isinstance(lean_seq2seq(_model("bart")), LeanSeq2Seq)
    t5 = tiny_seq2seq(family("T5"))
    assert not supports(t5) and isinstance(lean_seq2seq(t5), CachedSeq2Seq)
    training = _whisper().train()
    assert not supports(training)

    class Custom(WhisperForConditionalGeneration):  # a subclass may change the forward: not assumed
        pass

    custom = Custom(whisper.config).to(torch.float64).eval()
    assert not supports(custom) and isinstance(lean_seq2seq(custom), CachedSeq2Seq)
    with pytest.raises(ValueError, match="WhisperForCausalLM or BartForConditionalGeneration"):
        LeanSeq2Seq(t5)


def test_a_model_that_fails_the_probe_gets_the_general_cache(monkeypatch):
    import speculate.domains.text.models.lean_seq2seq as lw

    whisper = _whisper()
    monkeypatch.setattr(lw, "probe", lambda model, make, encoder=None: "different logits")
    assert isinstance(lean_seq2seq(whisper), CachedSeq2Seq)


@pytest.mark.parametrize("kind", ["whisper", "bart"])
def test_reads_the_live_weights_and_dtype(kind):
    """Weights changed in place (training) or a dtype move after the loop was built show in its
    logits after the next reset (BART's logits bias is a buffer: a dtype move replaces it)."""
    model = _model(kind)
    state = _encoder_state(model)
    lm = LeanSeq2Seq(model)
    seqs = torch.tensor([[1, 4, 5], [1, 6, 7]])

    def run():
        lm.encoder = state if next(model.parameters()).dtype == torch.float64 else \
            type(state)(state.hidden.float(), state.mask)
        lm.reset(batch=2, capacity=4)
        return lm.forward(seqs, np.array([0, 0]))

    with torch.inference_mode():
        before = run()
        model.model.decoder.layers[0].fc2.weight.mul_(2.0)
        k = model.model.decoder.layers[0].self_attn.k_proj.weight  # in the fused q/k/v projection
        k.add_(torch.randn(k.shape, generator=torch.Generator().manual_seed(0), dtype=k.dtype))
        after = run()
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, _full(model, state, seqs), rtol=1e-9, atol=1e-9)
        model.float()
        got = run()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), after, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["Whisper", "BART"])
def test_the_generator_runs_target_and_draft_in_the_lean_loop(name):
    """So the conformance matrix of tests/text/test_text_encoder_decoder.py tests this loop."""
    target = tiny_seq2seq(family(name))
    gen = SpeculativeGenerator(target, perturbed(target), lookahead=2)
    assert isinstance(gen._target_lm, LeanSeq2Seq) and isinstance(gen.draft.lm, LeanSeq2Seq)
