"""Repetitive text: a code-editing workload where outputs repeat the prompt and earlier outputs.

The workload is not ours to choose freely: functions of the Python standard library (``textwrap``,
``json.decoder``, ``argparse``, ``shlex``, ``difflib``), each given by its head (the embedded pair has
256 positions for prompt and output together) followed by a one-line edit instruction as a comment and
the function's first line again, as an agent loop asks a model to rewrite a function with a small
change; then the loop asks again (the same requests: the first turn's outputs are what a store of
earlier outputs holds, not the prompt). Every method makes the same number of new tokens per row (EOS
does not stop rows).

Methods: ``plain`` (transformers ``generate``), ``prompt-lookup`` (transformers ``generate(
prompt_lookup_num_tokens=10)``; batch 1 only: it refuses batches), ``ngram`` (ours, prompt lookup,
verified exactly), ``suffix`` (ours: the suffix-tree draft, a store shared across requests; ``suffix-auto``
the same with ``lookahead="auto"``; ``suffix-k0``: ``lookahead=0``, plain decoding through the same loop
and runtime: a token tree is scored through the general cache, not the lean Llama loop; ``suffix+model``:
``draft=["suffix", model]``, the suffix draft's chains or the draft model, chosen per row and round,
lookahead 4), ``model``
(ours, the embedded draft model). Temperature 0 and 1; batch 1 and 8. Methods are interleaved per
repeat; ratios are of times from the same repeat (medians).

Each method first serves one short unrelated request per setting (one-off costs out of the timing).

Goals (issue #35): suffix >= 3x plain at batch 1, temperature 0; >= 2x at temperature 1; >= 2x
transformers' prompt lookup.

    python benchmarks/text/bench_repetitive.py            # about 15 minutes on one thread
    python benchmarks/text/bench_repetitive.py --quick
    python benchmarks/text/bench_repetitive.py --shapes   # the suffix draft's settings at T 1 (~3 min)
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import command, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples.pair import load_pair  # noqa: E402

EDITS = ["rename the first argument to `value`", "add a docstring", "return early when the input is empty",
         "use f-strings", "add type hints", "raise ValueError on bad input"]


def functions(n: int, max_chars: int = 900) -> list[str]:
    """``n`` whole functions of the standard library's sources (short enough for the context)."""
    import argparse as ap
    import difflib
    import json.decoder
    import shlex
    import textwrap

    out = []
    for mod in (textwrap, json.decoder, shlex, difflib, ap):
        for _, obj in inspect.getmembers(mod, inspect.isfunction):
            if obj.__module__ != mod.__name__:
                continue
            try:
                src = inspect.getsource(obj)
            except OSError:
                continue
            if 200 < len(src) <= max_chars and src.startswith("def "):
                out.append(src)
    return out[:n]


def first_turn(src: str, i: int, room: int = 100) -> str:
    """The request: the function's head (the embedded pair has 256 positions: prompt and output share
    them), the edit as a comment, and the function's first line again."""
    head = src.splitlines()[0]
    body = src[: max(0, room - len(head) - 40)]
    return f"{body}\n# {EDITS[i % len(EDITS)]}:\n{head}\n"


def ids(tok, text: str) -> list[int]:
    return tok.encode_bytes(text.encode(), add_bos=True)


def plain_generate(target, rows: list[list[int]], temperature: float, new_tokens: int, pad: int = 0,
                   **extra) -> torch.Tensor:
    """transformers' ``generate`` on left-padded ``rows``, exactly ``new_tokens`` new tokens per row
    (``extra``: e.g. ``prompt_lookup_num_tokens``); the sequences ``[B, L + new_tokens]``."""
    L = max(map(len, rows))
    x = torch.tensor([[pad] * (L - len(r)) + r for r in rows])
    m = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
    kw = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else dict(do_sample=False)
    return target.generate(x, attention_mask=m, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=pad, **kw, **extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", action="store_true",
                    help="only the suffix draft's tree and chain settings at temperature 1, batch 1")
    args = ap.parse_args(argv)
    if args.shapes:
        return shapes(args, argv)
    if args.quick:
        args.repeats, args.new_tokens = 1, 48
    torch.set_num_threads(args.threads)
    target, draft, tok = load_pair()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    srcs = functions(8)
    ours = {"ngram": SpeculativeGenerator(target, "ngram", lookahead=8, tokenizer=tok),
            "model": SpeculativeGenerator(target, draft, lookahead=4, tokenizer=tok)}
    try:
        ours["suffix"] = SpeculativeGenerator(target, "suffix", tokenizer=tok)
        ours["suffix-auto"] = SpeculativeGenerator(target, "suffix", tokenizer=tok, lookahead="auto")
        ours["suffix-k0"] = SpeculativeGenerator(target, "suffix", tokenizer=tok, lookahead=0)
        ours["suffix+model"] = SpeculativeGenerator(target, ["suffix", draft], tokenizer=tok, lookahead=4)
    except (ValueError, TypeError) as err:
        print(f"suffix draft unavailable: {err}", file=sys.stderr)

    def hf(rows, temperature, extra, new_tokens=None):
        n = new_tokens or args.new_tokens
        plain_generate(target, rows, temperature, n, pad, **extra)
        return len(rows) * n

    seen: dict[str, list] = {}  # method -> the Stats of its calls in the current setting

    def speculative(gen, name):
        def go(rows, temperature):
            out = gen.generate(rows, max_new_tokens=args.new_tokens, temperature=temperature, eos_token_id=[], rng=0)
            seen.setdefault(name, []).append(out.stats)
            return sum(len(t) for t in out.new_tokens)
        return go

    methods = {"plain": lambda r, t: hf(r, t, {}),
               "prompt-lookup": lambda r, t: hf(r, t, {"prompt_lookup_num_tokens": 10})}
    methods.update({name: speculative(g, name) for name, g in ours.items()})
    results = []
    for temperature in (0.0, 1.0):
        for batch in (1, 8):
            # turn 1: the edit request; turn 2: the same request with turn 1's output in the prompt
            if "suffix" in ours:  # the store starts empty for each setting; it fills as the loop runs
                ours["suffix"] = SpeculativeGenerator(target, "suffix", tokenizer=tok)
                ours["suffix-auto"] = SpeculativeGenerator(target, "suffix", tokenizer=tok, lookahead="auto")
                ours["suffix-k0"] = SpeculativeGenerator(target, "suffix", tokenizer=tok, lookahead=0)
                ours["suffix+model"] = SpeculativeGenerator(target, ["suffix", draft], tokenizer=tok, lookahead=4)
                methods.update({name: speculative(g, name) for name, g in ours.items() if name.startswith("suffix")})
            seen.clear()
            reqs = []
            for i, src in enumerate(srcs[:batch]):
                reqs.append(ids(tok, first_turn(src, i)))
            turn2 = reqs  # the agent loop asks again: the earlier outputs are in the suffix store, not the prompt
            per: dict[str, list[float]] = {m: [] for m in methods}
            errors: dict[str, str] = {}
            warm = [ids(tok, "import os\n")] * batch  # one short unrelated request per method: one-off costs
            for name in methods:
                try:
                    if name in ("plain", "prompt-lookup"):
                        hf(warm, temperature, {"prompt_lookup_num_tokens": 10} if name == "prompt-lookup" else {},
                           new_tokens=4)
                    else:
                        ours[name].generate(warm, max_new_tokens=4, temperature=temperature, eos_token_id=[], rng=0)
                except Exception:  # prompt lookup refuses batches: recorded in the timed loop
                    pass
            for r in range(args.repeats):
                order = list(methods) if r % 2 == 0 else list(methods)[::-1]
                for name in order:
                    if name in errors:
                        continue
                    t0 = time.perf_counter()
                    try:
                        n = sum(methods[name](rows, temperature) for rows in (reqs, turn2))
                    except Exception as err:  # prompt lookup refuses batches; recorded
                        errors[name] = f"{type(err).__name__}: {str(err)[:160]}"
                        continue
                    per[name].append(n / (time.perf_counter() - t0))
            base = statistics.median(per["plain"])
            row = {"temperature": temperature, "batch": batch,
                   "tokens_per_s": {m: statistics.median(v) for m, v in per.items() if v},
                   "over_plain": {m: statistics.median(v) / base for m, v in per.items() if v}, "errors": errors,
                   "alpha": {m: _alpha(v) for m, v in seen.items()},
                   "tokens_per_call": {m: sum(s.emitted for s in v) / max(sum(s.row_rounds for s in v), 1)
                                       for m, v in seen.items()}}
            if per.get("suffix-auto") and per.get("suffix-k0"):  # paired: the two ran next to each other
                row["auto_over_k0"] = statistics.median(a / b for a, b in zip(per["suffix-auto"], per["suffix-k0"],
                                                                              strict=True))
            results.append(row)
            print(temperature, batch, {m: f"{v:.2f}x" for m, v in row["over_plain"].items()}, errors, flush=True)
    cmd = command(argv, __file__)
    env = machine()
    names = list(methods)
    md = ["# Repetitive text: a code-editing workload (embedded pair)", "", f"Command: `{cmd}`", "",
          f"Machine: {describe(env)}.", "",
          f"{len(srcs)} standard-library functions, each rewritten with a one-line edit, then the same requests "
          f"again (a second turn); {args.new_tokens} new tokens per row and turn; the suffix draft's store starts "
          f"empty for each setting and keeps every earlier output of the setting (repeats included); "
          f"median of {args.repeats} interleaved repeats.", "",
          "| temperature | batch | " + " | ".join(f"{m} tok/s (x plain)" for m in names) + " |",
          "|---|---|" + "---|" * len(names)]
    for r in results:
        cells = [f"{r['tokens_per_s'][m]:.0f} ({r['over_plain'][m]:.2f}x)" if m in r["tokens_per_s"]
                 else "refused" for m in names]
        md.append(f"| {r['temperature']:g} | {r['batch']} | " + " | ".join(cells) + " |")
    if "suffix-k0" in names:
        md += ["", "Auto against plain decoding through the same loop (suffix-auto / suffix-k0, the median of the "
               "per-repeat ratios; goal >= 0.98): "
               + ", ".join(f"T {r['temperature']:g} batch {r['batch']}: {r['auto_over_k0']:.2f}x"
                           for r in results if "auto_over_k0" in r) + "."]
    ours_names = [m for m in names if m in ours]
    md += ["", "Our methods' acceptance: alpha (accepted / (accepted + rejections)) / tokens per target call "
           "(per row and round).", "",
           "| temperature | batch | " + " | ".join(ours_names) + " |", "|---|---|" + "---|" * len(ours_names)]
    for r in results:
        cells = [f"{r['alpha'][m]:.2f} / {r['tokens_per_call'][m]:.2f}" if m in r["alpha"] else "-"
                 for m in ours_names]
        md.append(f"| {r['temperature']:g} | {r['batch']} | " + " | ".join(cells) + " |")
    bound = ceiling(target, [ids(tok, first_turn(src, i)) for i, src in enumerate(srcs)], args.new_tokens)
    t1 = [r for r in results if r["temperature"] == 1.0 and "suffix" in r["tokens_per_call"]]
    md += ["", "The ceiling at temperature 1 (the target's own samples of these requests): the mean mass of its "
           f"most likely token is {bound[1]['mean_mass']:.2f} (of its 2 most likely: {bound[2]['mean_mass']:.2f}, "
           f"4: {bound[4]['mean_mass']:.2f}). A draft that cost nothing and always proposed the most likely token "
           f"would make {bound[1]['tokens_per_call']:.2f} tokens per target call (depth 16); a free tree with the 4 "
           f"most likely tokens at every node at most {bound[4]['tokens_per_call']:.2f}. The suffix draft makes "
           + ", ".join(f"{r['tokens_per_call']['suffix']:.2f} (batch {r['batch']}, alpha {r['alpha']['suffix']:.2f})"
                       for r in t1)
           + ": once a sample leaves the text it repeats, the store's continuations are not the target's likely "
           "tokens."]
    errs = {m: e for r in results for m, e in r["errors"].items()}
    if errs:
        md += ["", "Refusals: " + "; ".join(f"{m}: {e}" for m, e in errs.items())]
    write("text_repetitive" + ("_quick" if args.quick else ""), {"command": cmd, "rows": results, "machine": env,
                                                                  "ceiling_t1": bound},
          "\n".join(md))
    print("\n".join(md))
    return 0


SHAPES = {"default (16 nodes, spec_factor 1, min_prob 0.1)": {},
          "spec_factor 2": {"spec_factor": 2.0}, "spec_factor 4": {"spec_factor": 4.0},
          "spec_factor 4, min_prob 0.05": {"spec_factor": 4.0, "min_prob": 0.05},
          "32 nodes, spec_factor 4": {"max_nodes": 32, "spec_factor": 4.0},
          "chain": {"chain": True}, "chain, spec_factor 4": {"chain": True, "spec_factor": 4.0}}


def shapes(args, argv) -> int:
    """The suffix draft's settings at temperature 1, batch 1, on the same two turns: does a deeper or
    wider tree (more nodes per match length, less probable nodes) lift the tokens per target call?"""
    from speculate.domains.text.drafts.suffix import SuffixDraft

    torch.set_num_threads(args.threads)
    target, _, tok = load_pair()
    rows = [ids(tok, first_turn(functions(1)[0], 0))]
    gens = {name: SpeculativeGenerator(target, SuffixDraft(**kw), tokenizer=tok) for name, kw in SHAPES.items()}
    per: dict[str, list[float]] = {"plain": [], **{n: [] for n in gens}}
    calls: dict[str, list[float]] = {n: [] for n in gens}
    for r in range(args.repeats):
        order = list(per) if r % 2 == 0 else list(per)[::-1]
        for name in order:
            t0 = time.perf_counter()
            n = 0
            for _ in range(2):  # the two turns; each generator's store keeps its earlier outputs
                if name == "plain":
                    plain_generate(target, rows, 1.0, args.new_tokens)
                    n += args.new_tokens
                else:
                    out = gens[name].generate(rows, max_new_tokens=args.new_tokens, temperature=1.0,
                                              eos_token_id=[], rng=r)
                    n += sum(len(t) for t in out.new_tokens)
                    calls[name].append(out.stats.emitted / max(out.stats.row_rounds, 1))
            per[name].append(n / (time.perf_counter() - t0))
    base = statistics.median(per["plain"])
    rows_out = [{"setting": n, "over_plain": statistics.median(per[n]) / base,
                 "tokens_per_call": statistics.fmean(calls[n])} for n in gens]
    cmd = command(argv, __file__)
    env = machine()
    md = ["# Repetitive text at temperature 1: the suffix draft's settings (embedded pair, batch 1)", "",
          f"Command: `{cmd}`", "", f"Machine: {describe(env)}.", "",
          f"The first request of the workload, two turns of {args.new_tokens} new tokens, median of "
          f"{args.repeats} interleaved repeats; each setting's store keeps its own earlier outputs.", "",
          "| setting | x plain | tokens per target call |", "|---|---|---|"]
    md += [f"| {r['setting']} | {r['over_plain']:.2f}x | {r['tokens_per_call']:.2f} |" for r in rows_out]
    write("text_repetitive_shapes", {"command": cmd, "rows": rows_out, "machine": env}, "\n".join(md))
    print("\n".join(md))
    return 0


def ceiling(target, rows: list[list[int]], new_tokens: int, seed: int = 0, depth: int = 16) -> dict:
    """What any draft that costs nothing could reach at temperature 1 on these requests: along the
    target's own samples (``generate``, T 1), the mass of its m most likely tokens at each position
    (m = 1: the acceptance of a free chain that proposes the most likely token; m = 4: an upper bound
    for a free tree with 4 children per node); tokens per target call of such a draft, depth <= 16,
    are the mean over positions of 1 + a_i + a_i a_(i+1) + ... ."""
    torch.manual_seed(seed)
    out: dict = {}
    masses: dict[int, list] = {1: [], 2: [], 4: []}
    with torch.no_grad():
        for r in rows:
            y = plain_generate(target, [r], 1.0, new_tokens)
            probs = target(y).logits[0, len(r) - 1:-1].float().softmax(-1)  # [new, V] the law of each new token
            top = probs.topk(4, dim=-1).values.cumsum(-1)  # [new, 4]
            for m in masses:
                masses[m].append(top[:, m - 1].tolist())
    for m, seqs in masses.items():
        calls = []
        for a in seqs:
            for i in range(len(a)):
                e, run = 1.0, 1.0
                for j in range(i, min(i + depth, len(a))):
                    run *= a[j]
                    e += run
                calls.append(e)
        out[m] = {"mean_mass": statistics.fmean(v for a in seqs for v in a),
                  "tokens_per_call": statistics.fmean(calls)}
    return out


def _alpha(stats: list) -> float:
    acc = sum(s.accepted for s in stats)
    rej = sum(s.rejections for s in stats)
    return acc / (acc + rej) if acc + rej else float("nan")


if __name__ == "__main__":
    sys.exit(main())
