"""The cost of a rollback: committing n of the k+1 tokens a verification call fed the target.

Speculative decoding feeds the target k+1 tokens per round (the last committed token and k drafts)
and keeps 1 + n of them when n drafts are accepted. With a position-indexed KV cache (Llama) the
rollback is free: the row's length advances by 1 + n and the stale slots are overwritten later.
A recurrent model (Mamba) must end the round with its state after the last kept token:
speculate's ``CachedModel`` logs, during the verification call, the state after every fed token
when it is small (at most ``recurrent.STATE_LOG_LIMIT`` elements per row and layer), and
``CachedModel.keep`` gathers the one after the last kept token (``--rollback gather``, the
default); larger states log each fed token's step inputs instead, and ``keep`` replays the 1 + n
kept ones from the committed state (``--rollback replay`` forces this path). Either way the state
after the whole block is taken as it is when every token is kept (n = k).

For each target and batch size this measures, after a prompt of ``--prefix`` tokens:

- ``verify``: one ``CachedModel.forward`` of k+1 tokens per row (what a round's target call costs);
- ``commit n``: ``CachedModel.keep(1 + n)`` right after it, for n = 0..k accepted drafts (every row
  the same n) and ``mixed`` (row r keeps 1 + r mod (k+1); batch > 1 only), and the rollback as a
  fraction of the verification call;
- ``recompute n``: the naive alternative, re-feeding the 1 + n kept tokens from the last committed
  state (a second forward of 1 + n tokens; nothing to do when every token is kept). (It would
  spare the verification call its log of step inputs, which is included in ``verify``.)
- ``step``: a one-token forward plus its commit (one plain decoding step through the same cache).

Before each measurement the cache is put back to the committed state after the prompt (Llama: the
lengths; Mamba: the committed states, whose tensors no forward modifies in place), untimed; the
cases are interleaved and rotated, and medians over ``--repeats`` x ``--reps`` samples are reported.

Run: ``python benchmarks/text/bench_rollback.py`` (the Mamba pair of ``train_pair.py --size mamba``
and the embedded Llama pair, batch 1 and 8, k = 4, 1 thread). Writes
``benchmarks/results/text_rollback.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import describe, machine, write  # noqa: E402
from speculate.domains.text.examples.corpus import load_corpus  # noqa: E402
from speculate.domains.text.examples.pair import load_pair  # noqa: E402
from speculate.domains.text.models import recurrent  # noqa: E402
from speculate.domains.text.models.kv_cache import CachedModel  # noqa: E402

PAIRS = {"mamba": ROOT / "benchmarks" / "text" / "models" / "mamba", "embedded": None,
         "large": ROOT / "benchmarks" / "text" / "models" / "large"}


def snapshot(lm: CachedModel):
    """The committed state of ``lm``: row lengths and each recurrent layer's committed tensors."""
    states = [(s.conv, s.state) for s in lm.recurrent.states] if lm.recurrent else []
    return lm.length.copy(), states


def restore(lm: CachedModel, snap) -> None:
    """Put ``lm`` back to ``snap`` as ``keep`` leaves it (empty round log, cursor at the state)."""
    length, states = snap
    lm.length = length.copy()
    for st, (conv, h) in zip(lm.recurrent.states if lm.recurrent else [], states, strict=True):
        st.conv, st.state = conv, h
        st.logged = np.zeros(len(length), np.int64)
        st.cur_at = np.zeros(len(length), np.int64)
        st.cur_conv, st.cur_state = conv, h


def measure(target, name: str, batch: int, args) -> dict:
    k, P = args.lookahead, args.prefix
    stream = torch.from_numpy(load_corpus("heldout").token_stream())
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, stream.numel() - P - k - 1, (batch,), generator=g)
    ids = stream[starts[:, None] + torch.arange(P + k + 1)]  # [B, P + k + 1]
    prompt, block = ids[:, :P], ids[:, P:]  # block: [B, k + 1]
    lm = CachedModel(target)
    lm.reset(batch=batch, capacity=P + 2 * (k + 1))
    with torch.inference_mode():
        lm.forward(prompt, np.zeros(batch, np.int64))
    lm.keep(np.full(batch, P))
    snap = snapshot(lm)
    at = np.full(batch, P, np.int64)
    cases = {f"n={n}": np.full(batch, 1 + n, np.int64) for n in range(k + 1)}
    if batch > 1:
        cases["mixed"] = 1 + np.arange(batch) % (k + 1)
    with torch.inference_mode():
        reference = lm.forward(block, at).clone()  # the verification logits, to check restores
    restore(lm, snap)

    def t() -> int:
        return time.perf_counter_ns()

    def verify_commit(keep: np.ndarray) -> tuple[float, float]:
        restore(lm, snap)
        t0 = t()
        with torch.inference_mode():
            logits = lm.forward(block, at)
        t1 = t()
        lm.keep(keep)
        t2 = t()
        if not torch.equal(logits, reference):
            raise RuntimeError("the restored cache gave different verification logits")
        return (t1 - t0) / 1e6, (t2 - t1) / 1e6

    def recompute(keep: np.ndarray) -> float:
        restore(lm, snap)
        if (keep == k + 1).all():  # every fed token kept: the state after the block, no work
            return 0.0
        w = int(keep.max())
        t0 = t()
        with torch.inference_mode():
            lm.forward(block[:, :w], at, valid=keep)
        lm.keep(keep)
        return (t() - t0) / 1e6

    def step() -> float:
        restore(lm, snap)
        t0 = t()
        with torch.inference_mode():
            lm.forward(block[:, :1], at)
        lm.keep(np.ones(batch, np.int64))
        return (t() - t0) / 1e6

    jobs = [("step", None)] + [(c, "verify") for c in cases] + [(c, "recompute") for c in cases]
    for _ in range(3):  # warm-up, untimed
        for case, kind in jobs:
            step() if kind is None else (verify_commit if kind == "verify" else recompute)(
                cases[case])
    verify: list[float] = []
    commit: dict[str, list[float]] = {c: [] for c in cases}
    naive: dict[str, list[float]] = {c: [] for c in cases}
    steps: list[float] = []
    per_repeat: list[dict] = []
    for rep in range(args.repeats):
        r_verify, r_commit = [], {c: [] for c in cases}
        for i in range(args.reps):
            j = (i + rep) % len(jobs)
            for case, kind in jobs[j:] + jobs[:j]:  # rotate the order
                if kind is None:
                    steps.append(step())
                elif kind == "verify":
                    v, c = verify_commit(cases[case])
                    verify.append(v)
                    r_verify.append(v)
                    commit[case].append(c)
                    r_commit[case].append(c)
                else:
                    naive[case].append(recompute(cases[case]))
        per_repeat.append({"verify_ms": statistics.median(r_verify),
                           "commit_ms": {c: statistics.median(x) for c, x in r_commit.items()}})
        print(f"  {name} batch {batch} repeat {rep}: verify {per_repeat[-1]['verify_ms']:.3f} ms, "
              + ", ".join(f"{c} {1e3 * v:.1f} us" for c, v in per_repeat[-1]["commit_ms"].items()),
              flush=True)
    v = statistics.median(verify)
    med = {c: statistics.median(x) for c, x in commit.items()}
    rec = {c: statistics.median(x) for c, x in naive.items()}
    return {
        "model": name, "class": type(target).__name__, "batch": batch, "lookahead": k,
        "prefix": P, "recurrent_layers": len(lm.recurrent.mixers) if lm.recurrent else 0,
        "samples": len(verify) // len(cases) if cases else 0,
        "verify_ms": v, "step_ms": statistics.median(steps),
        "commit_ms": med, "commit_over_verify": {c: x / v for c, x in med.items()},
        "recompute_ms": rec, "recompute_over_verify": {c: x / v for c, x in rec.items()},
        "per_repeat": per_repeat,
    }


def markdown(res: dict) -> str:
    k = res["lookahead"]
    ns = [f"n={n}" for n in range(k + 1)]
    lines = [
        "# Text: the cost of a rollback (recurrent state vs position-indexed KV cache)", "",
        f"Command: `{res['command']}`", "",
        f"Machine: {describe(res['machine'])}; {res['threads']} thread, CPU, float32; prompt of "
        f"{res['prefix']} held-out bytes per row, then a verification call of k+1 = {k + 1} tokens "
        f"per row; medians of {res['repeats']} x {res['reps']} interleaved samples per cell.", "",
        "`verify`: one `CachedModel.forward` of k+1 tokens (the round's target call). `commit n`: "
        "`CachedModel.keep(1 + n)` after n accepted drafts (every row the same n; `mixed`: row r "
        "keeps 1 + r mod (k+1)) -- for Llama a length update (the rollback is free), for Mamba "
        + {"gather": "a gather of the state logged after the last kept token. ",
           "replay": "a replay of the kept tokens' logged step inputs from the committed state (none at n = k). ",
           "both": "(gather) a gather of the state logged after the last kept token, (replay) a replay of "
                   "the kept tokens' logged step inputs from the committed state (none at n = k), the two "
                   "alternating repeat by repeat in one process. "}[res.get("rollback", "gather")]
        + "`recompute n`: the naive alternative, re-feeding the 1 + n kept tokens from the committed "
        "state. `step`: one plain one-token forward and its commit.", "",
        "| target | batch | step ms | verify ms | " + " | ".join(f"commit {n} us" for n in ns)
        + " | commit mixed us | max commit / verify | "
        + " | ".join(f"recompute {n} ms" for n in ns[:-1]) + " | recompute mixed ms |",
        "|---|---|---|---|" + "---|" * (k + 1) + "---|---|" + "---|" * k + "---|",
    ]
    for r in res["results"]:
        cm, rc = r["commit_ms"], r["recompute_ms"]
        lines.append(
            f"| {r['model']} ({r['class']}) | {r['batch']} | {r['step_ms']:.3f} | "
            f"{r['verify_ms']:.3f} | " + " | ".join(f"{1e3 * cm[n]:.1f}" for n in ns) + " | "
            + (f"{1e3 * cm['mixed']:.1f}" if "mixed" in cm else "") + " | "
            + f"{100 * max(r['commit_over_verify'].values()):.2f}% | "
            + " | ".join(f"{rc[n]:.3f}" for n in ns[:-1]) + " | "
            + (f"{rc['mixed']:.3f}" if "mixed" in rc else "") + " |")
    lines += ["", "Rollback as a fraction of the verification call (commit n / verify):", "",
              "| target | batch | " + " | ".join(ns) + " | mixed | naive recompute / verify (n=0..k-1) |",
              "|---|---|" + "---|" * (k + 2) + "---|"]
    for r in res["results"]:
        f, g = r["commit_over_verify"], r["recompute_over_verify"]
        lines.append(f"| {r['model']} | {r['batch']} | " + " | ".join(f"{100 * f[n]:.2f}%" for n in ns)
                     + " | " + (f"{100 * f['mixed']:.2f}%" if "mixed" in f else "") + " | "
                     + ", ".join(f"{100 * g[n]:.0f}%" for n in ns[:-1]) + " |")
    lines.append("")
    return "\n".join(lines)


@contextlib.contextmanager
def _path(rollback: str):
    """Recurrent layers roll back by gather (the default limit) or by replay (no state logged)."""
    saved = recurrent.STATE_LOG_LIMIT
    recurrent.STATE_LOG_LIMIT = 0 if rollback == "replay" else saved
    try:
        yield
    finally:
        recurrent.STATE_LOG_LIMIT = saved


def _medians(runs: list[dict], name: str) -> dict:
    """One result from runs of :func:`measure`: the median of each timing over the runs."""
    med = lambda xs: statistics.median(xs)  # noqa: E731
    out = {**runs[0], "model": name, "samples": sum(r["samples"] for r in runs),
           "per_repeat": [x for r in runs for x in r["per_repeat"]]}
    for key in ("verify_ms", "step_ms"):
        out[key] = med([r[key] for r in runs])
    for key in ("commit_ms", "recompute_ms"):
        out[key] = {c: med([r[key][c] for r in runs]) for c in runs[0][key]}
    out["commit_over_verify"] = {c: x / out["verify_ms"] for c, x in out["commit_ms"].items()}
    out["recompute_over_verify"] = {c: x / out["verify_ms"] for c, x in out["recompute_ms"].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", nargs="+", default=["mamba", "embedded"],
                    help="mamba, embedded, large, or folders with target/ and draft/")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40, help="samples per case and repeat")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollback", choices=["gather", "replay", "both"], default="gather",
                    help="recurrent rollback: the logged state after the kept token (gather, the default "
                    "for states of at most recurrent.STATE_LOG_LIMIT elements per row), the replay of "
                    "the kept tokens' step inputs (replay, what larger states use), or both, alternating "
                    "repeat by repeat in one process (an A/B of the two paths)")
    ap.add_argument("--out", default=None, help="path of the results without suffix "
                    "(default: results/text_rollback)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    env = machine()
    res = {"command": env["command"], "rollback": args.rollback, "threads": args.threads, "lookahead": args.lookahead,
           "prefix": args.prefix, "repeats": args.repeats, "reps": args.reps, "machine": env,
           "results": []}
    for pair in args.pairs:
        target, _, _ = load_pair(path=PAIRS.get(pair, pair))
        name = pair if pair in PAIRS else Path(pair).name
        for b in args.batch:
            if args.rollback != "both":
                with _path(args.rollback):
                    res["results"].append(measure(target, name, b, args))
                continue
            runs: dict[str, list[dict]] = {"gather": [], "replay": []}
            one = argparse.Namespace(**{**vars(args), "repeats": 1})
            for r in range(args.repeats):  # gather, replay, replay, gather, ...
                for path in (("gather", "replay") if r % 2 == 0 else ("replay", "gather")):
                    with _path(path):
                        runs[path].append(measure(target, name, b, one))
            res["results"] += [_medians(runs[p], f"{name} ({p})") for p in ("gather", "replay")]
    out = Path(args.out) if args.out else None
    md = markdown(res)
    write(out.name if out else "text_rollback", res, md, folder=out.parent if out else None)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
