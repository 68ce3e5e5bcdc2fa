"""Drafts on the target (Medusa heads, an EAGLE feature draft) against a separate draft model and
early exit, with chains and with token trees, batch 1 and 8, all side by side in one run.

Every method decodes the same prompts (held-out standard-library sources) to the same number of
new tokens at temperature 1 (EOS stops no row). Methods are interleaved group by group and the
order rotates; each repeat gives a time per method and every speedup is a ratio of times of the
same repeat (median over repeats, with the range).

- ``plain``: ``target.generate(do_sample=True)`` (transformers, KV cache);
- ``distilled-*``: the pair's distilled draft model (chains; ``block-auto`` is the best
  configuration measured before: 2.31x at batch 1 on the embedded pair, 2.58x on the large one);
- ``early-exit-N``: the target's first N layers and head as the draft;
- ``medusa-*`` / ``eagle-*``: the heads and the feature draft trained by ``train_heads.py``, as
  chains (block rule; ``-token``: the token rule) or trees (``[b1, b2, ...]``: static branching;
  ``dynamic``: width 4 per level). The tree rule is the token rule with siblings (a one-branch tree
  is a token-rule chain), so what a tree adds is measured against the token-rule chain of the same
  depth, and against the block-rule chain (the block rule's own gain, which trees do not have).

Reported per method: tokens/s, speedup over plain, tokens per target call (kept drafts + 1 per row
and round), ``c_round`` = drafting time per round / time of one plain decoding step (what a round's
drafting costs next to one target step), and ``r`` = time of one verification call / plain step
(the cost of scoring the chain's or tree's tokens at once).

Run: ``python benchmarks/text/bench_heads.py`` (about 3 minutes; 4 with ``--pair large``; 1 torch
thread: ``--threads``);
``--quick`` for a short check; ``--pair large`` for the larger target (its drafts trained by
``train_heads.py --pair large``). Writes ``benchmarks/results/text_heads[_large].{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "text"))

from bench_generate import batch, interleaved, pair_path, prompts  # noqa: E402
from report import command, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples.pair import load_pair, load_self_drafts  # noqa: E402

STATIC_TREE = [3, 2, 1, 1]  # 3 + 6 + 6 + 6 = 21 nodes
WIDE_TREE = [4, 3, 2, 1]  # 4 + 12 + 24 + 24 = 64 nodes
#: block rule, automatic lookahead, batch 1: benchmarks/results/text_generate[_large].md
BEST_BEFORE = {"embedded": 2.31, "large": 2.58}


def generators(target, draft, heads, fd, early_exit: int) -> dict:
    """name -> SpeculativeGenerator (None: plain transformers sampling)."""
    return {
        "plain": None,
        "distilled-block-4": SpeculativeGenerator(target, draft, lookahead=4, verify="block"),
        "distilled-block-auto": SpeculativeGenerator(target, draft, lookahead="auto", verify="block"),
        f"early-exit-{early_exit}-block-4": SpeculativeGenerator(target, f"early-exit:{early_exit}", lookahead=4),
        "medusa-chain-4": SpeculativeGenerator(target, heads, lookahead=4, verify="block"),
        "medusa-chain-4-token": SpeculativeGenerator(target, heads, lookahead=4, verify="token"),
        f"medusa-tree-{STATIC_TREE}": SpeculativeGenerator(target, heads, tree=STATIC_TREE),
        f"medusa-tree-{WIDE_TREE}": SpeculativeGenerator(target, heads, tree=WIDE_TREE),
        "medusa-tree-dynamic": SpeculativeGenerator(target, heads, tree="dynamic"),
        "eagle-chain-4": SpeculativeGenerator(target, fd, lookahead=4, verify="block"),
        "eagle-chain-4-token": SpeculativeGenerator(target, fd, lookahead=4, verify="token"),
        "eagle-chain-auto": SpeculativeGenerator(target, fd, lookahead="auto", verify="block", max_lookahead=8),
        f"eagle-tree-{STATIC_TREE}": SpeculativeGenerator(target, fd, tree=STATIC_TREE),
        f"eagle-tree-{WIDE_TREE}": SpeculativeGenerator(target, fd, tree=WIDE_TREE),
        "eagle-tree-dynamic": SpeculativeGenerator(target, fd, tree="dynamic"),
    }


def run_one(gen, target, rows, n_new: int, pad: int, seed: int):
    ids, mask = batch(rows, pad, "cpu")
    if gen is None:
        torch.manual_seed(seed)
        out = target.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=n_new,
                              min_new_tokens=n_new, pad_token_id=pad)
        return out.shape[0] * (out.shape[1] - ids.shape[1]), None
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=n_new, eos_token_id=[], rng=seed)
    return sum(len(t) for t in out.new_tokens), out.stats


def setting(gens: dict, target, all_rows, B: int, n_new: int, repeats: int, pad: int) -> dict:
    groups = [all_rows[i : i + B] for i in range(0, len(all_rows), B)]
    names = list(gens)
    for m in names:  # untimed warm-up at this batch size
        run_one(gens[m], target, groups[0], 8, pad, seed=0)
    methods = {m: (lambda rows, seed, g=gens[m]: run_one(g, target, rows, n_new, pad, seed)) for m in names}
    times, tokens, stats = interleaved(methods, groups, repeats, f"batch {B}")
    plain_step = statistics.median(times["plain"]) / (tokens["plain"] / B)
    out = {"batch": B, "plain_step_s": plain_step, "same_new_tokens": len(set(tokens.values())) == 1,
           "methods": {}}
    for m in names:
        sp = [times["plain"][r] / times[m][r] for r in range(repeats)]
        rec = {"tokens_per_s": tokens[m] / statistics.median(times[m]), "speedup_vs_plain": statistics.median(sp),
               "speedup_range": [min(sp), max(sp)]}
        s = stats[m]
        if s:
            calls = sum(x.target_calls for x in s)
            rr = sum(x.row_rounds for x in s)
            rec["tokens_per_call"] = (sum(x.accepted for x in s) + rr) / rr
            rec["c_round"] = sum(x.draft_time for x in s) / calls / plain_step
            rec["r"] = sum(x.target_time for x in s) / calls / plain_step
            rec["verify_and_commit_share"] = (sum(x.verify_time + x.commit_time for x in s)
                                              / sum(x.draft_time + x.target_time + x.verify_time + x.commit_time
                                                    for x in s))
        out["methods"][m] = rec
    return out


def markdown(res: dict, command: str) -> str:
    title = "" if res.get("pair", "embedded") == "embedded" else f" ({res['pair']} target)"
    lines = [f"# Drafts on the target: Medusa heads and an EAGLE feature draft, chains and trees{title}", "",
             f"Command: `{command}`", "", f"Machine: {describe(res['machine'])}", "",
             f"Prompts: {res['n_prompts']} held-out prompts of {res['prompt_bytes']} bytes, "
             f"{res['new_tokens']} new tokens each, temperature 1, {res['repeats']} repeats (medians). "
             f"Heads: {res['heads']}. Feature draft: {res['feature_draft']}.", ""]
    for s in res["settings"]:
        lines += [f"## Batch {s['batch']}", "",
                  "| method | tokens/s | speedup vs plain (range) | tokens per target call | c_round | r |",
                  "|---|---|---|---|---|---|"]
        for m, rec in s["methods"].items():
            lo, hi = rec["speedup_range"]
            tpc = f"{rec['tokens_per_call']:.2f}" if "tokens_per_call" in rec else "1"
            cr = f"{rec['c_round']:.3f}" if "c_round" in rec else "-"
            r = f"{rec['r']:.2f}" if "r" in rec else "1"
            lines.append(f"| {m} | {rec['tokens_per_s']:.0f} | {rec['speedup_vs_plain']:.2f}x "
                         f"({lo:.2f}-{hi:.2f}) | {tpc} | {cr} | {r} |")
        lines.append("")
    lines += ["## Goals", ""] + [f"- {g}" for g in goals(res)]
    return "\n".join(lines) + "\n"


def goals(res: dict) -> list[str]:
    before = BEST_BEFORE.get(res.get("pair", "embedded"))
    b1 = next(s for s in res["settings"] if s["batch"] == 1)["methods"]
    out = []
    med = "medusa-chain-4"  # the cheapest drafting: one call of the heads, one sampling call
    ok = b1[med]["tokens_per_call"] >= 2.0 and b1[med]["c_round"] <= 0.05
    out.append(f"heads: tokens per call >= 2.0 with c <= 0.05: {med} {b1[med]['tokens_per_call']:.2f} tokens/call, "
               f"c_round {b1[med]['c_round']:.3f}: {'met' if ok else 'missed'}")
    eg = b1["eagle-chain-4"]
    dm = b1["distilled-block-4"]
    ok = eg["tokens_per_call"] >= dm["tokens_per_call"] and eg["c_round"] < dm["c_round"]
    out.append(f"feature draft >= the distilled draft's tokens per call at lower c (chains of 4, block): "
               f"{eg['tokens_per_call']:.2f} vs {dm['tokens_per_call']:.2f} tokens/call, c_round "
               f"{eg['c_round']:.3f} vs {dm['c_round']:.3f}: {'met' if ok else 'missed'}")
    for who in ("medusa", "eagle"):
        token = b1[f"{who}-chain-4-token"]["tokens_per_call"]
        block = b1[f"{who}-chain-4"]["tokens_per_call"]
        for shape in (STATIC_TREE, WIDE_TREE, "dynamic"):
            tree = b1[f"{who}-tree-{shape}"]["tokens_per_call"]
            out.append(f"{who}: the tree {shape} (depth 4) adds >= 15% tokens per call over the chain of 4: "
                       f"{tree:.2f} vs {token:.2f} with the same (token) rule ({100 * (tree / token - 1):+.0f}%): "
                       f"{'met' if tree >= 1.15 * token else 'missed'}; vs {block:.2f} for the block rule's "
                       f"chain ({100 * (tree / block - 1):+.0f}%): {'met' if tree >= 1.15 * block else 'missed'}")
    mine = [m for m in b1 if m.startswith(("medusa", "eagle"))]  # the drafts on the target
    best = max(mine, key=lambda m: b1[m]["speedup_vs_plain"])
    ref = b1["distilled-block-auto"]["speedup_vs_plain"]
    top = max(b1, key=lambda m: b1[m]["speedup_vs_plain"])
    out.append(f"the best draft on the target beats block + auto lookahead with the distilled draft, side by "
               f"side: {best} {b1[best]['speedup_vs_plain']:.2f}x vs {ref:.2f}x (best of the run: {top} "
               f"{b1[top]['speedup_vs_plain']:.2f}x; block + auto measured earlier: "
               f"{'not for this pair' if before is None else f'{before}x'}): "
               f"{'met' if b1[best]['speedup_vs_plain'] > ref else 'missed'}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-bytes", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--early-exit", type=int, default=None, help="layers of the early-exit draft (a quarter)")
    ap.add_argument("--pair", default="embedded", help="embedded, large, or a folder with target/, draft/ and "
                    "the drafts train_heads.py saved")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, 1 repeat")
    ap.add_argument("--out", default=None, help="folder for the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.repeats = 2, 32, 1
    torch.set_num_threads(args.threads)
    path = pair_path(args.pair)
    target, draft, tok = load_pair(path=path)
    heads, fd = load_self_drafts(target, path)
    if args.early_exit is None:
        args.early_exit = max(1, target.config.num_hidden_layers // 4)
    pad = int(target.config.pad_token_id)
    rows = prompts(tok, args.prompts, args.prompt_bytes, seed=0)
    gens = generators(target, draft, heads, fd, args.early_exit)
    res = {"pair": args.pair, "n_prompts": args.prompts, "prompt_bytes": args.prompt_bytes,
           "new_tokens": args.new_tokens, "repeats": args.repeats, "static_trees": [STATIC_TREE, WIDE_TREE],
           "heads": f"{heads.n_heads} Medusa heads, {sum(p.numel() for p in heads.parameters()):,} parameters",
           "feature_draft": f"1 layer, {sum(p.numel() for p in fd.parameters()):,} parameters",
           "settings": []}
    for B in args.batches:
        if B > args.prompts:
            continue
        res["settings"].append(setting(gens, target, rows, B, args.new_tokens, args.repeats, pad))
    res["machine"] = machine()
    res["goals"] = goals(res) if 1 in args.batches else []
    name = "text_heads" + ("" if path is None else f"_{path.name}") + ("_quick" if args.quick else "")
    paths = write(name, res, markdown(res, command(argv, __file__)), folder=args.out)
    print("\n".join(res["goals"]))
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
