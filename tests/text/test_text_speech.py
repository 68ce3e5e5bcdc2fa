"""Speech: the embedded Whisper pair, the audio helper, and exact speculative transcription.

The pair (``domains/text/examples/weights/speech-*``) loads offline; the audio helper refuses what it cannot
transcribe before any work; greedy speculative transcripts equal the target's own greedy
``generate`` on the held-out set; the law of the first two decoder tokens at temperature 1 equals
the target's exact law for a batch of different utterances (chi-square, level and power stated in
the test).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.io import wavfile
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.examples import speech

from speculate.testing import assert_categorical_matches
from speculate.testing.gof import chi2_power

EOS, PAD = 257, 258


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return speech.load_speech_pair()


@pytest.fixture(scope="module")
def heldout():
    return speech.load_heldout()


def test_pair_loads_offline(pair, heldout, monkeypatch):
    from transformers import WhisperForCausalLM, WhisperForConditionalGeneration

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, draft, tok = speech.load_speech_pair()
    assert isinstance(target, WhisperForConditionalGeneration) and isinstance(draft, WhisperForCausalLM)
    assert not target.training and not draft.training
    assert target.config.vocab_size == draft.config.vocab_size == len(tok)
    assert draft.config.decoder_layers < target.config.decoder_layers
    assert not any("encoder" in n and "encoder_attn" not in n for n, _ in draft.named_parameters())
    waves, texts = heldout
    assert len(waves) == len(texts) >= 32
    assert all(0 < len(w) <= speech.MAX_SAMPLES for w in waves)
    assert all(set(t) <= set("abcdefghijklmnopqrstuvwxyz' ") for t in texts)
    x = speech.features(waves[:2])
    assert x.shape == (2, speech.N_MELS, speech.MAX_SAMPLES // speech.HOP_LENGTH)
    with pytest.raises(FileNotFoundError, match="train the pair"):
        speech.load_speech_pair(path="/nonexistent")


def _wav(path, data, rate=16000):
    wavfile.write(path, rate, data)
    return path


def test_audio_helper_refuses_bad_audio_before_any_work(tmp_path, heldout):
    class Refuse:  # any use of the model would fail differently
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name}) before the audio was checked")

    model = Refuse()
    w = (heldout[0][0] * 32767).astype(np.int16)
    cases = [
        (_wav(tmp_path / "8k.wav", w, 8000), "8000 Hz.*16000 Hz"),
        (_wav(tmp_path / "stereo.wav", np.stack([w, w], 1)), "2 channels.*mono"),
        (_wav(tmp_path / "empty.wav", np.zeros(0, np.int16)), "empty"),
        (_wav(tmp_path / "long.wav", np.zeros(speech.MAX_SAMPLES + 1, np.int16)), "lasts .* cut it"),
    ]
    for path, msg in cases:
        with pytest.raises(ValueError, match=msg):
            speech.transcribe(model, path)
    x = heldout[0][0]
    nan = x.copy()
    nan[10] = np.nan
    for audio, kw, msg in [
        (x, {"sampling_rate": 44100}, "44100 Hz.*resample"),
        (np.stack([x, x]), {}, "channels.*mono"),
        (np.zeros(0, np.float32), {}, "empty"),
        (nan, {}, "1 NaN or infinite samples .*index 10"),
        ([x, nan], {}, r"audio\[1\] has 1 NaN"),
        ([], {}, "no audio"),
    ]:
        with pytest.raises(ValueError, match=msg):
            speech.transcribe(model, audio, **kw)
    with pytest.raises(FileNotFoundError):
        speech.transcribe(model, tmp_path / "missing.wav")
    with pytest.raises(TypeError, match="SpeculativeGenerator or a Whisper model"):
        speech.transcribe(object(), x)


def test_wav_path_and_array_give_the_same_transcript(tmp_path, pair, heldout):
    target, _, _ = pair
    x = heldout[0][0]
    path = _wav(tmp_path / "u.wav", np.round(x * 32767).astype(np.int16))
    a = speech.transcribe(target, path)
    b = speech.transcribe(target, x)
    assert isinstance(a, str) and a == b
    assert speech.transcribe(target, [x, x]) == [b, b]


def test_word_error_rate():
    assert speech.word_error_rate(["a b c"], ["a b c"]) == 0.0
    assert speech.word_error_rate(["a b c", "d"], ["b c", "d e"]) == 0.5
    with pytest.raises(ValueError):
        speech.word_error_rate(["a"], [])


def _target_greedy(target, feats: torch.Tensor, n: int) -> list[list[int]]:
    with torch.inference_mode():
        ids = target.generate(input_features=feats, max_new_tokens=n, do_sample=False).tolist()
    return [speech.text_tokens(row) for row in ids]


def _greedy_equal(pair, heldout, rows: slice, lookahead: int):
    target, draft, _ = pair
    waves, texts = heldout
    feats = speech.features(waves[rows])
    gen = SpeculativeGenerator(target, draft, lookahead=lookahead)
    out = gen.generate(input_features=feats, max_new_tokens=32, temperature=0, rng=0)
    want = _target_greedy(target, feats, 32)
    assert [speech.text_tokens(r) for r in out.new_tokens] == want
    assert all(r[-1] == EOS for r in out.new_tokens if len(r) < 32)
    hyp = speech.transcribe(gen, waves[rows], temperature=0)
    assert hyp == speech.transcribe(target, waves[rows])
    return texts[rows], hyp


def test_greedy_transcripts_equal_the_targets_own(pair, heldout):
    _greedy_equal(pair, heldout, slice(0, 8), lookahead=4)


@pytest.mark.slow
@pytest.mark.parametrize("lookahead", [2, 6])
def test_greedy_transcripts_equal_the_targets_own_on_the_heldout_set(pair, heldout, lookahead):
    refs, hyp = _greedy_equal(pair, heldout, slice(None), lookahead)
    assert speech.word_error_rate(refs, hyp) <= 0.15


@torch.inference_mode()
def _first_two_law(target, feats: torch.Tensor) -> dict:
    """The exact law of the first two decoder tokens at temperature 1 (float64 forwards): a dict
    {(t1, t2): p} (``(EOS,)`` when the first token ends the transcript)."""
    import copy

    t64 = copy.deepcopy(target).double()
    enc = t64.model.encoder(feats.double()).last_hidden_state  # [1, S, d]
    bos = t64.config.decoder_start_token_id
    V = t64.config.vocab_size

    def probs(ids: torch.Tensor) -> np.ndarray:
        h = t64.model.decoder(input_ids=ids, encoder_hidden_states=enc.expand(ids.shape[0], -1, -1))
        return torch.softmax(t64.proj_out(h.last_hidden_state[:, -1]), -1).numpy()

    p1 = probs(torch.tensor([[bos]]))[0]
    p2 = probs(torch.stack([torch.full((V,), bos), torch.arange(V)], 1))
    law = {}
    for a in range(V):
        if a == EOS:
            law[(a,)] = float(p1[a])
        else:
            for b in range(V):
                law[(a, b)] = float(p1[a] * p2[a, b])
    return law


@pytest.mark.slow
def test_first_two_tokens_follow_the_targets_law_at_temperature_1(pair, heldout):
    """4 different held-out utterances, n = 6600 rows each, batched together in one call per
    repetition: every row's first two tokens ~ the target's exact law. Level 1e-6 / 4 per utterance
    (Bonferroni); the power against the draft's own law (what sampling from the draft without
    verification would give) is computed and must be >= 0.99 for at least one utterance, and
    n is at least what catches any total-variation deviation of 0.05 at that level (chi2_sample_size)."""
    from speculate.testing.gof import chi2_sample_size

    target, draft, _ = pair
    waves, _ = heldout
    picks = [0, 1, 2, 3]
    n, reps = 6600, 6
    feats = speech.features([waves[i] for i in picks])
    gen = SpeculativeGenerator(target, draft, lookahead=4)
    samples = {i: [] for i in range(len(picks))}
    for rep in range(reps):
        batch = feats.repeat_interleave(n // reps, 0)  # rows of different utterances in one batch
        out = gen.generate(input_features=batch, max_new_tokens=2, temperature=1.0, rng=1000 + rep)
        for r, toks in enumerate(out.new_tokens):
            samples[r // (n // reps)].append(tuple(toks[:1]) if toks[0] == EOS else tuple(toks[:2]))
    level = 1e-6 / len(picks)
    powers = []
    for i in range(len(picks)):
        law = _first_two_law(target, feats[i:i + 1])
        assert abs(sum(law.values()) - 1) < 1e-9
        assert_categorical_matches(samples[i], law, alpha=level, label=f"utterance {picks[i]}")
        # power against the draft's law (same cells)
        with torch.inference_mode():
            enc = target.model.encoder(feats[i:i + 1]).last_hidden_state
            bos = target.config.decoder_start_token_id
            V = target.config.vocab_size
            first = draft(input_ids=torch.tensor([[bos]]), encoder_outputs=(enc,)).logits[0, -1]
            q1 = torch.softmax(first.double(), -1)
            ids = torch.stack([torch.full((V,), bos), torch.arange(V)], 1)
            second = draft(input_ids=ids, encoder_outputs=(enc.expand(V, -1, -1),)).logits[:, -1]
            q2 = torch.softmax(second.double(), -1)
        keys = list(law)
        q = np.array([float(q1[k[0]]) if len(k) == 1 else float(q1[k[0]] * q2[k[0], k[1]]) for k in keys])
        p = np.array([law[k] for k in keys])
        powers.append(chi2_power(p, q / q.sum(), n, alpha=level))
        bins = int((p * n >= 5).sum()) + 1
        assert n >= chi2_sample_size(0.05, max(bins, 2), alpha=level)
    assert max(powers) >= 0.99, f"power against the draft's law too low: {powers}"
