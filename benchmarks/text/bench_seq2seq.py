"""Speculative decoding of an encoder-decoder pair against plain sampling and transformers' assisted generation.

The BART pair of ``train_seq2seq.py`` (``benchmarks/text/models/seq2seq``: Python lines translated
to a pseudo-language), held-out sources whose reference translation has at least ``--new-tokens``
bytes. Same process, same sources, same number of new decoder tokens for every method (EOS stops
no row: ``min_new_tokens`` for transformers, ``eos_token_id=[]`` for ours), temperature 1, full
distribution (``top_k=0`` for transformers):

- ``plain``: ``target.generate(do_sample=True)``; ``draft-alone``: ``draft.generate(do_sample=True)``;
- ``assisted``: ``target.generate(assistant_model=draft, do_sample=True)``, transformers' defaults
  (20 draft tokens, confidence threshold 0.4, heuristic schedule); ``assisted-k``:
  ``num_assistant_tokens=k``, constant schedule, ``assistant_confidence_threshold=0`` (like for like);
  batch 1 only (transformers refuses more; its message is recorded);
- ``ours-token`` / ``ours-block``: ``SpeculativeGenerator(target, draft, lookahead=k)`` with the
  token / block verification rule, at batch 1 and 8; ``plain`` batched at 8 (right-padded sources).

Methods are interleaved source by source (rotating the order) and repeated; every speedup is a
ratio of two times measured in the same repeat (median over repeats, range in brackets). Theory:
``(1 - a^(k+1)) / ((1 - a)(k c + 1))`` at the measured acceptance ``a`` (token rule) and
``c`` = our draft step (its model forward, probabilities, sampling: from the runs' statistics) /
plain step (``plain`` time per token); ``r`` = our verification call (k+1 tokens) / plain step, and
``E / (k c + r)`` the prediction with it. A cProfile of one batch-1 ``ours-block`` call is recorded
(top entries by cumulative and internal time) to show where a round's time goes.

Run: ``python benchmarks/text/bench_seq2seq.py`` (1 thread, about 10 minutes on a quiet core).
Writes ``benchmarks/results/text_seq2seq.{json,md}``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py
sys.path.insert(0, str(ROOT / "benchmarks" / "text"))  # bench_generate.py, train_seq2seq.py

from bench_generate import _pooled, interleaved, setting_section  # noqa: E402
from report import describe, machine, relative, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples.tokenizer import PAD_ID  # noqa: E402
from train_seq2seq import OUT, collate, examples, load  # noqa: E402

from speculate import theory  # noqa: E402

OURS = ("ours-token", "ours-block")


def sources(n: int, min_target: int, seed: int) -> list[bytes]:
    """``n`` held-out sources whose reference translation has >= ``min_target`` bytes."""
    return [s for s, t in examples("heldout", seed) if len(t) >= min_target][:n]


def make_methods(target, draft, k: int, n_new: int, batch_size: int) -> dict:
    """name -> function(list of sources, seed) -> (new decoder tokens, stats or None)."""
    gens = {rule: SpeculativeGenerator(target, draft, lookahead=k, verify=rule)
            for rule in ("token", "block")}

    def hf(extra, model=target):
        def run(rows, seed):
            b = collate([(s, b"") for s in rows])
            torch.manual_seed(seed)
            out = model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 do_sample=True, top_k=0, max_new_tokens=n_new,
                                 min_new_tokens=n_new, pad_token_id=PAD_ID, **extra)
            return out.shape[0] * (out.shape[1] - 1), None  # minus the decoder start token
        return run

    def ours(rule):
        def run(rows, seed):
            b = collate([(s, b"") for s in rows])
            out = gens[rule].generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                      max_new_tokens=n_new, eos_token_id=[], rng=seed)
            return sum(len(t) for t in out.new_tokens), out.stats
        return run

    methods = {"plain": hf({}), "draft-alone": hf({}, model=draft)}
    if batch_size == 1:
        methods["assisted"] = hf({"assistant_model": draft})
        methods["assisted-k"] = hf({"assistant_model": draft, "num_assistant_tokens": k,
                                    "assistant_confidence_threshold": 0.0,
                                    "num_assistant_tokens_schedule": "constant"})
    methods["ours-token"] = ours("token")
    methods["ours-block"] = ours("block")
    return methods


def assisted_batch_error(target, draft, rows) -> str:
    b = collate([(s, b"") for s in rows])
    try:
        target.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        assistant_model=draft, do_sample=True, max_new_tokens=4, pad_token_id=PAD_ID)
    except Exception as e:  # transformers refuses batch > 1
        return f"{type(e).__name__}: {e}"
    return "ran (no error)"


def run_setting(target, draft, rows: list[bytes], batch_size: int, args) -> dict:
    k, n_new = args.lookahead, args.new_tokens
    methods = make_methods(target, draft, k, n_new, batch_size)
    groups = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    for m in methods.values():  # warm-up at this batch size, untimed
        m(groups[0], seed=0)
    names = list(methods)
    times, tokens, stats = interleaved(methods, groups, args.repeats, f"batch {batch_size}")
    plain_step = statistics.median(times["plain"]) / (tokens["plain"] / batch_size)
    s_tok = stats["ours-token"]
    draft_step = sum(x.draft_time for x in s_tok) / sum(x.draft_calls for x in s_tok)
    c = draft_step / plain_step
    alpha = _pooled(s_tok, "alpha")
    out = {"batch": batch_size, "lookahead": k, "new_tokens_by_method": tokens,
           "same_new_tokens": len(set(tokens.values())) == 1 and tokens["plain"] == len(rows) * n_new,
           "plain_step_s": plain_step, "draft_step_s": draft_step,
           "hf_draft_step_s": statistics.median(times["draft-alone"]) / (n_new * len(groups)),
           "alpha_token": alpha, "cost_ratio_c": c,
           "expected_tokens_per_call": theory.expected_tokens(alpha, k),
           "theory_speedup": theory.speedup(alpha, k, c), "methods": {}}
    for m in names:
        sp = [times["plain"][r] / times[m][r] for r in range(args.repeats)]
        rec = {"tokens_per_s": tokens[m] / statistics.median(times[m]),
               "speedup_vs_plain": statistics.median(sp), "speedup_range": [min(sp), max(sp)]}
        if m in OURS:
            for ref in (x for x in ("assisted", "assisted-k") if x in times):
                rec[f"speedup_vs_{ref}"] = statistics.median(
                    [times[ref][i] / times[m][i] for i in range(args.repeats)])
            s = stats[m]
            calls = sum(x.target_calls for x in s)
            r_k = sum(x.target_time for x in s) / calls / plain_step
            rec.update(alpha=_pooled(s, "alpha"), acceptance_rate=_pooled(s, "acceptance_rate"),
                       tokens_per_call=_pooled(s, "tokens_per_call"),
                       theory_speedup=out["theory_speedup"],
                       measured_over_theory=rec["speedup_vs_plain"] / out["theory_speedup"],
                       width_cost_r=r_k,
                       prediction_with_width_cost=theory.expected_tokens(alpha, k) / (k * c + r_k),
                       draft_s=sum(x.draft_time for x in s) / args.repeats,
                       target_s=sum(x.target_time for x in s) / args.repeats)
            # per repeat: the rest (encoders, sampling and verification on the CPU, bookkeeping)
            rec["other_s"] = statistics.median(times[m]) - rec["draft_s"] - rec["target_s"]
        out["methods"][m] = rec
    return out


def profile_call(target, draft, row: bytes, args, top: int = 18) -> dict:
    """cProfile of one batch-1 ``ours-block`` call: top entries by cumulative and internal time."""
    gen = SpeculativeGenerator(target, draft, lookahead=args.lookahead, verify="block")
    b = collate([(row, b"")])

    def call():
        return gen.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                            max_new_tokens=args.new_tokens, eos_token_id=[], rng=0)

    call()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    out = call()
    prof.disable()
    wall = time.perf_counter() - t0
    res = {"wall_s": wall, "target_calls": out.stats.target_calls,
           "draft_calls": out.stats.draft_calls}
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        lines = buf.getvalue().splitlines()
        start = next(i for i, x in enumerate(lines) if x.strip().startswith("ncalls"))
        res[key] = [" ".join(x.split()) for x in lines[start + 1:] if x.strip()]
    return res


def goals(res: dict) -> list[str]:
    out = []
    for s in res["settings"]:
        ours = {m: r for m, r in s["methods"].items() if m in OURS}
        best = max(ours, key=lambda m: ours[m]["speedup_vs_plain"])
        r = ours[best]
        if s["batch"] == 1:
            v = r["speedup_vs_assisted"]
            out.append(f"batch 1: {best} / transformers assisted generation = {v:.2f} (goal >= 1.3: "
                       f"{'met' if v >= 1.3 else 'NOT met'}); vs assisted-k = "
                       f"{r['speedup_vs_assisted-k']:.2f}")
            for m, rr in ours.items():
                out.append(f"batch 1: {m} measured / theoretical speedup = "
                           f"{rr['measured_over_theory']:.2f} (goal >= 0.85: "
                           f"{'met' if rr['measured_over_theory'] >= 0.85 else 'NOT met'}; with the "
                           f"measured width cost r = {rr['width_cost_r']:.2f} the prediction is "
                           f"{rr['prediction_with_width_cost']:.2f} vs measured "
                           f"{rr['speedup_vs_plain']:.2f})")
        else:
            out.append(f"batch {s['batch']}: {best} speedup over plain batched decoding = "
                       f"{r['speedup_vs_plain']:.2f}")
    return out


def markdown(res: dict) -> str:
    lines = ["# Encoder-decoder text generation: speculative vs plain vs transformers assisted", "",
             f"Command: `{res['command']}`", "",
             f"Machine: {describe(res['machine'])}. Pair: BART {res['pair']} "
             f"(`train_seq2seq.py`); {res['n_sources']} held-out sources, {res['new_tokens']} new "
             f"decoder tokens each (EOS stops no row), temperature 1, {res['repeats']} interleaved "
             "repeats. Speedups are medians over repeats of time ratios within a repeat (range in "
             "brackets).", ""]
    for s in res["settings"]:
        lines += setting_section(s, step="step", per="step")
    p = res.get("profile")
    if p:
        lines += ["## Profile of one batch-1 ours-block call", "",
                  f"{p['wall_s'] * 1e3:.0f} ms under cProfile, {p['target_calls']} target calls, "
                  f"{p['draft_calls']} draft calls. Top entries by internal time:", "", "```",
                  *p["tottime"], "```", ""]
    lines += ["## Goals", ""] + [f"- {g}" for g in res["goals"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", type=Path, default=OUT, help="folder with target/ and draft/")
    ap.add_argument("--sources", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--out", default=None, help="results path without suffix "
                    "(default: benchmarks/results/text_seq2seq)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = machine()
    target, draft = load(args.pair / "target"), load(args.pair / "draft")
    rows = sources(args.sources, args.new_tokens, args.seed)
    res = {"pair": relative(args.pair),
           "threads": args.threads, "machine": env, "n_sources": len(rows),
           "new_tokens": args.new_tokens, "repeats": args.repeats, "settings": []}
    for b in args.batch:
        s = run_setting(target, draft, rows, b, args)
        if b > 1:
            s["assisted_batch_error"] = assisted_batch_error(target, draft, rows[:b])
        res["settings"].append(s)
    if not args.no_profile:
        res["profile"] = profile_call(target, draft, rows[0], args)
    res["goals"] = goals(res)
    res["command"] = env["command"]
    out = Path(args.out) if args.out else None
    write(out.name if out else "text_seq2seq", res, markdown(res), folder=out.parent if out else None)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
