"""Synthesize the speech corpus: short English utterances spoken by espeak-ng, 16 kHz mono.

    python benchmarks/speech/make_corpus.py            # -> scratch/speech/{train,heldout}.npz

The texts come from what every machine has: number words (0 .. 9999, written out) and short
phrases (2 to 6 words) cut from the docstrings of the Python standard library's ``.py`` sources,
lower-cased, letters, apostrophes and spaces only, over a closed vocabulary (the most frequent
words of those phrases). Held-out texts are never spoken in the training set: a phrase is held out
when the SHA-256 of its text falls in the lowest part of the hash range, a number when it is in a
seeded held-out set of numbers; held-out words all occur in training phrases.

Each utterance is spoken by espeak-ng with a random English voice (9 accents x 14 voice variants),
speed (140 .. 190 words per minute), pitch (20 .. 80) and word gap, then its leading
and trailing silence is trimmed, it is resampled from 22.05 kHz to 16 kHz with a random speed
perturbation (x0.92 .. x1.08, which also shifts the pitch), given a random lead-in silence (0 ..
0.25 s), a random gain, and additive noise (white, pink or brown, SNR 15 .. 40 dB; 25% clean).
Utterances longer than ``--max-seconds`` are dropped (the model reads 3 s chunks). Everything is
seeded: one ``numpy.random.Generator`` drives the text choice and every random parameter, and
espeak-ng is deterministic, so the same seed, espeak-ng version and Python version give the same
corpus (``digest`` in the metadata).

Output (``--out``): ``train.npz`` and ``heldout.npz``, each with ``audio`` (int16, all utterances
concatenated), ``offsets`` (int64 [N + 1]), ``texts`` (str [N]) and ``meta`` (a JSON string: the
parameters of every utterance, the espeak-ng and Python versions, the digest). espeak-ng is only
needed here; the tests and the shipped models never call it.
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import json
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.io import wavfile
from scipy.signal import resample_poly

ROOT = Path(__file__).resolve().parents[2]
SR = 16000
ESPEAK_SR = 22050
ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
           "en-029", "en-us-nyc", "en-gb")
VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt")
ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
CHARSET = frozenset("abcdefghijklmnopqrstuvwxyz' ")
WORD = re.compile(r"^[a-z]+(?:'[a-z]+)?$")


def number_words(n: int) -> str:
    """0 <= n < 10000 in words, without "and": 342 -> "three hundred forty two".

    >>> number_words(0), number_words(15), number_words(342), number_words(7001)
    ('zero', 'fifteen', 'three hundred forty two', 'seven thousand one')
    """
    if not 0 <= n < 10000:
        raise ValueError(f"{n} is outside 0 .. 9999")
    if n < 20:
        return ONES[n]
    words = []
    if n >= 1000:
        words += [ONES[n // 1000], "thousand"]
        n %= 1000
    if n >= 100:
        words += [ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(TENS[n // 10])
        n %= 10
    if n:
        words.append(ONES[n])
    return " ".join(words)


def docstring_runs(root: Path | None = None) -> list[list[str]]:
    """Runs of consecutive clean words (letters and one inner apostrophe) of every docstring of the
    standard library's sources, lower-cased; a run breaks at sentence punctuation and at any word
    that is not clean (identifiers, numbers, markup)."""
    from speculate.domains.text.examples.corpus import stdlib_files, stdlib_root

    base = root or stdlib_root()
    runs = []
    for rel in stdlib_files(base):
        try:
            tree = ast.parse((base / rel).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            run: list[str] = []
            for raw in doc.split():
                w = raw.lower()
                end = w[-1:] in (".", "!", "?", ";", ":")
                w = w.rstrip(".,;:!?")
                if WORD.match(w):
                    run.append(w)
                else:
                    end = True
                    w = ""
                if end:
                    if len(run) >= 2:
                        runs.append(run)
                    run = []
            if len(run) >= 2:
                runs.append(run)
    return runs


def phrases(runs: list[list[str]], vocab_size: int, max_chars: int) -> tuple[list[str], list[str]]:
    """Cut runs into phrases of 2 .. 6 words over the ``vocab_size`` most frequent words.

    Returns (sorted unique phrases, the vocabulary)."""
    counts = collections.Counter(w for run in runs for w in run)
    vocab = {w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size]}
    out = set()
    for run in runs:
        i = 0
        while i < len(run):
            # cut at out-of-vocabulary words, then into pieces of up to 6 words
            j = i
            while j < len(run) and run[j] in vocab:
                j += 1
            seg = run[i:j]
            for s in range(0, len(seg), 6):
                piece = seg[s:s + 6]
                while len(piece) >= 2 and len(" ".join(piece)) > max_chars:
                    piece = piece[:-1]
                if len(piece) >= 2:
                    out.add(" ".join(piece))
            i = j + 1
    return sorted(out), sorted(vocab)


def is_heldout_phrase(text: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return h < fraction * 2 ** 64


def espeak_version() -> str:
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"text-to-speech:\s*(\S+)", out)
    return m.group(1) if m else out.strip()


def speak(text: str, voice: str, speed: int, pitch: int, gap: int, tmp: Path) -> np.ndarray:
    """espeak-ng -> float64 samples at 22.05 kHz in [-1, 1]."""
    wav = tmp / "u.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap),
                    "-w", str(wav), text], check=True, capture_output=True)
    sr, x = wavfile.read(wav)
    if sr != ESPEAK_SR or x.ndim != 1:
        raise RuntimeError(f"espeak-ng wrote {sr} Hz, shape {x.shape}; expected {ESPEAK_SR} Hz mono")
    return x.astype(np.float64) / 32768.0


def trim(x: np.ndarray, rel: float = 0.02) -> np.ndarray:
    """Drop leading and trailing samples quieter than ``rel`` x the peak (10 ms frames)."""
    frame = ESPEAK_SR // 100
    n = len(x) // frame
    if n == 0:
        return x
    peak = np.abs(x[:n * frame]).reshape(n, frame).max(axis=1)
    loud = np.nonzero(peak > rel * peak.max())[0]
    return x[max(0, (loud[0] - 2) * frame): (loud[-1] + 3) * frame]


def colored_noise(n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    w = rng.standard_normal(n)
    if kind == "white":
        return w
    spec = np.fft.rfft(w)
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    spec /= np.sqrt(f) if kind == "pink" else f
    out = np.fft.irfft(spec, n)
    return out / (out.std() + 1e-12)


def utterance(text: str, rng: np.random.Generator, tmp: Path) -> tuple[np.ndarray, dict]:
    """One spoken, perturbed utterance at 16 kHz (float64) and its parameters."""
    accent = ACCENTS[rng.integers(len(ACCENTS))]
    variant = VARIANTS[rng.integers(len(VARIANTS))]
    p = {"voice": accent + (f"+{variant}" if variant else ""), "speed": int(rng.integers(140, 191)),
         "pitch": int(rng.integers(20, 81)),
         "gap": int(rng.integers(0, 3)), "perturb": round(float(rng.uniform(0.92, 1.08)), 3),
         "lead_s": round(float(rng.uniform(0.0, 0.25)), 3),
         "gain": round(float(10 ** rng.uniform(-0.6, 0.0)), 4),
         "noise": ("none", "white", "pink", "brown")[rng.choice(4, p=[0.25, 0.25, 0.25, 0.25])],
         "snr_db": round(float(rng.uniform(15.0, 40.0)), 2)}
    x = trim(speak(text, p["voice"], p["speed"], p["pitch"], p["gap"], tmp))
    down = round(441 * p["perturb"])
    y = resample_poly(x, 320, down)  # 22050 * 320 / 441 = 16000; x perturb faster
    y = np.concatenate([np.zeros(round(p["lead_s"] * SR)), y])
    y *= p["gain"] / (np.abs(y).max() + 1e-12) * 0.9
    if p["noise"] != "none":
        power = np.mean(y ** 2)
        y = y + colored_noise(len(y), p["noise"], rng) * np.sqrt(power / 10 ** (p["snr_db"] / 10))
    y = np.clip(y, -1.0, 1.0)
    return y, p


def build(texts: list[str], rng: np.random.Generator, max_seconds: float, tmp: Path, log, name: str):
    """Speak ``texts`` in order; one retry with new voice parameters when too long, else dropped."""
    audio, kept, params = [], [], []
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        for _ in range(2):
            y, p = utterance(text, rng, tmp)
            if len(y) <= max_seconds * SR:
                audio.append(np.round(y * 32767).astype(np.int16))
                kept.append(text)
                params.append(p)
                break
        if (i + 1) % 500 == 0:
            log(f"  {name}: {i + 1}/{len(texts)} texts, {len(kept)} kept, {time.perf_counter() - t0:.0f}s")
    return audio, kept, params


def save(path: Path, audio: list[np.ndarray], texts: list[str], meta: dict) -> str:
    offsets = np.zeros(len(audio) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(a) for a in audio])
    flat = np.concatenate(audio) if audio else np.zeros(0, np.int16)
    h = hashlib.sha256(flat.tobytes())
    h.update(offsets.tobytes())
    h.update("\n".join(texts).encode())
    digest = h.hexdigest()
    meta = {**meta, "digest": digest, "n": len(texts), "seconds": round(len(flat) / SR, 1)}
    np.savez(path, audio=flat, offsets=offsets, texts=np.array(texts), meta=np.array(json.dumps(meta)))
    return digest


def load(path: str | Path) -> tuple[list[np.ndarray], list[str], dict]:
    """(float32 waveforms at 16 kHz, texts, metadata) of a file written by this script."""
    with np.load(path) as z:
        audio, offsets = z["audio"], z["offsets"]
        texts = [str(t) for t in z["texts"]]
        meta = json.loads(str(z["meta"]))
    waves = [audio[offsets[i]:offsets[i + 1]].astype(np.float32) / 32767.0 for i in range(len(texts))]
    return waves, texts, meta


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "scratch" / "speech")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=6000, help="training texts to speak")
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--numbers", type=float, default=0.4, help="fraction of number texts")
    ap.add_argument("--vocab", type=int, default=200, help="docstring words kept (most frequent)")
    ap.add_argument("--max-chars", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=2.9)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/speech/make_corpus.py", *argv])

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    rng = np.random.default_rng(args.seed)
    runs = docstring_runs()
    all_phrases, vocab = phrases(runs, args.vocab, args.max_chars)
    held_p = [p for p in all_phrases if is_heldout_phrase(p, 0.05)]
    train_p = [p for p in all_phrases if not is_heldout_phrase(p, 0.05)]
    train_words = {w for p in train_p for w in p.split()}
    held_p = [p for p in held_p if all(w in train_words for w in p.split())]
    nums = rng.permutation(10000)
    held_n = [number_words(int(n)) for n in nums[:300]]
    train_n = [number_words(int(n)) for n in nums[300:]]
    held_n = [t for t in held_n if len(t) <= args.max_chars]
    train_n = [t for t in train_n if len(t) <= args.max_chars]
    log(f"{len(runs)} docstring runs -> {len(all_phrases)} phrases over {len(vocab)} words "
        f"(train {len(train_p)}, held-out {len(held_p)}); numbers: train {len(train_n)}, "
        f"held-out {len(held_n)}")

    def pick(pool_n: list[str], pool_p: list[str], n: int) -> list[str]:
        k = int(rng.binomial(n, args.numbers))
        a = [pool_n[i] for i in rng.choice(len(pool_n), k, replace=k > len(pool_n))]
        b = [pool_p[i] for i in rng.choice(len(pool_p), n - k, replace=n - k > len(pool_p))]
        out = a + b
        return [out[i] for i in rng.permutation(len(out))]

    held_texts = pick(held_n, held_p, args.heldout + args.heldout // 4)  # spares for drops
    train_texts = pick(train_n, train_p, args.train)
    version = espeak_version()
    common = {"command": command, "seed": args.seed, "espeak_ng": version,
              "python": platform.python_version(), "sampling_rate": SR,
              "max_seconds": args.max_seconds, "vocab_size": len(vocab), "max_chars": args.max_chars,
              "numbers_fraction": args.numbers, "charset": "".join(sorted(CHARSET))}
    args.out.mkdir(parents=True, exist_ok=True)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts, want in (("heldout", held_texts, args.heldout), ("train", train_texts, None)):
            audio, kept, params = build(texts, rng, args.max_seconds, Path(tmp), log, name)
            if want is not None:
                audio, kept, params = audio[:want], kept[:want], params[:want]
            assert all(set(t) <= CHARSET for t in kept)
            digest = save(args.out / f"{name}.npz", audio, kept, {**common, "split": name,
                                                                  "params": params})
            secs = sum(len(a) for a in audio) / SR
            log(f"{name}: {len(kept)} utterances, {secs / 60:.1f} min of audio, "
                f"max {max(len(a) for a in audio) / SR:.2f} s -> {args.out / name}.npz ({digest[:12]})")
            result[name] = {"n": len(kept), "seconds": round(secs, 1), "digest": digest}
    (args.out / "corpus.json").write_text(json.dumps({**common, **result, "vocab": vocab}, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
