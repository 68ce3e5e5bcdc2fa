"""The two kernel choices of the EAGLE feature draft's CPU drafting step, timed at the shipped draft's sizes.

- a linear layer: ``F.linear(x, W)`` with ``W`` ``[out, in]`` (``torch.nn.Linear``) against
  ``x @ W_t`` with ``W_t`` ``[in, out]`` contiguous (``feature_draft.Dense``);
- an RMSNorm: ``F.rms_norm`` against the layer norm of ``[x, -x]``, cut to its first half and scaled
  (``feature_draft._rms`` without autograd on a CPU; the same numbers).

Alone: each form timed warm (the same call repeated) and cold (after writing a buffer larger
than the last-level cache), one row ``x`` ``[1, 1, H]``, the forms alternating call by call.
In the loop: EAGLE chain-4 decoding of the held-out prompts at batch 1 (the shipped draft on the
embedded target), drafting time per round with the library's forms and with each one put back to
the plain form alone, the variants alternating prompt by prompt (rotating order). Medians in
microseconds. A draft step right after the target's forward is what matters; the loop measures it.

Run: ``python benchmarks/text/bench_draft_ops.py`` (about a minute, 1 thread). Writes
``benchmarks/results/draft_ops.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import describe, machine, write


def rms_as_layer_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    H = x.shape[-1]
    return F.layer_norm(torch.cat([x, x.neg()], dim=-1), (2 * H,), None, None, eps)[..., :H] * w


def timed(forms: dict, calls: int, flush: torch.Tensor | None) -> dict[str, float]:
    """Median microseconds per call of each form, alternating form by form."""
    times: dict[str, list[float]] = {k: [] for k in forms}
    for _ in range(calls):
        for k, fn in forms.items():
            if flush is not None:
                flush.mul_(1.0001)  # evicts the caches (writes more than they hold)
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: 1e6 * statistics.median(v) for k, v in times.items()}


def in_the_loop(repeats: int, prompts_n: int, new_tokens: int) -> dict[str, float]:
    """Drafting time per round (us, median over prompts and repeats) of EAGLE chain-4 with the
    library's forms and with each put back to the plain form."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import speculate.domains.text.feature_draft as fdm
    from bench_generate import batch, prompts
    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.pair import load_pair, load_self_drafts

    target, _, tok = load_pair()
    _, fd = load_self_drafts(target)
    gen = SpeculativeGenerator(target, fd, lookahead=4, verify="block")
    pad = int(target.config.pad_token_id)
    rows = prompts(tok, prompts_n, 128, seed=0)
    ours_rms, ours_lin = fdm._rms, fdm._lin
    variants = {
        "library (layer norm of [x, -x], x @ W_t)": (ours_rms, ours_lin),
        "F.rms_norm instead": (lambda x, m: F.rms_norm(x, m.normalized_shape, m.weight, m.eps), ours_lin),
        "F.linear with [out, in] instead": (ours_rms, lambda x, m: F.linear(x, m.weight, m.bias)),
    }
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    try:
        for rep in range(repeats + 1):  # the first pass warms up
            for i, r in enumerate(rows):
                for name in names[(i + rep) % len(names):] + names[:(i + rep) % len(names)]:
                    fdm._rms, fdm._lin = variants[name]
                    ids, mask = batch([r], pad, "cpu")
                    s = gen.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=[], rng=i).stats
                    if rep:
                        times[name].append(s.draft_time / s.target_calls)
    finally:
        fdm._rms, fdm._lin = ours_rms, ours_lin
    return {k: 1e6 * statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128, help="the draft's width (the embedded target's)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--flush-mb", type=int, default=64, help="buffer written before each cold call")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the prompts in the loop")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args(argv)
    if min(args.hidden, args.calls, args.flush_mb, args.repeats, args.prompts, args.new_tokens) < 1:
        ap.error("--hidden, --calls, --flush-mb, --repeats, --prompts and --new-tokens must be >= 1")
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    env = machine()
    H = args.hidden
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, H, generator=g)
    w = torch.randn(H, generator=g)
    flush = torch.zeros(args.flush_mb * 2**18)
    cases = {}
    for n_in, n_out, name in ((H, 3 * H, "qkv"), (2 * H, H, "fc"), (H, 2 * 2 * H, "gate_up")):
        W = torch.randn(n_out, n_in, generator=g)
        Wt = W.T.contiguous()
        xi = torch.randn(1, 1, n_in, generator=g)
        cases[f"linear {name} [{n_in} -> {n_out}]"] = {"F.linear, [out, in]": lambda xi=xi, W=W: F.linear(xi, W),
                                                      "x @ W_t, [in, out]": lambda xi=xi, Wt=Wt: xi @ Wt}
    cases[f"RMSNorm [{H}]"] = {"F.rms_norm": lambda: F.rms_norm(x, (H,), w, 1e-6),
                               "layer norm of [x, -x]": lambda: rms_as_layer_norm(x, w, 1e-6)}
    diff = float((rms_as_layer_norm(x, w, 1e-6) - F.rms_norm(x, (H,), w, 1e-6)).abs().max())
    rows, res = [], {}
    for case, forms in cases.items():
        timed(forms, 50, None)  # warm-up
        warm, cold = timed(forms, args.calls, None), timed(forms, max(args.calls // 4, 1), flush)
        res[case] = {"warm_us": warm, "cold_us": cold}
        (a, b) = forms
        rows.append(f"| {case} | {a} | {warm[a]:.2f} | {cold[a]:.2f} | {b} | {warm[b]:.2f} | {cold[b]:.2f} | "
                    f"{warm[b] / warm[a]:.2f} | {cold[b] / cold[a]:.2f} |")
    lines = ["# The feature draft's kernel choices on a CPU", "",
             f"Command: `{env['command']}` on {describe(env)}.",
             f"One row of width {H}, float32, 1 thread; warm: the same call repeated ({args.calls} calls); "
             f"cold: after writing {args.flush_mb} MB ({max(args.calls // 4, 1)} calls); medians, the forms "
             f"alternating call by call. Largest difference between the two RMSNorm forms: {diff:.2e}.", "",
             "| case | form A | warm us | cold us | form B | warm us | cold us | B / A warm | B / A cold |",
             "|---|---|---|---|---|---|---|---|---|", *rows]
    loop = in_the_loop(args.repeats, args.prompts, args.new_tokens)
    base = loop[next(iter(loop))]
    lines += ["", f"## In the loop: EAGLE chain-4, batch 1, {args.prompts} prompts x {args.repeats} passes, "
              f"{args.new_tokens} new tokens", "", "| forms | draft us/round | / library |", "|---|---|---|"]
    lines += [f"| {k} | {v:.0f} | {v / base:.3f} |" for k, v in loop.items()]
    write("draft_ops", {"command": env["command"], "hidden": H, "cases": res, "rms_max_abs_diff": diff,
                        "loop_draft_us_per_round": loop}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
