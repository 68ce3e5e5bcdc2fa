"""``speculate generate``: speculative text generation from the command line.

    speculate generate --prompt "def fib(n):"                       # the embedded pair
    echo "import os" | speculate generate --max-new-tokens 64 --stream
    speculate generate --target path/to/model --draft early-exit:4 --prompt "Hello" --json
    speculate generate --prompt "def a(" --prompt "class B" --num-return-sequences 2 --stop "\n\n"

``--target PATH`` (a transformers causal LM folder; default: the embedded pair) and ``--draft``
(a model folder, ``ngram``, ``ngram:N``, ``suffix``, ``suffix:N`` or ``early-exit:N``; default: the
embedded draft with the embedded target, ``ngram`` otherwise). The prompt comes from ``--prompt``
(repeat it for several prompts, decoded as one batch) or standard input. Each prompt and its text go to standard output
(the prompt, then the new text; several texts are separated by a line of ``---``); the statistics
line (tokens/s, alpha, tokens per target call) goes to standard error, so the output is the text
alone. ``--stream`` prints the same text as it is accepted (one prompt and sequence; on a terminal,
the drafted tokens the target accepted are shown in green); ``--json`` prints the texts and the
statistics as JSON. ``--threads N`` sets torch's CPU threads (default: torch's own, all cores: a
real model's matrix products use them; the demo pins 1 because its tiny models are overhead-bound).
Bad arguments, a missing model or a device this torch cannot use print a message and exit with
status 2.
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


def _version() -> str:
    from speculate import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculate generate",
                                description="Exact speculative text generation (default: the embedded pair).")
    p.add_argument("--target", metavar="PATH", help="target model folder (default: the embedded pair)")
    p.add_argument("--draft", metavar="PATH|ngram|suffix|early-exit:N",
                   help="draft model folder, 'ngram', 'ngram:N', 'suffix', 'suffix:N' (token trees from earlier "
                        "continuations) or 'early-exit:N' (default: the embedded draft, or 'ngram' with --target)")
    p.add_argument("--prompt", action="append", help="the prompt (repeat for several; default: standard input)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--lookahead", default="auto", help="drafts per round, or 'auto' (default)")
    p.add_argument("--verify", default="block", choices=["block", "token", "greedy"])
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop a row after this text (repeat for several)")
    p.add_argument("--num-return-sequences", type=int, default=1, metavar="N",
                   help="independent continuations per prompt (default 1)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", default=None,
                       help="constrain the output to this JSON schema (a file; needs speculate[structured])")
    shape.add_argument("--regex", metavar="R", default=None, help="constrain the output to match this regex")
    shape.add_argument("--grammar", metavar="FILE", default=None, help="constrain the output to this Lark grammar")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: torch's own, all cores)")
    p.add_argument("--version", action="version", version=f"speculate {_version()}")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    out.add_argument("--json", action="store_true", help="print texts and statistics as JSON")
    return p


def _load(args: argparse.Namespace, device: str) -> tuple[Any, Any, Any]:
    import torch

    from .examples.pair import load_pair

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
        from .examples.tokenizer import ByteTokenizer

        tok = ByteTokenizer.from_pretrained(args.target)
    return target, _draft(args.draft or "ngram", device, dtype), tok


def _draft(spec: str, device: str, dtype: Any = None) -> Any:
    if not os.path.isdir(spec):  # 'ngram', 'suffix', 'early-exit:N' (anything else: the generator's error)
        return spec
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(spec, dtype=dtype).to(device).eval()


def _summary(n: int, seconds: float, stats: Any) -> str:
    if stats is None:
        from speculate.stats import Stats

        stats = Stats()
    rate = f"{n / seconds:.1f}" if seconds > 0 else "n/a"
    alpha = f"{stats.alpha:.2f}" if stats.verified else "n/a"  # no draft verified: no acceptance to show
    per_call = f"{stats.tokens_per_call:.2f}" if stats.target_calls else "n/a"
    return f"[{n} tokens in {seconds:.2f} s: {rate} tokens/s, alpha {alpha}, {per_call} tokens per target call]"


def _stream(gen: Any, prompt: str, kw: dict[str, Any], color: bool) -> tuple[int, Any]:
    from .request.strings import IncrementalDecoder

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


def _device(name: str | None, parser: argparse.ArgumentParser) -> str:
    """The torch device to load on, checked before any model is read."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as e:
        parser.error(f"--device {name!r} is not a torch device ({e})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: this torch ({torch.__version__}) has no CUDA device available; "
                     "use --device cpu, or a CUDA build of torch on a machine with a GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        parser.error(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    return name


def main(argv: list[str] | None = None) -> int:
    """Run ``speculate generate`` with ``argv``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            parser.error("give a prompt with --prompt TEXT or on standard input")
        args.prompt = [sys.stdin.read()]
    if not all(args.prompt):
        parser.error("the prompt is empty")
    lookahead: int | str = args.lookahead
    if lookahead != "auto":
        try:
            lookahead = int(lookahead)
        except ValueError:
            parser.error(f"--lookahead must be an integer or 'auto', got {args.lookahead!r}")
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")
    if args.num_return_sequences < 1:
        parser.error("--num-return-sequences must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.stream and len(args.prompt) * args.num_return_sequences > 1:
        parser.error("--stream prints one sequence: give one prompt and --num-return-sequences 1")
    if args.stop is not None and not all(args.stop):
        parser.error("--stop takes a non-empty text")
    try:
        import torch
        from transformers.utils import logging as hf_logging

        from .api import SpeculativeGenerator

        device = _device(args.device, parser)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        hf_logging.disable_progress_bar()  # no weight-loading bars between the prompt and the text
        target, draft, tok = _load(args, device)
        verify = "greedy" if args.temperature == 0 else args.verify
        gen = SpeculativeGenerator(target, draft, lookahead=lookahead, verify=verify, tokenizer=tok)
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, rng=args.seed, repetition_penalty=args.repetition_penalty,
                  stop_strings=args.stop, num_return_sequences=args.num_return_sequences)
        if args.json_schema is not None:
            with open(args.json_schema, encoding="utf-8") as f:
                kw["json_schema"] = f.read()
        elif args.grammar is not None:
            with open(args.grammar, encoding="utf-8") as f:
                kw["grammar"] = f.read()
        elif args.regex is not None:
            kw["regex"] = args.regex
        t0 = time.perf_counter()
        if args.stream:
            sys.stdout.write(args.prompt[0])
            n, stats = _stream(gen, args.prompt[0], kw, sys.stdout.isatty())
            print(_summary(n, time.perf_counter() - t0, stats), file=sys.stderr)
            return 0
        prompts = args.prompt[0] if len(args.prompt) == 1 else args.prompt
        out = gen.generate(prompts, **kw)
        seconds = time.perf_counter() - t0
        n = sum(len(t) for t in out.new_tokens)
        if args.json:
            print(json.dumps({"prompts": args.prompt, "texts": out.texts, "new_tokens": n, "seconds": seconds,
                              "tokens_per_second": n / seconds if seconds > 0 else None,
                              "finish_reasons": out.finish_reasons, "stats": out.stats.as_dict()}, default=float))
        else:
            k = args.num_return_sequences
            blocks = [args.prompt[i // k] + text for i, text in enumerate(out.texts)]
            print("\n---\n".join(blocks))
            print(_summary(n, seconds, out.stats), file=sys.stderr)
        return 0
    except (ValueError, TypeError, FileNotFoundError, OSError, RuntimeError) as err:
        print(f"speculate generate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
