"""Lennard-Jones fluid: acceptance and sequential force calls per step against N and dt; wall clock.

Claims measured (one trajectory, B = 1):
  * acceptance alpha (accepted / (accepted + rejections), the per-draft acceptance of theory) and
    the sequential depth, target calls per simulated step, for N = 108..864 and several dt, with
    three drafts: "frozen", a short-cutoff cell-list force ("cells", rc = --draft-cutoff) and the
    frozen correction of that cell-list force ("corrected"). Goal: <= 0.35 calls per step at
    alpha >= 0.9;
  * wall-clock steps/s, plain vs speculative. On a CPU the all-pairs force is compute-bound:
    scoring k+1 configurations costs about k+1 times one, so no wall-clock gain is expected here
    (see bench_nn.py for a force that batches well); on a GPU (``--device cuda``, torch all-pairs
    force) one configuration does not fill the device and the calls per step become the speedup.

System: fcc lattice at density 0.8 melted at kT = 1 (gamma = 1) with the cheap force then the
exact one; exact force: all pairs, minimum image, cutoff L/2.

    python benchmarks/physics/bench_lj.py                      # CPU, Numba, 1 thread (~30 min)
    python benchmarks/physics/bench_lj.py --device cuda        # exact force in torch on the GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: report.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import batch_cost
from report import describe, machine, write
from speculate.domains.physics import (
    Langevin,
    LennardJones,
    fcc_lattice,
    frozen_correction,
    simulate,
    speculative_simulate,
)

N_CELLS = {108: 3, 256: 4, 500: 5, 864: 6}


def equilibrate(N: int, density: float, seed: int, device: str):
    """A melted configuration [N, 3]: 2000 cheap steps at dt 2e-4, then 200 exact ones at 1e-4."""
    x0, L = fcc_lattice(N_CELLS[N], density)
    cheap = LennardJones(L, cutoff=min(2.5, L / 2), method="cells")
    X = simulate(Langevin(force=cheap, dt=2e-4), x0, 2000, rng=seed, record_every=2000).final
    exact = exact_force(L, device)
    X = simulate(Langevin(force=exact, dt=1e-4), X, 200, rng=seed + 1, record_every=200).final
    return X, L


def exact_force(L: float, device: str) -> LennardJones:
    if device == "cpu":
        return LennardJones(L)
    return LennardJones(L, backend="torch", device=device)


def make_draft(spec: str, L: float):
    """'frozen', 'cells:RC' (short cutoff RC, cell lists) or 'corrected:RC' (its frozen correction)."""
    kind, _, rc = spec.partition(":")
    if kind == "frozen":
        return "frozen"
    if kind not in ("cells", "corrected") or not rc:
        raise SystemExit(f"draft must be 'frozen', 'cells:RC' or 'corrected:RC', got {spec!r}")
    cheap = LennardJones(L, cutoff=min(float(rc), L / 2), method="cells")
    return cheap if kind == "cells" else frozen_correction(cheap)


def measure(model: Langevin, X: np.ndarray, steps: int, lookahead, seed: int) -> dict:
    sim = speculative_simulate(model, X, steps, lookahead=lookahead, rng=seed,
                               record_every=steps)
    s = sim.stats
    return {
        "alpha": s.alpha,
        "acceptance_rate": s.acceptance_rate,
        "calls_per_step": s.calls_per_step,
        "accepted_per_position": s.accepted_per_position.tolist(),
        "lookahead_counts": {int(k): int(v) for k, v in s.lookahead_counts.items()},
        "cost_ratio_c": s.cost_ratio,
        "wall_time_s": s.wall_time,
    }


def race_repeats(steps: int, repeats: int) -> int:
    """Repeats of a race: short trajectories get more (up to 5x), so that the median is not one run's."""
    return repeats * max(1, min(5, 1000 // steps))


def race(model: Langevin, X: np.ndarray, steps: int, lookahead, repeats: int, seed: int) -> dict:
    plain, spec = [], []
    repeats = race_repeats(steps, repeats)
    # warm up: one trajectory of the same length (with "auto", the past the timed runs continue)
    speculative_simulate(model, X, steps, lookahead=lookahead, rng=seed + 10**6, record_every=steps)
    for r in range(repeats):
        t = time.perf_counter()
        simulate(model, X, steps, rng=seed + r, record_every=steps)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        speculative_simulate(model, X, steps, lookahead=lookahead, rng=seed + r,
                             record_every=steps)
        spec.append(time.perf_counter() - t)
    ratios = [p / s for p, s in zip(plain, spec, strict=True)]
    out = {"plain_steps_per_s": steps / float(np.median(plain)),
           "speculative_steps_per_s": steps / float(np.median(spec)),
           "speedup": float(np.median(ratios)), "speedups": ratios, "repeats": repeats,
           "total_speedup": float(np.sum(plain) / np.sum(spec))}
    if lookahead == "auto":  # a fresh model: no control measured before (Langevin.controls is empty)
        fresh = []
        for r in range(repeats):
            m = dataclasses.replace(model)
            t = time.perf_counter()
            simulate(m, X, steps, rng=seed + r, record_every=steps)
            tp = time.perf_counter() - t
            t = time.perf_counter()
            speculative_simulate(m, X, steps, lookahead=lookahead, rng=seed + r, record_every=steps)
            fresh.append(tp / (time.perf_counter() - t))
        out["fresh_speedup"] = float(np.median(fresh))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[108, 256, 500, 864])
    ap.add_argument("--dts", type=float, nargs="+", default=[2e-5, 5e-5, 1e-4, 2e-4])
    ap.add_argument("--drafts", nargs="+",
                    default=["frozen", "cells:2.5", "corrected:2.5", "cells:1.5", "corrected:1.5"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--race-dt", type=float, default=5e-5)
    ap.add_argument("--race-draft", default="corrected:2.5")
    ap.add_argument("--race-steps", type=int, nargs="+", default=[100, 2000],
                    help="trajectory lengths of the wall-clock race (auto's measuring is a fixed cost)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--density", type=float, default=0.8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="Numba and torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="physics_lj")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    for n in args.sizes:
        if n not in N_CELLS:
            raise SystemExit(f"--sizes must be among {sorted(N_CELLS)} (fcc lattices), got {n}")
    import numba
    import torch

    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    env = machine(args.device)
    acc, races, costs = [], [], {}
    for N in args.sizes:
        X, L = equilibrate(N, args.density, args.seed, args.device)
        exact = exact_force(L, args.device)
        costs[N] = batch_cost(exact, X, (1, args.lookahead + 1), repeats=7)
        cheap = make_draft(args.race_draft.replace("corrected", "cells"), L)
        costs[N]["draft_1"] = batch_cost(cheap, X, (1,), repeats=7)[1] if cheap != "frozen" else 0.0
        print(f"N={N}: L={L:.3f}, exact force {costs[N][1] * 1e3:.2f} ms/config, "
              f"{args.lookahead + 1} configs {costs[N][args.lookahead + 1] * 1e3:.2f} ms, "
              f"cells draft {costs[N]['draft_1'] * 1e3:.2f} ms", flush=True)
        for dt in args.dts:
            for name in args.drafts:
                model = Langevin(force=exact, draft_force=make_draft(name, L), dt=dt)
                res = measure(model, X, args.steps, args.lookahead, args.seed)
                res.update(N=N, L=L, exact_cutoff=L / 2, dt=dt, draft=name,
                           lookahead=args.lookahead)
                acc.append(res)
                print(f"  dt={dt:g} {name:13s} alpha={res['alpha']:.3f} "
                      f"calls/step={res['calls_per_step']:.3f}", flush=True)
        model = Langevin(force=exact, draft_force=make_draft(args.race_draft, L), dt=args.race_dt)
        for steps, lookahead in [(s, k) for s in args.race_steps for k in (args.lookahead, "auto")]:
            r = race(model, X, steps, lookahead, args.repeats, args.seed)
            r.update(N=N, dt=args.race_dt, draft=args.race_draft, lookahead=lookahead, steps=steps)
            races.append(r)
            print(f"  wall clock {steps} steps k={lookahead}: plain {r['plain_steps_per_s']:.1f} steps/s, "
                  f"speculative {r['speculative_steps_per_s']:.1f} steps/s "
                  f"({r['speedup']:.2f}x)", flush=True)
    payload = {"machine": env, "args": vars(args),
               "force_cost_s": {str(k): {str(b): t for b, t in v.items()} for k, v in costs.items()},
               "acceptance": acc, "wall_clock": races}
    met = [r for r in acc if r["alpha"] >= 0.9 and r["calls_per_step"] <= 0.35]
    md = [
        "# Physics: speculative Brownian dynamics of a Lennard-Jones fluid",
        "",
        f"Command: `{env['command']}`  ",
        f"Date: {env['date']}, device {env['device']}, Numba threads {env['numba_threads']}; "
        f"machine (shared with other jobs): {describe(env)}.",
        "",
        f"Density {args.density}, kT = 1, gamma = 1, one trajectory of {args.steps} steps per "
        f"cell, lookahead {args.lookahead}. Exact force: all pairs, minimum image, cutoff L/2 = "
        + ", ".join(f"{(N / args.density) ** (1 / 3) / 2:.2f} (N={N})" for N in args.sizes)
        + f" ({'Numba, CPU' if args.device == 'cpu' else 'torch on ' + args.device}). Drafts: "
        "frozen (exact force of the last verified configuration), cells:RC (cutoff RC, cell "
        "lists; all pairs within RC where the box has fewer than 3 cells per side), "
        "corrected:RC (cells:RC + the frozen remainder F(x_ref) - cells(x_ref)). alpha = "
        "accepted / (accepted + rejections): the per-draft acceptance. Calls/step = sequential "
        "exact-force calls per simulated step (the parallel depth; 1 for plain simulation).",
        "",
        "## Acceptance alpha and target calls per step",
        "",
        "Each cell: alpha / exact-force calls per simulated step.",
        "",
    ]
    for name in args.drafts:
        md += [f"### draft: {name}", "",
               "| N | " + " | ".join(f"dt={dt:g}" for dt in args.dts) + " |",
               "|---|" + "---|" * len(args.dts)]
        for N in args.sizes:
            cells = []
            for dt in args.dts:
                r = next(x for x in acc if x["N"] == N and x["dt"] == dt and x["draft"] == name)
                cells.append(f"{r['alpha']:.3f} / {r['calls_per_step']:.3f}")
            md.append(f"| {N} | " + " | ".join(cells) + " |")
        md.append("")
    per_draft = ", ".join(
        f"{name}: {sum(r['draft'] == name for r in met)} of {len(args.sizes) * len(args.dts)}"
        for name in args.drafts)
    md += [
        f"Goal (<= 0.35 calls per step at alpha >= 0.9) met in {len(met)} of {len(acc)} "
        f"(N, dt, draft) cells ({per_draft}).",
        "",
        "## Wall clock, one trajectory (plain vs speculative)",
        "",
        f"Median of {args.repeats} repeats ({race_repeats(min(args.race_steps), args.repeats)} for "
        f"{min(args.race_steps)}-step trajectories), plain and speculative alternating; speedup = median of the "
        "per-repeat ratios; total = the ratio of the summed times (every probe and measuring round counted).",
        "",
        "| N | exact force ms/config (best of 7) | ms for k+1 configs | cells draft ms | dt | draft | steps "
        "| lookahead | plain steps/s | speculative steps/s | speedup | total |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in races:
        c = costs[r["N"]]
        md.append(f"| {r['N']} | {c[1] * 1e3:.2f} | {c[args.lookahead + 1] * 1e3:.2f} | "
                  f"{c['draft_1'] * 1e3:.2f} | {r['dt']:g} | {r['draft']} | {r.get('steps', '')} | {r['lookahead']} | "
                  f"{r['plain_steps_per_s']:.1f} | {r['speculative_steps_per_s']:.1f} | "
                  f"{r['speedup']:.2f}x | {r['total_speedup']:.2f}x |")
    for steps in args.race_steps:
        autos = [r for r in races if r["lookahead"] == "auto" and r.get("steps") == steps]
        md += ["", f"`lookahead=\"auto\"`, {steps}-step trajectories: "
               + ", ".join(f"{r['speedup']:.2f}x (N={r['N']})" for r in autos)
               + f"; lowest {min(r['speedup'] for r in autos):.2f}x (goal >= 0.98); in total time "
               + ", ".join(f"{r['total_speedup']:.2f}x" for r in autos) + ". The model keeps auto's "
               "control across its runs (`Langevin.controls`): a warm-up trajectory of the same length and the "
               "earlier repeats are each timed run's past. The first run of a fresh model (its measuring rounds "
               "included): "
               + ", ".join(f"{r['fresh_speedup']:.2f}x (N={r['N']})" for r in autos if "fresh_speedup" in r) + "."]
    md += [
        "",
        "On this CPU the exact force is compute-bound: a call on k+1 configurations costs about "
        "k+1 times one, so the sequential depth does not turn into wall clock here. The GPU run "
        "(`--device cuda`, where one configuration does not fill the device) was "
        + ("done: see the table above." if args.device != "cpu" else
           "NOT done in this session (no GPU was available)."),
        "",
    ]
    fig = None
    if not args.no_plot:
        md.append(f"![acceptance vs N and dt]({args.out}.png)")
        fig = plot(acc, args)
    paths = write(args.out, payload, "\n".join(md) + "\n", figure=fig)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def plot(acc: list, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(args.drafts), figsize=(4 * len(args.drafts), 7), squeeze=False)
    for j, name in enumerate(args.drafts):
        for dt in args.dts:
            rs = sorted((r for r in acc if r["draft"] == name and r["dt"] == dt), key=lambda r: r["N"])
            Ns = [r["N"] for r in rs]
            axes[0, j].plot(Ns, [r["alpha"] for r in rs], "o-", label=f"dt={dt:g}")
            axes[1, j].plot(Ns, [r["calls_per_step"] for r in rs], "o-", label=f"dt={dt:g}")
        axes[0, j].axhline(0.9, color="gray", ls="--", lw=0.8)
        axes[1, j].axhline(0.35, color="gray", ls="--", lw=0.8)
        axes[0, j].set(title=f"draft: {name}", xlabel="N", ylabel="acceptance alpha", ylim=(0, 1.02))
        axes[1, j].set(xlabel="N", ylabel="target calls per step", ylim=(0, 1.02))
        axes[0, j].legend(fontsize=8)
    fig.suptitle(f"LJ fluid, density {args.density}, kT = 1, lookahead {args.lookahead}")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
