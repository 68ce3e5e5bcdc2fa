"""``speculate generate``: speculative text generation from the command line.

    speculate generate --prompt "def fib(n):"                       # the embedded pair
    echo "import os" | speculate generate --max-new-tokens 64 --stream
    speculate generate --target path/to/model --draft early-exit:4 --prompt "Hello" --json

``--target PATH`` (a transformers causal LM folder; default: the embedded pair) and ``--draft``
(a model folder, ``ngram``, ``ngram:N`` or ``early-exit:N``; default: the embedded draft with the
embedded target, ``ngram`` otherwise). The prompt comes from ``--prompt`` or standard input.
``--stream`` prints tokens as they are accepted (on a terminal, the drafted tokens the target
accepted are shown in green); ``--json`` prints the texts and the statistics as JSON. Otherwise the
text is printed, then a line with tokens/s, alpha and tokens per target call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["main"]

GREEN, RESET = "\x1b[32m", "\x1b[0m"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculate generate",
                                description="Exact speculative text generation (default: the embedded pair).")
    p.add_argument("--target", metavar="PATH", help="target model folder (default: the embedded pair)")
    p.add_argument("--draft", metavar="PATH|ngram|early-exit:N",
                   help="draft model folder, 'ngram', 'ngram:N' or 'early-exit:N' "
                        "(default: the embedded draft, or 'ngram' with --target)")
    p.add_argument("--prompt", help="the prompt (default: read standard input)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--lookahead", default="auto", help="drafts per round, or 'auto' (default)")
    p.add_argument("--verify", default="block", choices=["block", "token", "greedy"])
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    out.add_argument("--json", action="store_true", help="print texts and statistics as JSON")
    return p


def _load(args: argparse.Namespace, device: str) -> tuple[Any, Any, Any]:
    import torch

    from .pair import load_pair

    if args.target is None:
        target, draft, tok = load_pair(device=device)
        if args.draft is not None:
            draft = _draft(args.draft, device)
        return target, draft, tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(args.target):
        raise FileNotFoundError(f"--target {args.target!r} is not a folder (a transformers model folder: "
                                "config.json and weights)")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    try:
        tok = AutoTokenizer.from_pretrained(args.target)
    except (OSError, ValueError, KeyError):
        from .tokenizer import ByteTokenizer

        tok = ByteTokenizer.from_pretrained(args.target)
    return target, _draft(args.draft or "ngram", device, dtype), tok


def _draft(spec: str, device: str, dtype: Any = None) -> Any:
    if not os.path.isdir(spec):  # 'ngram', 'early-exit:N' (anything else: the generator's error)
        return spec
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(spec, dtype=dtype).to(device).eval()


def _summary(n: int, seconds: float, stats: Any) -> str:
    if stats is None:
        from speculate.stats import Stats

        stats = Stats()
    rate = n / seconds if seconds > 0 else float("nan")
    return (f"[{n} tokens in {seconds:.2f} s: {rate:.1f} tokens/s, alpha {stats.alpha:.2f}, "
            f"{stats.tokens_per_call:.2f} tokens per target call]")


def _stream(gen: Any, prompt: str, kw: dict[str, Any], color: bool) -> tuple[int, Any]:
    from .strings import IncrementalDecoder

    dec = IncrementalDecoder(gen.tokenizer)
    n, stats = 0, None
    for ev in gen.stream(prompt, **kw):
        toks, stats = ev.tokens[0], ev.stats
        n += len(toks)
        if not toks:
            continue
        drafted, own = dec.push(toks[:-1]), dec.push(toks[-1:])  # accepted drafts, then the target's
        text = (f"{GREEN}{drafted}{RESET}" if color and drafted else drafted) + own
        if ev.finished:
            text += dec.flush()
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return n, stats


def main(argv: list[str] | None = None) -> int:
    """Run ``speculate generate`` with ``argv``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            parser.error("give a prompt with --prompt TEXT or on standard input")
        args.prompt = sys.stdin.read()
    if not args.prompt:
        parser.error("the prompt is empty")
    lookahead: int | str = args.lookahead
    if lookahead != "auto":
        try:
            lookahead = int(lookahead)
        except ValueError:
            parser.error(f"--lookahead must be an integer or 'auto', got {args.lookahead!r}")
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")
    try:
        import torch
        from transformers.utils import logging as hf_logging

        from .api import SpeculativeGenerator

        hf_logging.disable_progress_bar()  # no weight-loading bars between the prompt and the text
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        target, draft, tok = _load(args, device)
        verify = "greedy" if args.temperature == 0 else args.verify
        gen = SpeculativeGenerator(target, draft, lookahead=lookahead, verify=verify, tokenizer=tok)
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, rng=args.seed, repetition_penalty=args.repetition_penalty)
        t0 = time.perf_counter()
        if args.stream:
            n, stats = _stream(gen, args.prompt, kw, sys.stdout.isatty())
            print(_summary(n, time.perf_counter() - t0, stats))
            return 0
        out = gen.generate(args.prompt, **kw)
        seconds = time.perf_counter() - t0
        n = sum(len(t) for t in out.new_tokens)
        if args.json:
            print(json.dumps({"texts": out.texts, "new_tokens": n, "seconds": seconds,
                              "tokens_per_second": n / seconds if seconds > 0 else None,
                              "stats": out.stats.as_dict()}, default=float))
        else:
            print(args.prompt + out.texts[0])
            print(_summary(n, seconds, out.stats))
        return 0
    except (ValueError, TypeError, FileNotFoundError, OSError) as err:
        print(f"speculate generate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
