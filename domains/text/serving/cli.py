"""``speculate serve``: the OpenAI-compatible server from the command line.

    speculate serve                                          # the embedded pair on 127.0.0.1:8000
    speculate serve --target path/to/model --draft early-exit:4 --port 9000 --model-name my-model
    speculate serve --draft heads                            # the embedded target's Medusa heads
    speculate serve --draft none                             # plain decoding (no speculation)

``--target PATH`` (a transformers causal LM folder; default: the embedded pair) and ``--draft``
(a model folder, ``ngram``, ``ngram:N``, ``early-exit:N``, ``heads`` (Medusa heads trained for the
target, in ``target-heads/`` beside its folder) or ``none``; default: the embedded draft with the
embedded target, ``ngram`` otherwise). Bad arguments, a missing model or a device this torch cannot
use print a message and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculate serve",
                                description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, "
                                            "/v1/models, /health, /metrics) with exact speculative decoding.")
    p.add_argument("--target", metavar="PATH", help="target model folder (default: the embedded pair)")
    p.add_argument("--draft", metavar="PATH|ngram|early-exit:N|heads|none",
                   help="draft model folder, 'ngram', 'ngram:N', 'early-exit:N', 'heads' or 'none' "
                        "(default: the embedded draft, or 'ngram' with --target)")
    p.add_argument("--lookahead", default=None,
                   help="drafts per round (default: the draft's own, 4 for a model: a request's seed then gives the "
                        "same tokens alone or in a batch), or 'auto' (chosen from the batch's acceptance: exact, "
                        "not seed-stable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=32, help="rows decoded together at most (default 32)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting at most; beyond, 429 (default 64)")
    p.add_argument("--model-name", default="speculate", help="the model name clients send (default 'speculate')")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads (default: torch's own)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def _generator(args: argparse.Namespace, device: str, lookahead: int | str | None) -> Any:
    from ..api import SpeculativeGenerator
    from ..cli import _load

    kind = (args.draft or "").lower()
    load = argparse.Namespace(target=args.target, draft=None if kind in ("heads", "none") else args.draft)
    target, draft, tok = _load(load, device)
    if kind == "none":  # plain decoding: no drafts per round
        draft, lookahead = "ngram", 0
    elif kind == "heads":
        from ..examples.pair import load_self_drafts

        draft = load_self_drafts(target, None if args.target is None else Path(args.target).resolve().parent)[0]
    return SpeculativeGenerator(target, draft, lookahead=lookahead, tokenizer=tok)


def main(argv: list[str] | None = None) -> int:
    """Run ``speculate serve`` with ``argv``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    lookahead: int | str | None = args.lookahead
    if lookahead not in (None, "auto"):
        try:
            lookahead = int(lookahead)
        except ValueError:
            parser.error(f"--lookahead must be an integer or 'auto', got {args.lookahead!r}")
    for flag, value, low in (("--port", args.port, 0), ("--max-batch", args.max_batch, 1),
                             ("--max-queue", args.max_queue, 1), ("--threads", args.threads or 1, 1)):
        if value < low:
            parser.error(f"{flag} must be >= {low}")
    if args.port > 65535:
        parser.error("--port must be <= 65535")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        print(f"speculate serve: missing dependency ({err.name}); install with: pip install 'speculate[serve]'",
              file=sys.stderr)
        return 1
    try:
        import torch
        from transformers.utils import logging as hf_logging

        from ..cli import _device
        from .server import serve

        device = _device(args.device, parser)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        hf_logging.disable_progress_bar()
        gen = _generator(args, device, lookahead)
    except (ValueError, TypeError, FileNotFoundError, OSError, RuntimeError) as err:
        print(f"speculate serve: error: {err}", file=sys.stderr)
        return 2
    print(f"speculate serve: {args.model_name} on http://{args.host}:{args.port} (OpenAI API under /v1)",
          file=sys.stderr)
    serve(gen, host=args.host, port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
          model_name=args.model_name, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
