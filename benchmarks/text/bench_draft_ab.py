"""Drafting time per round of two versions of the library, run alternately (an A/B of a speed change).

Each version decodes the same held-out prompts at batch 1 (and ``--batch``), temperature 1, with the
embedded pair's (``--pair large``: the larger pair's) distilled draft (block rule, lookahead 4), its
Medusa heads (chain of 4) and its EAGLE feature draft (chain of 4), in a fresh process with ITS OWN
code on the import path (the earlier revision in a temporary git worktree), in the order before,
after, after, before, ...
Reported per version and method: drafting time per round (``draft_time / target_calls``, what
``c_round`` divides by the plain step) and the target's time per call (the same model in both
versions: a check on the machine's noise), medians over the runs, and the after / before ratio.

Run: ``python benchmarks/text/bench_draft_ab.py --before REV`` (about 5 minutes with the defaults).
Writes ``benchmarks/results/draft_ab.{json,md}`` (``--name``: another name).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "text"))

METHODS = ("distilled-block-4", "medusa-chain-4", "eagle-chain-4")


def worker(batches: list[int], prompts_n: int, new_tokens: int, pair: str = "embedded") -> dict:
    """In the version on the import path: per batch size and method, drafting and target time per round."""
    import torch
    from bench_generate import batch, pair_path, prompts
    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.examples.pair import load_pair, load_self_drafts

    import speculate

    torch.set_num_threads(1)
    path = pair_path(pair)
    target, draft, tok = load_pair(path=path)
    # revisions before b3781f3 take no folder: the embedded pair's drafts are their only ones
    heads, fd = load_self_drafts(target, path) if path is not None else load_self_drafts(target)
    pad = int(target.config.pad_token_id)
    gens = {"distilled-block-4": SpeculativeGenerator(target, draft, lookahead=4, verify="block"),
            "medusa-chain-4": SpeculativeGenerator(target, heads, lookahead=4, verify="block"),
            "eagle-chain-4": SpeculativeGenerator(target, fd, lookahead=4, verify="block")}
    rows = prompts(tok, prompts_n, 128, seed=0)
    out: dict = {"package": str(Path(speculate.__file__).parent)}
    for B in batches:
        groups = [rows[i : i + B] for i in range(0, len(rows), B)]
        res = {}
        for m, g in gens.items():
            ids, mask = batch(groups[0], pad, "cpu")
            g.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], rng=0)  # warm-up
            d = t = calls = acc = rr = 0.0
            for i, grp in enumerate(groups):
                ids, mask = batch(grp, pad, "cpu")
                s = g.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=[], rng=i).stats
                d, t, calls = d + s.draft_time, t + s.target_time, calls + s.target_calls
                acc, rr = acc + s.accepted, rr + s.row_rounds
            res[m] = {"draft_us_per_round": 1e6 * d / calls, "target_us_per_call": 1e6 * t / calls,
                      "tokens_per_call": (acc + rr) / rr}
        out[f"batch {B}"] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="the earlier revision (any git revision)")
    ap.add_argument("--rounds", type=int, default=6, help="runs of each version (alternating)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--pair", default="embedded", help="embedded, or large (a revision from b3781f3 on)")
    ap.add_argument("--name", default="draft_ab", help="the results' file name (benchmarks/results/NAME.*)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.batch, args.prompts, args.new_tokens, args.pair)))
        return 0
    if not args.before:
        ap.error("--before REV is required")
    if args.rounds < 1 or any(b < 1 for b in args.batch):
        ap.error("--rounds and --batch must be >= 1")
    from report import alternating, describe, machine, short_rev, versions_line, worktree, write

    env = machine()
    rev = short_rev(args.before)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    cmd = [sys.executable, __file__, "--worker", "--batch", *map(str, args.batch), "--prompts", str(args.prompts),
           "--new-tokens", str(args.new_tokens), "--pair", args.pair]
    with worktree(rev) as before:
        roots = {"before": before, "after": ROOT}
        for r, v in alternating(args.rounds):
            res = json.loads(subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(roots[v])},
                                            check=True, capture_output=True, text=True).stdout)
            if not res.pop("package").startswith(str(roots[v])):
                raise RuntimeError(f"the {v} run imported another tree's speculate package")
            runs[v].append(res)
            print(f"round {r} {v}: " + "; ".join(
                f"{b} {m} {x['draft_us_per_round']:.0f} us" for b, ms in res.items() for m, x in ms.items()),
                flush=True)
    med = {v: {b: {m: {k: statistics.median(run[b][m][k] for run in rs) for k in rs[0][b][m]}
                   for m in rs[0][b]} for b in rs[0]} for v, rs in runs.items()}
    lines = ["# Drafting time per round: two versions, alternately", "",
             f"Command: `{env['command']}` on {describe(env)}.",
             f"{versions_line(rev, env)} The {args.pair} pair and its drafts; {args.prompts} held-out prompts of "
             f"128 bytes, {args.new_tokens} new tokens, temperature 1, 1 torch thread; {args.rounds} runs of each "
             "version in the order before, after, after, before, ...; medians over the runs.", "",
             "| batch | method | draft us/round before | after | after / before | target us/call before | after "
             "| tokens/call before | after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b in med["after"]:
        for m in METHODS:
            x, y = med["before"][b][m], med["after"][b][m]
            lines.append(f"| {b.split()[1]} | {m} | {x['draft_us_per_round']:.0f} | {y['draft_us_per_round']:.0f} | "
                         f"{y['draft_us_per_round'] / x['draft_us_per_round']:.3f} | {x['target_us_per_call']:.0f} | "
                         f"{y['target_us_per_call']:.0f} | {x['tokens_per_call']:.2f} | {y['tokens_per_call']:.2f} |")
    write(args.name, {"command": env["command"], "before": rev, "after": env["git_commit"] + " (working tree)",
                       "runs": runs, "median": med, "machine": env}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
