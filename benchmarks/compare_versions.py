"""Two versions of the library on the same benchmarks, run alternately on one machine.

A change that should not change speed (a refactoring) is checked by running the chain-overhead
benchmark (``bench_chain_overhead.py``) and the text generation benchmark (``text/bench_generate.py``)
of an earlier revision and of the working tree, each version running ITS OWN scripts with its own
code on the import path, in the order before, after, after, before, ... (so that a slow spell of a
shared machine hits both), and by reporting each version's median and the after / before ratio.
The revision is checked out in a temporary git worktree. The working tree's package must be the
one installed (editable) in this environment, as the README's setup does.

Run: ``python benchmarks/compare_versions.py --before REV`` (about 15 minutes with the defaults);
``--benches lj`` runs the working tree's Lennard-Jones race (``lookahead="auto"`` against plain
steps, 100-step trajectories, N = 108 and 256) with each version's library instead.
Writes ``benchmarks/results/versions.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import ROOT, alternating, describe, machine, short_rev, versions_line, worktree, write

TEXT_ARGS = "--lookahead 4 --sweep 0 --repeats 2"


def _run(root: Path, script: str, args: str, out: Path, name: str, scripts: Path | None = None) -> dict:
    """Run ``benchmarks/<script>`` of ``scripts`` (default: ``root``'s own) with ``root`` first on the
    import path; its JSON."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "SPECULATE_BENCH_RESULTS": str(out)}
    cmd = [sys.executable, str((scripts or root) / "benchmarks" / script), *shlex.split(args)]
    subprocess.run(cmd, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
    for folder in (out, root / "benchmarks" / "results"):  # older scripts write next to themselves
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    raise FileNotFoundError(f"{script} of {root} wrote no {name}.json")


def _chain(res: dict) -> dict:
    return {"overhead_per_round_us": res["overhead_per_round_us"], "overhead_fraction": res["overhead_fraction"]}


def _text(res: dict) -> dict:
    out = {}
    for s in res["settings"]:
        b, ms = s["batch"], s["methods"]
        for m in ("ours-token", "ours-block", "ours-block-auto"):
            if m in ms:
                out[f"b{b} {m} speedup vs plain"] = ms[m]["speedup_vs_plain"]
                out[f"b{b} {m} tokens/s"] = ms[m]["tokens_per_s"]
        out[f"b{b} our draft step ms"] = 1e3 * s["draft_step_s"]
        out[f"b{b} plain step ms"] = 1e3 * s["plain_step_s"]
    return out


LJ_ARGS = "--sizes 108 256 --dts 5e-5 --drafts corrected:2.5 --steps 50 --race-steps 100 --no-plot --out lj"


def _lj(res: dict) -> dict:
    out = {}
    for r in res["wall_clock"]:
        if r["lookahead"] == "auto":
            out[f"LJ N={r['N']} {r['steps']} steps auto / plain"] = r["speedup"]
            out[f"LJ N={r['N']} {r['steps']} steps auto / plain, fresh model"] = r["fresh_speedup"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the earlier revision (any git revision)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each version (alternating)")
    ap.add_argument("--text-args", default=TEXT_ARGS, help="options for text/bench_generate.py")
    ap.add_argument("--name", default="versions", help="the results' file name (benchmarks/results/NAME.*)")
    ap.add_argument("--benches", default="chain,text", help="which: chain, text, lj (the working tree's "
                    "physics/bench_lj.py race with each version's library: LJ_ARGS)")
    args = ap.parse_args(argv)
    env = machine()
    rev = short_rev(args.before)
    benches = {b.strip() for b in args.benches.split(",")}
    if not benches or not benches <= {"chain", "text", "lj"}:
        raise SystemExit(f"--benches: a comma-separated subset of chain, text, lj; got {args.benches!r}")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp, worktree(rev) as before:
        roots = {"before": before, "after": ROOT}
        for r, v in alternating(args.rounds):
            out = Path(tmp) / f"{v}{r}"
            rec: dict = {}
            if "chain" in benches:
                rec |= _chain(_run(roots[v], "bench_chain_overhead.py", "", out, "chain_overhead"))
            if "text" in benches:
                rec |= _text(_run(roots[v], "text/bench_generate.py", args.text_args, out, "text_generate"))
            if "lj" in benches:  # the same script for both versions: only the library differs
                rec |= _lj(_run(roots[v], "physics/bench_lj.py", LJ_ARGS, out, "lj", scripts=ROOT))
            runs[v].append(rec)
            print(f"round {r} {v}: " + ", ".join(f"{k} {x:.4g}" for k, x in rec.items()), flush=True)
    keys = list(runs["after"][0])
    med = {v: {k: statistics.median(x[k] for x in runs[v]) for k in keys} for v in runs}
    ratio = {k: med["after"][k] / med["before"][k] for k in keys}
    payload = {"command": env["command"], "before": rev, "after": env["git_commit"] + " (working tree)",
               "text_args": args.text_args, "benches": sorted(benches), "runs": runs, "median": med,
               "after_over_before": ratio, "machine": env}
    lines = [
        "# Two versions on the same benchmarks, run alternately",
        "",
        f"Command: `{env['command']}` on {describe(env)}.",
        f"{versions_line(rev, env)} Each version ran "
        + "; ".join(x for b, x in (("chain", "its own `bench_chain_overhead.py`"),
                                   ("text", f"its own `text/bench_generate.py {args.text_args}`"),
                                   ("lj", f"the working tree's `physics/bench_lj.py {LJ_ARGS}`")) if b in benches)
        + f", {args.rounds} times,",
        "in the order before, after, after, before, ... Medians over the runs; the ratio is after / before",
        "(overhead and step times: below 1 is faster; speedups and tokens/s: above 1 is faster).",
        "",
        "| measure | before | after | after / before |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {med['before'][k]:.4g} | {med['after'][k]:.4g} | {ratio[k]:.3f} |" for k in keys]
    write(args.name, payload, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
