"""Per-row sampling settings of the serving engine (serving/rows.py RowSettings.probs) against an earlier
revision, alternating: [32 rows, 5 positions, 256 ids], one settings group and four.

    python benchmarks/serve/bench_row_settings.py --before <rev>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from report import command, describe, machine, write  # noqa: E402


def load_before(rev: str):
    import types

    src = subprocess.run(["git", "show", f"{rev}:domains/text/serving/rows.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.replace("from ..request", "from speculate.domains.text.request")
    mod = types.ModuleType("rows_before")
    exec(compile(src, "rows_before", "exec"), mod.__dict__)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    from speculate.domains.text.request.tokens import TokenBuffer
    from speculate.domains.text.serving import rows as after

    torch.set_num_threads(1)
    before = load_before(args.before)
    R, J, V = 32, 5, 256
    x = torch.randn(R, J, V, generator=torch.Generator().manual_seed(0)) * 3
    buf = TokenBuffer.from_prompts([[1, 2]] * R, extra=8)
    rows = []
    for groups in (1, 4):
        sets = []
        for mod in (before, after):
            rs = mod.RowSettings()
            rs.add(np.arange(R), temperature=[(0.7, 1.0, 0.0, 1.2)[i % groups] for i in range(R)],
                   top_k=[[None, 40][i % 2] if groups > 1 else None for i in range(R)], top_p=[0.9] * R,
                   min_p=[None] * R, presence=[0.0] * R, frequency=[0.0] * R)
            sets.append(rs)
        times: dict[int, list[float]] = {0: [], 1: []}
        for rep in range(args.repeats):
            for v in (0, 1) if rep % 2 == 0 else (1, 0):
                t0 = time.perf_counter()
                for _ in range(200):
                    sets[v].probs(x, buf, np.arange(R), None)
                times[v].append((time.perf_counter() - t0) / 200 * 1e6)
        laws = [rs.probs(x, buf, np.arange(R), None) for rs in sets]
        diff = float((laws[0] - laws[1]).abs().max())
        b, a = float(np.median(times[0])), float(np.median(times[1]))
        rows.append({"groups": groups, "before_us": b, "after_us": a, "after_over_before": a / b, "max_abs_diff": diff})
    cmd = command(argv, __file__)
    env = machine()
    md = ["# RowSettings.probs, before and after", "", f"Command: `{cmd}`", "", f"Machine: {describe(env)}.", "",
          f"Before: {args.before}; after: the working tree. [32, 5, 256], 1 torch thread, medians of "
          f"{args.repeats} alternating repeats of 200 calls.", "",
          "| settings groups | before (us) | after (us) | after / before | max abs diff of the laws |",
          "|---|---|---|---|---|"]
    md += [f"| {r['groups']} | {r['before_us']:.0f} | {r['after_us']:.0f} | {r['after_over_before']:.2f} | "
           f"{r['max_abs_diff']:.1e} |" for r in rows]
    write("serve_row_settings", {"command": cmd, "rows": rows, "machine": env}, "\n".join(md))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
