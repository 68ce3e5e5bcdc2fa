"""``speculate demo speech``: exact speculative transcription with the embedded Whisper pair, on CPU.

Transcribes the held-out utterances (espeak-ng speech the pair never heard in training) with the
target's own greedy decoding (``target.generate``) and with speculative decoding (the draft is a
1-2 layer ``WhisperForCausalLM`` reading the target's encoder output), prints the transcripts and
the word error rate of both (equal at temperature 0: the transcripts are identical), the decoding
speed of both at batch 1 and batch 8, the measured acceptance and tokens per target call next to
theory (``speculate.theory``).

Example:
    >>> from speculate.domains.text.examples.speech_demo import demo
    >>> demo(["--quick"])                                      # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import time

import torch

from speculate import theory

from ..api import SpeculativeGenerator
from . import speech


def _plain(target, feats: torch.Tensor, n: int) -> list[list[int]]:
    with torch.inference_mode():
        return target.generate(input_features=feats, max_new_tokens=n, do_sample=False).tolist()


def demo(argv: list[str] | None = None) -> int:
    """Run the speech demo; returns a process exit status (0 on success)."""
    ap = argparse.ArgumentParser(prog="speculate demo speech", description=__doc__.split("\n")[0])
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--utterances", type=int, default=None, help="held-out utterances to use (default all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="8 utterances, one timing repeat")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        target, draft, tok = speech.load_speech_pair()
        waves, refs = speech.load_heldout()
    except (FileNotFoundError, ImportError) as err:
        print(f"speculate demo speech: the embedded speech pair is not available ({err})")
        return 1
    m = 8 if args.quick else (args.utterances or len(waves))
    waves, refs = waves[:m], refs[:m]
    n_new = 32
    eos = target.config.eos_token_id
    k = args.lookahead
    gen = SpeculativeGenerator(target, draft, lookahead=k)
    feats = speech.features(waves)
    nt = sum(p.numel() for p in target.parameters())
    nd = sum(p.numel() for p in draft.parameters())
    print(f"Embedded speech pair: target WhisperForConditionalGeneration ({target.config.encoder_layers} "
          f"encoder + {target.config.decoder_layers} decoder layers, {nt / 1e6:.2f}M parameters), draft "
          f"WhisperForCausalLM ({draft.config.decoder_layers} decoder layer(s) on the target's encoder, "
          f"{nd / 1e6:.2f}M); {m} held-out utterances, greedy, lookahead {k}.\n")

    # transcripts (batch 8 both ways)
    plain_rows, spec_rows = [], []
    for i in range(0, m, 8):
        plain_rows += [speech.text_tokens(r, eos) for r in _plain(target, feats[i:i + 8], n_new)]
        out = gen.generate(input_features=feats[i:i + 8], max_new_tokens=n_new, temperature=0, rng=0)
        spec_rows += [speech.text_tokens(r, eos) for r in out.new_tokens]
    dec = [tok.decode(r, skip_special_tokens=True) for r in plain_rows]
    dec_s = [tok.decode(r, skip_special_tokens=True) for r in spec_rows]
    width = max(len(r) for r in refs)
    print(f"{'reference':<{width}}  | {'plain greedy':<{width}}  | speculative (same?)")
    for r, a, b in zip(refs, dec, dec_s, strict=True):
        print(f"{r:<{width}}  | {a:<{width}}  | {'=' if a == b else b}")
    print(f"\nword error rate: plain {speech.word_error_rate(refs, dec):.4f}, speculative "
          f"{speech.word_error_rate(refs, dec_s):.4f}; identical token sequences: {plain_rows == spec_rows}\n")

    # timing: batch 1 (every utterance on its own) and batch 8, interleaved
    repeats = 1 if args.quick else 2
    s1 = None
    for b in (1, 8):
        t_plain = t_spec = 0.0
        tokens = 0
        stats = []
        for _ in range(repeats):
            for i in range(0, m, b):
                x = feats[i:i + b]
                t0 = time.perf_counter()
                rows = [speech.text_tokens(r, eos) for r in _plain(target, x, n_new)]
                t_plain += time.perf_counter() - t0
                tokens += sum(len(r) + (len(r) < n_new) for r in rows)
                t0 = time.perf_counter()
                o = gen.generate(input_features=x, max_new_tokens=n_new, temperature=0, rng=0)
                t_spec += time.perf_counter() - t0
                stats.append(o.stats)
        print(f"batch {b}: plain greedy {tokens / t_plain:7.1f} tokens/s | speculative {tokens / t_spec:7.1f} "
              f"tokens/s | speedup {t_plain / t_spec:.2f}x")
        if b == 1:
            s1 = sum(stats[1:], stats[0])
    a = s1.alpha
    c = s1.cost_ratio
    print(f"\nacceptance alpha = {a:.3f} (greedy: the draft's argmax equals the target's), accepted-length "
          f"histogram {s1.accepted_per_position.tolist()}")
    print(f"tokens per target call: measured {s1.tokens_per_call:.2f}, theory (1 - a^(k+1)) / (1 - a) = "
          f"{theory.expected_tokens(a, k):.2f}")
    print(f"cost ratio c = {c:.3f} (draft step / target step, measured in the run); theoretical speedup "
          f"{theory.speedup(a, k, c):.2f}x, best lookahead for these a, c: {theory.optimal_lookahead(a, c, 16)}")
    print("\nTranscripts are exactly the target's at any temperature (tests/text/test_text_speech.py).")
    return 0
