"""Speech in, text out: the embedded Whisper pair, its features, and transcription.

The embedded speech pair lives in ``domains/text/examples/weights/speech-target`` (a small
``WhisperForConditionalGeneration`` trained from scratch) and ``speech-draft`` (a
``WhisperForCausalLM``: one or two decoder layers initialised from the target's and distilled toward
it, reading the target's encoder output, distil-whisper style); ``speech-heldout`` holds held-out
utterances (16 kHz waveforms) and their texts. All were made by ``benchmarks/speech/make_corpus.py``
(espeak-ng speech from number words and phrases of the Python standard library's docstrings) and
``benchmarks/speech/train_whisper.py`` (recipe, training time and word error rates in
``benchmarks/results/speech_train.md``). The vocabulary is the byte tokenizer's
(:class:`~speculate.domains.text.examples.tokenizer.ByteTokenizer`): transcripts are lower-case letters,
apostrophes and spaces.

Features are Whisper's log-mel spectrogram (``WhisperFeatureExtractor`` built from the parameters
below, no download) over a 3 s chunk: 80 mel bins x 300 frames per utterance.

>>> target, draft, tok = load_speech_pair()
>>> waves, texts = load_heldout()
>>> len(waves) == len(texts), waves[0].dtype, len(waves[0]) <= MAX_SAMPLES
(True, dtype('float32'), True)
>>> text = transcribe(target, waves[0])            # greedy; a SpeculativeGenerator works the same
>>> isinstance(text, str) and set(text) <= set("abcdefghijklmnopqrstuvwxyz' ")
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .tokenizer import EOS_ID, PAD_ID, ByteTokenizer

MODELS_DIR = Path(__file__).resolve().parent / "weights"
TARGET_DIR = MODELS_DIR / "speech-target"
DRAFT_DIR = MODELS_DIR / "speech-draft"
HELDOUT_DIR = MODELS_DIR / "speech-heldout"
RETRAIN = "python benchmarks/speech/make_corpus.py && python benchmarks/speech/train_whisper.py"

SAMPLING_RATE = 16000
N_MELS = 80
CHUNK_SECONDS = 3
N_FFT = 400
HOP_LENGTH = 160
MAX_SAMPLES = SAMPLING_RATE * CHUNK_SECONDS

__all__ = ["CHUNK_SECONDS", "MAX_SAMPLES", "SAMPLING_RATE", "check_audio", "feature_extractor",
           "features", "load_heldout", "load_speech_pair", "read_wav", "text_tokens", "transcribe",
           "word_error_rate"]


def feature_extractor():
    """Whisper's feature extractor for the embedded pair, built from parameters (no download)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=N_MELS, sampling_rate=SAMPLING_RATE,
                                   chunk_length=CHUNK_SECONDS, n_fft=N_FFT, hop_length=HOP_LENGTH)


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """``(samples, sampling_rate)`` of a WAV file: float32 in [-1, 1], mono (refused otherwise)."""
    from scipy.io import wavfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no WAV file at {str(path)!r}")
    try:
        sr, x = wavfile.read(path)
    except ValueError as e:
        raise ValueError(f"{str(path)!r} is not a WAV file scipy can read: {e}") from None
    if x.ndim == 2:
        raise ValueError(f"{str(path)!r} has {x.shape[1]} channels; transcription takes mono audio: mix "
                         "the channels down first (e.g. samples.mean(axis=1))")
    if x.dtype == np.uint8:
        y = (x.astype(np.float32) - 128.0) / 128.0
    elif np.issubdtype(x.dtype, np.integer):
        y = x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    else:
        y = x.astype(np.float32)
    return y, int(sr)


def check_audio(audio: Any, sampling_rate: int = SAMPLING_RATE, what: str = "audio") -> np.ndarray:
    """The samples of one utterance as a float32 array, after checking them (before any work).

    Refused with a ``ValueError`` saying what to do: a sampling rate other than 16 kHz, more than
    one channel, no samples, NaN or infinite samples, more than ``CHUNK_SECONDS`` seconds.
    """
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, (int, np.integer)):
        raise TypeError(f"sampling_rate must be an int (Hz), got {sampling_rate!r}")
    if int(sampling_rate) != SAMPLING_RATE:
        raise ValueError(f"{what} is sampled at {int(sampling_rate)} Hz; the speech models take "
                         f"{SAMPLING_RATE} Hz: resample it first (e.g. scipy.signal.resample_poly)")
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    x = np.asarray(audio)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise TypeError(f"{what} must be an array of numbers, got dtype {x.dtype}")
    if x.ndim == 2 and min(x.shape) == 1:
        x = x.reshape(-1)
    if x.ndim == 2:
        raise ValueError(f"{what} has shape {x.shape}: {min(x.shape)} channels (stereo?); transcription "
                         "takes mono audio: mix the channels down first (e.g. samples.mean(axis=channel_axis))")
    if x.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of samples, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{what} is empty (no samples)")
    x = x.astype(np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        raise ValueError(f"{what} has {int(bad.sum())} NaN or infinite samples (the first at index "
                         f"{int(np.argmax(bad))})")
    if x.size > MAX_SAMPLES:
        raise ValueError(f"{what} lasts {x.size / SAMPLING_RATE:.2f} s; the speech models read one "
                         f"{CHUNK_SECONDS} s chunk: cut it into pieces of at most {MAX_SAMPLES} samples")
    return x


def _as_waves(audio: Any, sampling_rate: int) -> tuple[list[np.ndarray], bool]:
    """One or many utterances (paths or arrays) -> checked waveforms, and whether it was one."""
    single = not isinstance(audio, (list, tuple))  # a 2-D array is one utterance with channels: refused
    items = [audio] if single else list(audio)
    if not items:
        raise ValueError("no audio given (an empty list)")
    waves = []
    for i, a in enumerate(items):
        what = "audio" if single else f"audio[{i}]"
        if isinstance(a, (str, os.PathLike)):
            x, sr = read_wav(a)
            waves.append(check_audio(x, sr, what=f"{what} ({str(a)!r})"))
        else:
            waves.append(check_audio(a, sampling_rate, what=what))
    return waves, single


def features(audio: Any, sampling_rate: int = SAMPLING_RATE) -> torch.Tensor:
    """Log-mel features ``[B, 80, 300]`` (float32) of one or many utterances (paths or arrays)."""
    waves, _ = _as_waves(audio, sampling_rate)
    fe = feature_extractor()
    out = fe(waves, sampling_rate=SAMPLING_RATE, return_tensors="np").input_features
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def load_speech_pair(device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                     path: str | os.PathLike[str] | None = None):
    """``(target, draft, tokenizer)`` of the embedded speech pair, in eval mode, offline.

    ``target``: ``WhisperForConditionalGeneration``; ``draft``: ``WhisperForCausalLM`` reading the
    target's encoder output; ``tokenizer``: the byte tokenizer. ``path``: a folder holding
    ``speech-target/`` and ``speech-draft/`` (default: the embedded pair).
    """
    from transformers import WhisperForCausalLM, WhisperForConditionalGeneration

    base = Path(path) if path is not None else MODELS_DIR
    out = []
    for sub, cls in (("speech-target", WhisperForConditionalGeneration), ("speech-draft", WhisperForCausalLM)):
        folder = base / sub
        if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"no model in {str(folder)!r} (config.json + model.safetensors "
                                    f"expected); train the pair with: {RETRAIN}")
        model = cls.from_pretrained(folder, dtype=dtype or torch.float32)
        out.append(model.to(device or "cpu").eval())
    return out[0], out[1], ByteTokenizer.from_pretrained(base / "speech-target")


def load_heldout(path: str | os.PathLike[str] | None = None) -> tuple[list[np.ndarray], list[str]]:
    """The held-out utterances: (float32 waveforms at 16 kHz, their texts)."""
    from safetensors.numpy import load_file

    folder = Path(path) if path is not None else HELDOUT_DIR
    if not (folder / "audio.safetensors").is_file():
        raise FileNotFoundError(f"no held-out set in {str(folder)!r}; make it with: {RETRAIN}")
    t = load_file(folder / "audio.safetensors")
    texts = json.loads((folder / "texts.json").read_text())["texts"]
    audio, offsets = t["audio"], t["offsets"]
    waves = [audio[offsets[i]:offsets[i + 1]].astype(np.float32) / 32767.0 for i in range(len(texts))]
    return waves, texts


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Word error rate: word-level edit distance summed over utterances / reference words.

    >>> word_error_rate(["a b c", "d e"], ["a x c", "d e f"])
    0.4
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    errors = words = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = ref.split(), hyp.split()
        d = list(range(len(h) + 1))
        for i in range(1, len(r) + 1):
            prev, d[0] = d[0], i
            for j in range(1, len(h) + 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
        errors += d[len(h)]
        words += len(r)
    return errors / max(words, 1)


def text_tokens(row: Sequence[int], eos: int = EOS_ID, pad: int = PAD_ID) -> list[int]:
    """A decoder row's text tokens: those before its first EOS or PAD. Transcripts are compared on
    these: transformers' Whisper ``generate`` drops the EOS and pads a finished row of a batch,
    the speculative generator keeps the EOS.

    >>> text_tokens([104, 105, EOS_ID, PAD_ID])
    [104, 105]
    """
    out = []
    for t in row:
        if t in (eos, pad):
            break
        out.append(int(t))
    return out


def _decode(tokenizer: Any, rows: Sequence[Sequence[int]]) -> list[str]:
    return [tokenizer.decode([int(t) for t in row], skip_special_tokens=True) for row in rows]


def transcribe(model: Any, audio: Any, sampling_rate: int = SAMPLING_RATE, *, max_new_tokens: int = 32,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               rng: int | np.random.Generator | None = 0, tokenizer: Any = None,
               batch_size: int | None = None) -> str | list[str]:
    """Transcribe one utterance (a WAV path or a 1-D float array at 16 kHz) or a list of them.

    ``model``: a :class:`~speculate.domains.text.SpeculativeGenerator` over a Whisper target
    (speculative, exact at any temperature; ``rng`` seeds it), or a ``WhisperForConditionalGeneration``
    (its own ``generate``: greedy at temperature 0, sampling otherwise). The audio is checked before
    any work (:func:`check_audio`). Returns the text, or a list of texts for a list of utterances.
    ``batch_size``: utterances per call (default: all at once).
    """
    waves, single = _as_waves(audio, sampling_rate)
    tok = tokenizer if tokenizer is not None else ByteTokenizer()
    feats = features(waves)
    step = batch_size or len(waves)
    texts: list[str] = []
    gen_cls = None
    try:
        from ..api import SpeculativeGenerator as gen_cls
        from ..models.facts import execution_device
    except ImportError:  # pragma: no cover
        pass
    for i in range(0, len(waves), step):
        x = feats[i:i + step]
        if gen_cls is not None and isinstance(model, gen_cls):
            dev = execution_device(model.target)
            dt = next(model.target.parameters()).dtype
            out = model.generate(input_features=x.to(dev, dt), max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
            texts += _decode(tok, out.new_tokens)
        elif hasattr(model, "generate") and getattr(model, "main_input_name", "") == "input_features":
            p = next(model.parameters())
            kw: dict[str, Any] = {"do_sample": False} if temperature == 0 else {
                "do_sample": True, "temperature": temperature, "top_k": top_k or 0, "top_p": top_p or 1.0}
            with torch.inference_mode():
                ids = model.generate(input_features=x.to(p.device, p.dtype), max_new_tokens=max_new_tokens,
                                     **kw)
            texts += _decode(tok, ids.tolist())
        else:
            raise TypeError(f"transcribe takes a SpeculativeGenerator or a Whisper model, got "
                            f"{type(model).__name__}")
    return texts[0] if single else texts
