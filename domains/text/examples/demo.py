"""``speculate demo text``: speculative decoding with the embedded model pair, on CPU.

Generates Python-like text from the embedded byte-level Llama pair (a 12-layer target and a
1-layer draft distilled from it), prints it, then times plain sampling (``target.generate``) and
speculative sampling (same temperature, same number of tokens) at batch 1 and batch 8, and prints
the measured acceptance and tokens per target call next to theory (``speculate.theory``).

Example:
    >>> from speculate.domains.text.examples.demo import demo
    >>> demo(["--quick"])                                      # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import time

import torch

from speculate import theory

from ..api import SpeculativeGenerator

PROMPT = 'import os\n\n\ndef read_lines(path, encoding="utf-8"):\n    """'


def _plain(target, ids, mask, n: int, pad: int, seed: int) -> float:
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    target.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=n, min_new_tokens=n,
                    pad_token_id=pad)
    return time.perf_counter() - t0


def _batch(tok, texts: list[str], device: str):
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def demo(argv: list[str] | None = None) -> int:
    """Run the text demo; returns a process exit status (0 on success)."""
    ap = argparse.ArgumentParser(prog="speculate demo text", description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--verify", default="block", choices=["block", "token"])
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer tokens, one timing repeat")
    args = ap.parse_args(argv)
    n, repeats = (64, 1) if args.quick else (args.new_tokens, 2)
    torch.set_num_threads(args.threads)
    try:
        from transformers.utils import logging as hf_logging

        from .pair import load_pair

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in the demo's report
        target, draft, tok = load_pair(device=args.device)
    except (FileNotFoundError, ImportError) as err:
        print(f"speculate demo text: the embedded model pair is not available ({err})")
        return 1
    pad = tok.pad_token_id
    k = args.lookahead
    gen = SpeculativeGenerator(target, draft, lookahead=k, verify=args.verify)
    sample = {"temperature": args.temperature, "top_p": args.top_p}
    print(f"Embedded pair: target {_size(target)}, draft {_size(draft)}, byte vocabulary "
          f"({len(tok)} ids); {args.verify} verification, lookahead {k}, temperature "
          f"{args.temperature}{f', top-p {args.top_p}' if args.top_p else ''}.\n")

    ids, mask = _batch(tok, [args.prompt], args.device)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=n, rng=args.seed,
                       eos_token_id=tok.eos_token_id, **sample)
    text = tok.decode_bytes(out.sequences[0]).decode("utf-8", errors="replace")
    print("-" * 78 + "\n" + text + "\n" + "-" * 78)

    # timing: the same prompt, n tokens each (EOS does not stop rows here), interleaved repeats
    rows = {1: (ids, mask), 8: _batch(tok, [args.prompt[: 12 + 6 * i] for i in range(8)],
                                      args.device)}
    for b, (bi, bm) in rows.items():
        t_plain = t_spec = 0.0
        stats = None
        for r in range(repeats):
            t_plain += _plain(target, bi, bm, n, pad, args.seed + r)
            t0 = time.perf_counter()
            o = gen.generate(bi, attention_mask=bm, max_new_tokens=n, rng=args.seed + r,
                             eos_token_id=[], **sample)
            t_spec += time.perf_counter() - t0
            stats = o.stats
        tokens = b * n * repeats
        print(f"batch {b}: plain sampling {tokens / t_plain:7.1f} tokens/s | speculative "
              f"{tokens / t_spec:7.1f} tokens/s | speedup {t_plain / t_spec:.2f}x")
        if b == 1:
            s1 = stats
    c = (s1.draft_time / s1.draft_calls) / _step(target, ids, mask, pad)  # our draft step / plain step
    a = s1.alpha
    print(f"\nacceptance alpha = {a:.3f} (token-level estimate), accepted-length histogram "
          f"{s1.accepted_per_position.tolist()}")
    print(f"tokens per target call: measured {s1.tokens_per_call:.2f}, theory "
          f"(1 - a^(k+1)) / (1 - a) = {theory.expected_tokens(a, k):.2f}")
    print(f"cost ratio c = draft step (as the generator runs it) / plain target step = {c:.3f}; theoretical speedup "
          f"{theory.speedup(a, k, c):.2f}x (Leviathan et al.), best lookahead for these a, c: "
          f"{theory.optimal_lookahead(a, c, 16)}")
    print("\nThe output law is exactly the target's (see tests/text/test_text_exactness.py).")
    return 0


def _size(model) -> str:
    n = sum(p.numel() for p in model.parameters())
    cfg = model.config
    return f"{cfg.num_hidden_layers}x{cfg.hidden_size} ({n / 1e6:.2f}M parameters)"


def _step(model, ids, mask, pad: int, n: int = 32) -> float:
    t0 = time.perf_counter()
    model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                   pad_token_id=pad)
    return (time.perf_counter() - t0) / n
