"""Never slower than plain decoding: ``lookahead="auto"`` against plain decoding at batch 1 to 64.

For each batch size, the same prompts (held-out Python standard library sources) and the same number
of new tokens (EOS does not stop rows) run three ways through the same generator loop:
``plain`` (``lookahead=0``: no drafts), ``auto`` (``lookahead="auto"``: k in 0..8 chosen each round
from the measured costs, 0 included) and ``k=4`` (a fixed lookahead, for reference). The methods are
interleaved in each repeat and every ratio is of times measured in the same repeat (median over the
repeats). Goal (issue #35): auto / plain tokens per second >= 0.98 at every batch size.

Run: ``python benchmarks/text/bench_batch_sweep.py`` (embedded pair), ``--pair large``;
``--quick`` for a smoke run. Writes ``benchmarks/results/text_batch_sweep[_<pair>].{json,md,png}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "text"))

from bench_generate import load, prompts  # noqa: E402
from report import command, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402

METHODS = {"plain": 0, "auto": "auto", "k=4": 4}


def run(gens: dict, rows: list[list[int]], n_new: int, temperature: float, seed: int) -> dict:
    out = {}
    for name, gen in gens.items():
        t0 = time.perf_counter()
        res = gen.generate(rows, max_new_tokens=n_new, temperature=temperature, eos_token_id=[], rng=seed)
        dt = time.perf_counter() - t0
        out[name] = {"seconds": dt, "tokens": sum(len(t) for t in res.new_tokens),
                     "k": {int(k): int(v) for k, v in res.stats.lookahead_counts.items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="embedded")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        batches, args.repeats, args.new_tokens = [1, 8], 1, 24
    target, draft, tok = load(args.pair, "cpu", torch.float32, False)
    gens = {name: SpeculativeGenerator(target, draft, lookahead=la, max_lookahead=8) for name, la in METHODS.items()}
    pool = prompts(tok, max(batches), 200, seed=0)
    run(gens, pool[:2], 8, args.temperature, 0)  # warm up every path
    rows_out = []
    for b in batches:
        rows = pool[:b]
        reps = []
        for r in range(args.repeats):
            order = dict(list(gens.items())[:: 1 if r % 2 == 0 else -1])
            reps.append(run(order, rows, args.new_tokens, args.temperature, r))
        tps = {m: [x[m]["tokens"] / x[m]["seconds"] for x in reps] for m in gens}
        ratio = {m: statistics.median(x["plain"]["seconds"] / x[m]["seconds"] for x in reps) for m in gens}
        ks: dict[int, int] = {}
        for x in reps:
            for k, v in x["auto"]["k"].items():
                ks[k] = ks.get(k, 0) + v
        row = {"batch": b, "tokens_per_s": {m: statistics.median(v) for m, v in tps.items()},
               "over_plain": ratio, "auto_lookahead_rounds": dict(sorted(ks.items())),
               "over_plain_range": {m: [min(x["plain"]["seconds"] / x[m]["seconds"] for x in reps),
                                        max(x["plain"]["seconds"] / x[m]["seconds"] for x in reps)] for m in gens}}
        rows_out.append(row)
        print(f"batch {b:3d}: " + "  ".join(f"{m} {row['tokens_per_s'][m]:8.1f} tok/s ({ratio[m]:.2f}x)"
                                            for m in gens) + f"  auto k: {row['auto_lookahead_rounds']}", flush=True)
    cmd = command(argv, __file__)
    env = machine()
    md = [f"# Batch sweep: lookahead=\"auto\" against plain decoding ({args.pair} pair)", "",
          f"Command: `{cmd}`", "", f"Machine: {describe(env)}.", "",
          f"{args.new_tokens} new tokens per row, temperature {args.temperature}, {args.threads} torch thread(s), "
          f"median of {args.repeats} interleaved repeats (ratios of times from the same repeat).", "",
          "| batch | plain tok/s | auto tok/s | k=4 tok/s | auto / plain (goal >= 0.98) | k=4 / plain | "
          "auto's rounds by k |", "|---|---|---|---|---|---|---|"]
    for r in rows_out:
        t, o = r["tokens_per_s"], r["over_plain"]
        lo, hi = r["over_plain_range"]["auto"]
        md.append(f"| {r['batch']} | {t['plain']:.1f} | {t['auto']:.1f} | {t['k=4']:.1f} | {o['auto']:.2f}x "
                  f"({lo:.2f}-{hi:.2f}) | {o['k=4']:.2f}x | {r['auto_lookahead_rounds']} |")
    worst = min(r["over_plain"]["auto"] for r in rows_out)
    md += ["", f"Worst auto / plain: {worst:.2f}x ({'meets' if worst >= 0.98 else 'misses'} the 0.98 goal)."]
    fig = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        bs = [r["batch"] for r in rows_out]
        for m in gens:
            ax.plot(bs, [r["over_plain"][m] for r in rows_out], marker="o", label=m)
        ax.axhline(0.98, color="gray", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens/s over plain")
        ax.legend()
        fig.tight_layout()
    except ImportError:
        pass
    name = "text_batch_sweep" + ("" if args.pair == "embedded" else f"_{args.pair}") + ("_quick" if args.quick else "")
    write(name, {"command": cmd, "args": vars(args), "rows": rows_out, "machine": env}, "\n".join(md), fig)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
