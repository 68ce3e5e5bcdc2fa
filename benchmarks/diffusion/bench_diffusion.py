"""Speculative diffusion sampling on CPU: sequential target calls and wall clock, digits pair.

Claims measured (issue 15): at the same law (tests/diffusion), speculative DDPM sampling needs
<= 0.5 T sequential target calls (De Bortoli et al. report about half the network evaluations),
and with the trained draft it runs >= 1.5x faster than plain ancestral sampling in wall clock on
CPU; where acceptance drops (the last, nearly noise-free steps) and what ``lookahead="auto"``
does there.

Setup: the embedded digits pair (``speculate.domains.diffusion.digits``: class-conditional MLP
target 640 x 5, 4.3M parameters; distilled draft 96 x 2, 64k), DDPM with T = 1000 (linear betas,
sigma_t^2 = beta_t), eps prediction, labels 0..9 in turn, no guidance. For a batch of B samples
(B = 1: one digit at a time; B = 16: a grid) plain ``sample`` and ``speculative_sample`` with the
distilled draft and with ``"frozen"`` (the target's last eps, free) at several lookaheads and
"auto" run interleaved ``--repeats`` times in one process (torch with ``--threads`` threads);
the speedup is the median of the per-repeat ratios. Sequential target calls are the batch's
target calls (each scores the k+1 states of every active sample in one call). Next to each
speedup, theory: the textbook expected_tokens(alpha, k) / (k c + 1) with the measured alpha
(accepted / (accepted + rejections)), mean k and c (draft time per drafted step / plain target call),
and the same with the measured cost r of one speculative target call relative to a plain one,
expected_tokens / (k c + r): on a CPU a call on B (k+1) states is not free.

    python benchmarks/diffusion/bench_diffusion.py                  # ~10 min on 1 thread
    python benchmarks/diffusion/bench_diffusion.py --quick          # a smoke run (~1 min)
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py

from report import describe, machine, write
from speculate.domains.diffusion import sample, speculative_sample
from speculate.domains.diffusion.demo import BANDS, acceptance_bands
from speculate.domains.diffusion.digits import load_digits_pair

from speculate import theory


def call_cost(net, n: int, repeats: int = 50) -> float:
    """Median ms of one call on n states (inference mode, the thread count set by the caller)."""
    x = torch.randn(n, 1, 8, 8)
    t = torch.randint(2, 1001, (n,))
    y = torch.randint(0, 10, (n,))
    with torch.inference_mode():
        for _ in range(5):
            net(x, t, y)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            net(x, t, y)
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def theory_of(s, plain_call: float) -> dict:
    rounds = max(1, s.rounds)
    k = sum(kk * n for kk, n in s.lookahead_counts.items()) / rounds
    kr = max(1, round(k))
    alpha = float(np.clip(s.alpha, 0.0, 1.0)) if s.accepted + s.rejections else 0.0
    c = (s.draft_time / s.draft_calls) / plain_call if s.draft_calls else 0.0
    r = (s.target_time / s.target_calls) / plain_call
    e = theory.expected_tokens(alpha, kr)
    return {"mean_k": k, "alpha": alpha, "c": c, "r": r, "textbook": e / (kr * c + 1.0),
            "with_batch_cost": e / (kr * c + r)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16", help="samples per run, comma-separated")
    ap.add_argument("--lookaheads", default="2,4,8,16,auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="B = 1 and 4, lookaheads 4, 8, auto, 1 repeat")
    ap.add_argument("--out", default="diffusion")
    ap.add_argument("--results-folder", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.lookaheads, args.repeats = "1,4", "4,8,auto", 1
    batches = [int(b) for b in args.batches.split(",")]
    lookaheads = [k if k == "auto" else int(k) for k in args.lookaheads.split(",")]
    torch.set_num_threads(args.threads)
    m = machine()
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    sched, target, draft = load_digits_pair()
    T = sched.timesteps
    drafts = {"distilled": draft, "frozen": "frozen"}

    sizes = sorted({B * (k + 1) for B in batches for k in (0, 1, 4, 8, 16)})
    cost = {name: {n: call_cost(net, n) for n in sizes} for name, net in (("target", target), ("draft", draft))}
    log(f"call costs (ms): {cost}")

    runs, plain_rows = [], []
    acc = {}  # (B, draft, k) -> summed stats arrays
    for B in batches:
        labels = np.arange(B) % 10
        shape = (B, 1, 8, 8)
        speculative_sample(sched, target, draft, shape, lookahead=4, labels=labels, rng=0)  # warm up
        configs = [(d, k) for d in drafts for k in lookaheads]
        times = {c: [] for c in configs}
        plain_t, plain_calls = [], []
        stats = {c: [] for c in configs}
        for rep in range(args.repeats):
            lab = (labels + rep) % 10
            t0 = time.perf_counter()
            p = sample(sched, target, shape, labels=lab, rng=1000 * rep + B)
            plain_t.append(time.perf_counter() - t0)
            plain_calls.append(p.stats.target_time / p.stats.target_calls)
            for d, k in configs:
                t0 = time.perf_counter()
                res = speculative_sample(sched, target, drafts[d], shape, lookahead=k, labels=lab,
                                         rng=1000 * rep + B + 1)
                times[(d, k)].append(time.perf_counter() - t0)
                stats[(d, k)].append(res.stats)
            log(f"B={B} repeat {rep + 1}/{args.repeats}: plain {plain_t[-1]:.2f} s")
        plain_call = float(np.median(plain_calls))
        plain_rows.append({"B": B, "seconds": plain_t, "ms_per_step": 1e3 * float(np.median(plain_t)) / T,
                           "target_ms_per_call": 1e3 * plain_call})
        for d, k in configs:
            ss = stats[(d, k)]
            ratios = [p / s for p, s in zip(plain_t, times[(d, k)], strict=True)]
            th = [theory_of(s, plain_call) for s in ss]
            row = {
                "B": B, "draft": d, "lookahead": k,
                "target_calls": float(np.mean([s.target_calls for s in ss])),
                "calls_per_T": float(np.mean([s.calls_per_step for s in ss])),
                "calls_per_sample": float(np.mean([s.row_rounds / B for s in ss])),
                "alpha": float(np.mean([t["alpha"] for t in th])),
                "acceptance_rate": float(np.mean([s.acceptance_rate for s in ss])),
                "steps_per_call": float(np.mean([s.tokens_per_call for s in ss])),
                "mean_k": float(np.mean([t["mean_k"] for t in th])),
                "c": float(np.mean([t["c"] for t in th])), "r": float(np.mean([t["r"] for t in th])),
                "seconds": times[(d, k)], "ms_per_step": 1e3 * float(np.median(times[(d, k)])) / T,
                "speedup": float(np.median(ratios)), "speedups": ratios,
                "theory_textbook": float(np.mean([t["textbook"] for t in th])),
                "theory_with_batch_cost": float(np.mean([t["with_batch_cost"] for t in th])),
            }
            runs.append(row)
            merged = ss[0]
            for s in ss[1:]:
                for f in ("proposed_by_step", "accepted_by_step", "rejected_by_step", "rounds_by_step",
                          "lookahead_by_step"):
                    setattr(merged, f, getattr(merged, f) + getattr(s, f))
            acc[(B, d, k)] = merged
            log(f"B={B} {d:9s} k={k!s:4s}: {row['calls_per_T']:.3f} T calls, alpha {row['alpha']:.3f}, "
                f"{row['speedup']:.2f}x (theory {row['theory_textbook']:.2f} / {row['theory_with_batch_cost']:.2f})")

    bands = {f"B={B} {d} k={k}": [list(b) for b in acceptance_bands(s)] for (B, d, k), s in acc.items()}
    profile = {f"B={B} {d} k={k}": {"acceptance_by_step": s.as_dict()["acceptance_by_step"],
                                    "lookahead_at_step": s.as_dict()["lookahead_at_step"]}
               for (B, d, k), s in acc.items() if k in (8, "auto")}
    step_times = acc[next(iter(acc))].step_times.tolist()

    best = max((r for r in runs if r["draft"] == "distilled"), key=lambda r: r["speedup"])
    best_calls = min(runs, key=lambda r: r["calls_per_T"])
    res = {"T": T, "batches": batches, "lookaheads": lookaheads, "repeats": args.repeats, "threads": args.threads,
           "call_cost_ms": cost, "plain": plain_rows, "runs": runs, "acceptance_bands": bands,
           "profile": profile, "step_times": step_times, "machine": m,
           "goals": {"calls_le_half_T": best_calls["calls_per_T"] <= 0.5,
                     "wall_clock_ge_1_5x_distilled": best["speedup"] >= 1.5}}

    # ---- Markdown
    md = ["# Diffusion: speculative DDPM sampling of 8x8 digits on CPU\n",
          f"Command: `{m['command']}`  ",
          f"Date: {m['date']}, {describe(m)}; torch threads {args.threads} (set with `torch.set_num_threads`); "
          f"{args.repeats} interleaved repeat(s) per configuration, median ratio.\n",
          "Pair: the embedded digits pair (class-conditional MLP target 640 x 5, 4.3M parameters, float16 on "
          "disk / float32 compute; distilled draft 96 x 2, 64k parameters), DDPM T = 1000, linear betas, "
          "sigma_t^2 = beta_t, labels 0..9 in turn, no guidance. Same law as plain sampling: tests/diffusion.\n",
          "Cost of one call on n states (median of 50, ms) and the draft/target cost ratio at the same n:\n",
          "| n | " + " | ".join(str(n) for n in sizes) + " |", "|---" * (len(sizes) + 1) + "|",
          "| target | " + " | ".join(f"{cost['target'][n]:.3f}" for n in sizes) + " |",
          "| draft | " + " | ".join(f"{cost['draft'][n]:.3f}" for n in sizes) + " |",
          "| target / draft | " + " | ".join(f"{cost['target'][n] / cost['draft'][n]:.1f}" for n in sizes) + " |",
          "",
          "| B | draft | lookahead | sequential target calls (/ T) | per sample | alpha | steps per call | mean k | "
          "ms per step | speedup | theory (textbook) | theory (batch cost r) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for B, pr in zip(batches, plain_rows, strict=True):
        md.append(f"| {B} | plain | - | {T} (1.000) | {T} | - | 1.00 | 0 | {pr['ms_per_step']:.3f} | 1.00x | - | - |")
        for r in (r for r in runs if r["B"] == B):
            md.append(f"| {B} | {r['draft']} | {r['lookahead']} | {r['target_calls']:.0f} ({r['calls_per_T']:.3f}) | "
                      f"{r['calls_per_sample']:.0f} | {r['alpha']:.3f} | {r['steps_per_call']:.2f} | "
                      f"{r['mean_k']:.1f} | "
                      f"{r['ms_per_step']:.3f} | **{r['speedup']:.2f}x** | {r['theory_textbook']:.2f}x | "
                      f"{r['theory_with_batch_cost']:.2f}x (r = {r['r']:.2f}, c = {r['c']:.3f}) |")
    md += ["", "Acceptance by time step (alpha_t: drafted steps kept / tested, where the steps after a block's first "
           "rejection are not tested, in each range of t, over all repeats) and the mean lookahead of the rounds "
           "that started there:\n",
           "| run | " + " | ".join(f"t {b[0]}" for b in next(iter(bands.values()))) + " |",
           "|---" * (len(BANDS)) + "|"]
    for name, bs in bands.items():
        if "k=8" in name or "auto" in name:
            md.append(f"| {name} kept | " + " | ".join(f"{b[1]:.3f}" for b in bs) + " |")
            if "auto" in name:
                md.append(f"| {name} mean k | " + " | ".join(f"{b[2]:.1f}" for b in bs) + " |")
    md += ["", "## Where acceptance drops, and what the automatic lookahead does there\n"]
    for B in batches:
        for d in drafts:
            b8, ba = bands[f"B={B} {d} k=8"], bands[f"B={B} {d} k=auto"]
            peak = int(np.nanargmax([b[1] for b in b8]))
            low = next((b[0] for b in b8[peak:] if b[1] < 0.9), None)  # past the peak
            k_mid = float(np.nanmean([b[2] for b in ba[:4]]))
            md.append(f"- B = {B}, {d}: alpha_t {b8[0][1]:.2f} at t {b8[0][0]}, {b8[peak][1]:.2f} at t {b8[peak][0]}, "
                      + (f"below 0.9 from t {low} on, " if low else "never below 0.9 after that, ")
                      + f"{b8[-1][1]:.2f} over t {b8[-1][0]} (lookahead 8). \"auto\" drafts {k_mid:.1f} steps per "
                      f"round on average over t 1000-201 and {ba[-1][2]:.1f} over t {ba[-1][0]}.")
    r_range = {B: (min(r["r"] for r in runs if r["B"] == B), max(r["r"] for r in runs if r["B"] == B))
               for B in batches}
    md += ["", "The last steps are nearly noise-free: sigma_t -> 0 while |b_t| / sigma_t grows toward 1, so a "
           "difference of eps that the noise hides early in the chain is no longer hidden (delta_t = |b_t| "
           "|eps_draft - eps_target| / sigma_t). The automatic lookahead follows the running acceptance (with "
           "forgetting) and the measured cost ratio c: with the distilled draft it lowers k over the last steps; "
           "with \"frozen\" c is about 0, so the rule keeps k near its maximum (16) almost to the end. The rule "
           "takes a target call on B (k+1) states to cost the same as one on B (theory.speedup); on this CPU it "
           "does not (the column r: " + ", ".join(f"{lo:.1f}-{hi:.1f} at B = {B}" for B, (lo, hi) in r_range.items())
           + "), so a large k can lose to a fixed k of 4-8 on a batch of samples.",
           ""]
    g = res["goals"]
    md += ["## Goals\n",
           f"- <= 0.5 T sequential target calls: {'met' if g['calls_le_half_T'] else 'MISSED'}: best "
           f"{best_calls['calls_per_T']:.3f} T ({best_calls['draft']}, lookahead {best_calls['lookahead']}, "
           f"B = {best_calls['B']}); see the table for every configuration.",
           "- >= 1.5x wall clock on CPU with the trained draft: "
           f"{'met' if g['wall_clock_ge_1_5x_distilled'] else 'MISSED'}: "
           f"best {best['speedup']:.2f}x (B = {best['B']}, lookahead {best['lookahead']}).",
           "", "![acceptance by time step](" + args.out + ".png)"]
    fig = _figure(acc, runs, batches, T)
    paths = write(args.out, res, "\n".join(md), fig, folder=args.results_folder)
    log(f"wrote {', '.join(map(str, paths))}")
    return 0


def _figure(acc, runs, batches, T):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(13, 3.8))
    ax1, ax2, ax3 = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    edges = np.unique(np.round(np.geomspace(1, T + 1, 40)).astype(int))

    def binned(num, den, t):
        xs, ys = [], []
        for lo, hi in itertools.pairwise(edges):
            at = (t >= lo) & (t < hi)
            if den[at].sum():
                xs.append(np.sqrt(lo * max(hi - 1, lo)))
                ys.append(num[at].sum() / den[at].sum())
        return xs, ys

    for d in ("distilled", "frozen"):
        for k in (8, "auto"):  # acceptance: every batch size pooled (the same law per step)
            ss = [s for (b, dd, kk), s in acc.items() if dd == d and kk == k]
            a = sum(s.accepted_by_step for s in ss)
            ax1.plot(*binned(a, a + sum(s.rejected_by_step for s in ss), ss[0].step_times), marker=".",
                     label=f"{d}, lookahead {k}")
        for b in batches:
            s = acc[(b, d, "auto")]
            ax2.plot(*binned(s.lookahead_by_step, s.rounds_by_step, s.step_times), marker=".", label=f"B={b}, {d}")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("model time t (log scale; sampling runs left to right)")
        ax.legend(fontsize=7)
    ax1.set_ylabel("drafted steps kept / tested (alpha_t)")
    ax1.set_title("acceptance by time step (all batch sizes)", fontsize=9)
    ax2.set_ylabel("mean lookahead k chosen")
    ax2.set_title('lookahead="auto" by time step', fontsize=9)
    for b in batches:
        for d in ("distilled", "frozen"):
            rows = [r for r in runs if r["B"] == b and r["draft"] == d]
            ax3.plot([str(r["lookahead"]) for r in rows], [r["speedup"] for r in rows], marker="o", label=f"B={b}, {d}")
    ax3.axhline(1.0, color="grey", lw=0.8)
    ax3.axhline(1.5, color="grey", lw=0.8, ls="--")
    ax3.set_xlabel("lookahead")
    ax3.set_ylabel("wall-clock speedup over plain")
    ax3.set_title("CPU wall clock", fontsize=9)
    ax3.legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
