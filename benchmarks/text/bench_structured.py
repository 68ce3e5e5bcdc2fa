"""What a constraint costs under speculation: the embedded pair with and without a JSON schema,
plain (no drafts: one target call per token, the same masking code) and speculative, alternately,
batch 1 and 8, CPU, one thread; and the time spent in the grammar (llguidance's masks, advance and
rollback) per token and per round.

    python benchmarks/text/bench_structured.py          # writes results/text_structured.{json,md}

Goals (issue #33): constrained speculative decoding keeps >= 90% of the unconstrained speedup over
plain decoding, and grammar work is <= 5% of a round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py
from report import command, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples.pair import load_pair  # noqa: E402
from speculate.domains.text.request import constraints as cmod  # noqa: E402

RECORD = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}
SCHEMA = {"type": "array", "items": RECORD, "minItems": 3, "maxItems": 3}
PROMPTS = ["records = ", "import json\n\nDATA = ", "# three records\nrows = ", "x = "]


def _timed_constraints():
    """Sum the seconds every request's Constraints spends (their own counters)."""
    made: list = []
    real = cmod.Constraints.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self)

    cmod.Constraints.__init__ = init
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="text_structured")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    target, draft, tok = load_pair()
    gens = {"plain": SpeculativeGenerator(target, draft, lookahead=0, tokenizer=tok),
            "ours": SpeculativeGenerator(target, draft, lookahead=4, tokenizer=tok)}
    made = _timed_constraints()
    rows = []
    for B in args.batch:
        batch = [PROMPTS[i % len(PROMPTS)] for i in range(B)]
        runs = [(g, c) for g in ("plain", "ours") for c in ("constrained", "free")]
        res: dict = {r: {"s": [], "tokens": [], "grammar_s": [], "rounds": []} for r in runs}
        for rep in range(args.repeats + 1):  # the first pass warms everything up and is not counted
            for g, c in (runs if rep % 2 == 0 else runs[::-1]):  # alternate the order
                kw = {"json_schema": SCHEMA} if c == "constrained" else {}
                made.clear()
                t = time.perf_counter()
                out = gens[g].generate(batch, max_new_tokens=args.new_tokens, rng=rep, **kw)
                dt = time.perf_counter() - t
                if rep:
                    r = res[(g, c)]
                    r["s"].append(dt)
                    r["tokens"].append(sum(len(x) for x in out.new_tokens))
                    r["grammar_s"].append(sum(m.seconds for m in made))
                    r["rounds"].append(out.stats.rounds)
                    if c == "constrained":
                        assert out.finish_reasons.count("stop") == B, out.finish_reasons
        med = {f"{g} {c}": {"tok_s": statistics.median(t / s for t, s in zip(r["tokens"], r["s"], strict=True)),
                            "grammar_share": statistics.median(gs / s for gs, s in zip(r["grammar_s"], r["s"],
                                                                                      strict=True)),
                            "grammar_ms_per_token": 1e3 * statistics.median(
                                gs / t for gs, t in zip(r["grammar_s"], r["tokens"], strict=True)),
                            "grammar_ms_per_round": 1e3 * statistics.median(
                                gs / n for gs, n in zip(r["grammar_s"], r["rounds"], strict=True))}
               for (g, c), r in res.items()}
        sp_c = med["ours constrained"]["tok_s"] / med["plain constrained"]["tok_s"]
        sp_f = med["ours free"]["tok_s"] / med["plain free"]["tok_s"]
        rows.append({"batch": B, "runs": med, "speedup_constrained": sp_c, "speedup_free": sp_f,
                     "kept": sp_c / sp_f})
        print(rows[-1], flush=True)
    m = machine()
    payload = {"command": command(argv, __file__), "machine": m, "new_tokens": args.new_tokens,
               "repeats": args.repeats, "schema": SCHEMA, "rows": rows}
    md = ["# Structured output under speculation (embedded pair, CPU, one thread)", "", f"`{payload['command']}`", "",
          describe(m), "",
          "A JSON schema (an array of three records: a string of at most 8 characters, an integer, a boolean)",
          "against free text, plain decoding (lookahead 0: one target call per token, the same masking code) and",
          "speculative decoding (lookahead 4), the four alternating; medians of the runs after a warm-up.",
          "Goals: the constrained speedup >= 90% of the free one; the grammar <= 5% of the time.", "",
          "| batch | plain constrained tok/s | ours constrained tok/s | plain free tok/s | ours free tok/s | "
          "speedup constrained | speedup free | kept | grammar share (ours) | grammar ms/token | grammar ms/round |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["runs"]
        oc = q["ours constrained"]
        md.append(f"| {r['batch']} | {q['plain constrained']['tok_s']:.1f} | {oc['tok_s']:.1f} | "
                  f"{q['plain free']['tok_s']:.1f} | {q['ours free']['tok_s']:.1f} | {r['speedup_constrained']:.2f} | "
                  f"{r['speedup_free']:.2f} | {r['kept']:.0%} | {oc['grammar_share']:.1%} | "
                  f"{oc['grammar_ms_per_token']:.3f} | {oc['grammar_ms_per_round']:.3f} |")
    write(args.out, payload, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
