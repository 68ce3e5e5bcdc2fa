"""Charged Lennard-Jones fluid: acceptance and sequential exact-force calls per step with an Ewald target.

Target: LJ core (all pairs, cutoff L/2) + Ewald sum of the periodic Coulomb energy (speculate.domains.physics.coulomb).
Drafts: "debye-hueckel" (LJ + screened Coulomb cut at 2.5, no reciprocal sum), "corrected"
(frozen_correction of it: the draft plus the exact-minus-draft force of the last verified
configuration) and "frozen". Density 0.8, charges +-1 alternating on an fcc lattice, kT = 1,
gamma = 1, lookahead 8, one trajectory per cell. Calls/step is the hardware-neutral figure (the
parallel depth of the simulation; 1 for plain simulation). On this CPU the force is
compute-bound (k+1 configurations cost about k+1 times one), so no wall-clock claim is made here.

    .venv/bin/python benchmarks/physics/bench_ionic.py            # about 2 minutes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: report.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import timed
from report import describe, machine, write
from speculate.domains.physics import Langevin, frozen_correction, speculative_simulate
from speculate.domains.physics.coulomb import ionic_fluid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[2, 3, 4], help="fcc cells per side (N = 4 n^3)")
    ap.add_argument("--dts", type=float, nargs="+", default=[2e-5, 1e-4, 5e-4])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lookahead", type=int, default=8)
    args = ap.parse_args(argv)
    env = machine("cpu")
    rows = []
    for n in args.cells:
        x0, system = ionic_fluid(n_cells=n)
        one, many = x0[None], np.repeat(x0[None], args.lookahead + 1, axis=0)
        system.force(many), system.draft(one)  # warm up (Numba compiles the LJ kernels once)
        t1 = min(timed(system.force, one)[1] for _ in range(3))  # best of 3
        t9 = min(timed(system.force, many)[1] for _ in range(3))
        td = min(timed(system.draft, one)[1] for _ in range(3))
        print(f"N={len(x0)}: exact {t1 * 1e3:.1f} ms/config, {args.lookahead + 1} configs {t9 * 1e3:.1f} ms, "
              f"draft {td * 1e3:.1f} ms; Ewald k_max {system.ewald.k_max}", flush=True)
        for dt in args.dts:
            for name in ("debye-hueckel", "corrected", "frozen"):
                draft = {"debye-hueckel": system.draft, "corrected": frozen_correction(system.draft),
                         "frozen": "frozen"}[name]
                model = Langevin(force=system.force, draft_force=draft, dt=dt, kT=1.0, gamma=1.0)
                tr = speculative_simulate(model, x0[None], args.steps, lookahead=args.lookahead, rng=0)
                st = tr.stats
                rows.append({"N": len(x0), "dt": dt, "draft": name, "alpha": st.alpha,
                             "calls_per_step": st.calls_per_step, "exact_ms": t1 * 1e3,
                             "exact_k1_ms": t9 * 1e3, "draft_ms": td * 1e3})
                print(f"  dt={dt:g} {name:14s} alpha={st.alpha:.3f} calls/step={st.calls_per_step:.3f}",
                      flush=True)
    md = [
        "# Physics: speculative Brownian dynamics of a charged Lennard-Jones fluid (Ewald target)",
        "",
        f"Command: `{env['command']}`  ",
        f"Date: {env['date']}, CPU; {describe(env)}.",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "Each cell: alpha / exact-force calls per simulated step.",
        "",
        "| N | draft | " + " | ".join(f"dt={dt:g}" for dt in args.dts) + " |",
        "|---|---|" + "---|" * len(args.dts),
    ]
    for n in sorted({r["N"] for r in rows}):
        for name in ("debye-hueckel", "corrected", "frozen"):
            cells = [next(r for r in rows if r["N"] == n and r["draft"] == name and r["dt"] == dt) for dt in args.dts]
            md.append(f"| {n} | {name} | " + " | ".join(f"{c['alpha']:.3f} / {c['calls_per_step']:.3f}"
                                                        for c in cells) + " |")
    md += ["", "Cost of one call (ms): exact force on 1 and on k+1 configurations, draft on 1:", "",
           "| N | exact, 1 | exact, k+1 | draft, 1 |", "|---|---|---|---|"]
    for n in sorted({r["N"] for r in rows}):
        r = next(r for r in rows if r["N"] == n)
        md.append(f"| {n} | {r['exact_ms']:.1f} | {r['exact_k1_ms']:.1f} | {r['draft_ms']:.1f} |")
    write("physics_ionic", {"machine": env, "args": vars(args), "rows": rows}, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
