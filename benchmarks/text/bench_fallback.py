"""What the fallback runtime costs: the embedded pair decoded on speculate's position-indexed cache
against the same pair forced onto transformers' own cache (domains/text/models/transformers_cache.py, the path a
model the fast path refuses takes), alternately, batch 1 and 8, CPU, one thread.

    python benchmarks/text/bench_fallback.py            # writes results/text_fallback.{json,md}

The two runtimes draw from the same law with the same uniforms, so the same seed gives the same
tokens up to float rounding of the logits (the share of identical rows is reported); the time ratio
is what the FallbackWarning's "slower" means on this pair.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py
from report import command, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples.pair import load_pair  # noqa: E402
from speculate.domains.text.models import pick  # noqa: E402


def generator(target, draft, tok, fallback: bool) -> SpeculativeGenerator:
    """The pair on the fast path, or forced onto the fallback (the fast path's probe made to refuse)."""
    if not fallback:
        return SpeculativeGenerator(target, draft, lookahead=4, tokenizer=tok)
    saved = pick.fast_path_refusal
    pick.fast_path_refusal = lambda model: "forced onto the fallback by the benchmark"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pick.FallbackWarning)
            return SpeculativeGenerator(target, draft, lookahead=4, tokenizer=tok)
    finally:
        pick.fast_path_refusal = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="text_fallback")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    target, draft, tok = load_pair()
    gens = {"fast": generator(target, draft, tok, False), "fallback": generator(target, draft, tok, True)}
    assert type(gens["fallback"]._target_lm).__name__ == "TransformersCacheModel"
    prompts = ["import os\n\n\ndef read_lines(path):\n", "class Stack:\n    def __init__(self):\n",
               "def fib(n):\n    if n < 2:\n", "import json\n\n\ndef load(path):\n"]
    rows = []
    for B in args.batch:
        batch = [prompts[i % len(prompts)] for i in range(B)]
        times: dict[str, list[float]] = {"fast": [], "fallback": []}
        seqs, same = {}, []
        for rep in range(args.repeats + 1):  # the first pass warms both up and is not counted
            for name in (("fast", "fallback") if rep % 2 == 0 else ("fallback", "fast")):  # alternate
                t = time.perf_counter()
                out = gens[name].generate(batch, max_new_tokens=args.new_tokens, rng=rep, eos_token_id=[])
                dt = time.perf_counter() - t
                if rep:
                    times[name].append(dt)
                seqs[name] = out.sequences
            same += [a == b for a, b in zip(seqs["fast"], seqs["fallback"], strict=True)]
        n = B * args.new_tokens
        fast, fb = statistics.median(times["fast"]), statistics.median(times["fallback"])
        rows.append({"batch": B, "tokens": n, "fast_s": fast, "fallback_s": fb, "fast_tok_s": n / fast,
                     "fallback_tok_s": n / fb, "slowdown": fb / fast, "same_rows": float(np.mean(same))})
        print(rows[-1], flush=True)
    m = machine()
    payload = {"command": command(argv, __file__), "machine": m, "new_tokens": args.new_tokens,
               "repeats": args.repeats, "rows": rows}
    md = ["# The fallback runtime's cost (embedded pair, CPU, one thread)", "", f"`{payload['command']}`", "",
          describe(m), "", "Medians of alternating runs (the first pass of each, a warm-up, not counted).", "",
          "| batch | fast path tok/s | fallback tok/s | fallback time / fast time | rows with the same tokens |",
          "|---|---|---|---|---|"]
    md += [f"| {r['batch']} | {r['fast_tok_s']:.1f} | {r['fallback_tok_s']:.1f} | {r['slowdown']:.2f} | "
           f"{r['same_rows']:.0%} |" for r in rows]
    write(args.out, payload, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
