"""The tensor verification rules (speculate/verify/device.py) against an earlier revision's, alternately.

Times ``token_device``, ``block_device`` and ``multi_device`` of the working tree and of ``--before``
(its device.py loaded from git) on the same inputs, in the order before, after, after, before, ...
(best of ``--repeat`` calls each time), and reports each version's median and the after / before
ratio. On a CPU this measures the rules' arithmetic, not a GPU's launch costs.

Run: ``python benchmarks/bench_device_rules.py --before REV [--device cuda] [--name NAME]``. Writes
``benchmarks/results/device_rules.{json,md}`` (or ``NAME.*``).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from report import ROOT, alternating, describe, machine, short_rev, versions_line, write

import speculate.verify.device as after_mod


def _before(rev: str):
    """``rev``'s device.py as a module, its relative imports made absolute: the rules are the
    earlier revision's, the helpers they import (the inverse-CDF tables, the round checks, the
    device tensors) this tree's."""
    src = subprocess.run(["git", "show", f"{rev}:speculate/verify/device.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    src = re.sub(r"from \.\.(\w)", r"from speculate.\1", src)  # from .._inverse_cdf, from ..device_tensors
    src = re.sub(r"from \.(\w)", r"from speculate.verify.\1", src)  # from .one_round, .round_checks, .kernels
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "device_before.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("device_before", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def _inputs(B: int, m: int, K: int, V: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, m, K + 1, V, generator=g) * 3, -1)
    q = torch.softmax(torch.log(p[:, :, :K]) + torch.randn(B, m, K, V, generator=g) * 0.5, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, m, K)
    lengths = torch.full((B, m), K)
    ua, un = torch.rand(B, K, m, generator=g, dtype=torch.float64), torch.rand(B, generator=g, dtype=torch.float64)
    return [t.to(device) for t in (p, q, drafts, lengths, ua, un)]


def _time(fn, args, repeat: int, sync) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the earlier revision (any git revision)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", type=int, nargs=4, default=[64, 2, 4, 32000], metavar=("B", "m", "K", "V"))
    ap.add_argument("--rounds", type=int, default=6, help="alternations")
    ap.add_argument("--repeat", type=int, default=5, help="calls per timing (the best is kept)")
    ap.add_argument("--name", default="device_rules", help="the results' file name (benchmarks/results/NAME.*)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env = machine(args.device)
    before = _before(args.before)
    B, m, K, V = args.shape
    multi = _inputs(B, m, K, V, args.device)
    chain = [multi[0][:, 0], multi[1][:, 0], multi[2][:, 0], multi[3][:, 0], multi[4][:, :, 0], multi[5]]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    rules = {"token_device": chain, "block_device": chain, "multi_device": multi}
    times: dict[str, dict[str, list[float]]] = {r: {"before": [], "after": []} for r in rules}
    for _, v in alternating(args.rounds):
        mod = before if v == "before" else after_mod
        for rule, a in rules.items():
            if hasattr(mod, rule):
                times[rule][v].append(_time(getattr(mod, rule), a, args.repeat, sync))
    med = {r: {v: statistics.median(x) for v, x in t.items() if x} for r, t in times.items()}
    rev = short_rev(args.before)
    lines = ["# Tensor verification rules: two versions, alternately", "",
             f"Command: `{env['command']}` on {describe(env)}.",
             f"{versions_line(rev, env)} Shape B={B}, m={m}, K={K}, V={V}, "
             f"float32 probabilities; best of {args.repeat} calls, median over {args.rounds} alternations.", "",
             "| rule | before (ms) | after (ms) | after / before |", "|---|---|---|---|"]
    for rule, d in med.items():
        if len(d) == 2:
            b, a = d["before"], d["after"]
            lines.append(f"| {rule} | {1e3 * b:.2f} | {1e3 * a:.2f} | {a / b:.3f} |")
    write(args.name, {"command": env["command"], "before": rev, "shape": args.shape, "times_s": times,
                           "median_s": med, "machine": env}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
