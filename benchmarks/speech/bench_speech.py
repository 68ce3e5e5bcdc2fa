"""Speculative transcription vs plain greedy and transformers' assisted generation, CPU, 1 thread.

    python benchmarks/speech/bench_speech.py

The embedded speech pair (``speculate.domains.text.examples.speech``) transcribes the held-out utterances:

- plain greedy decoding, ``target.generate(input_features=...)``, at batch 1 and batch 8;
- transformers' assisted generation with the same draft, ``generate(assistant_model=draft)``, at
  batch 1 (transformers refuses larger batches);
- ours, ``SpeculativeGenerator(target, draft, lookahead=k).generate(input_features=...,
  temperature=0)``, at batch 1 and batch 8;
- ours with ``lookahead=0`` at batch 1: plain decoding in our loop (the lean Whisper decoder,
  ``lean_seq2seq.py``), so that the table separates what speculation gains from what the loop gains.

Every method's transcripts are checked to be the plain greedy ones, token for token. Each method
runs ``--repeats`` times over the whole held-out set, interleaved; the median total time is kept.
Tokens/s counts the target's greedy tokens (EOS included). Results:
benchmarks/results/speech_generate.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import RESULTS, describe, machine, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402
from speculate.domains.text.examples import speech  # noqa: E402

from speculate import theory  # noqa: E402

N_NEW = 32


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lookahead", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--utterances", type=int, default=None)
    ap.add_argument("--pair", type=Path, default=None, help="folder with speech-target/ and speech-draft/ "
                    "(default: the embedded pair)")
    ap.add_argument("--results", default="speech_generate")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    env = machine()
    target, draft, tok = speech.load_speech_pair(path=args.pair)
    waves, refs = speech.load_heldout()
    if args.utterances:
        waves, refs = waves[:args.utterances], refs[:args.utterances]
    feats = speech.features(waves)
    m = len(waves)
    eos = target.config.eos_token_id
    k = args.lookahead
    gen = SpeculativeGenerator(target, draft, lookahead=k)
    gen0 = SpeculativeGenerator(target, draft, lookahead=0)

    @torch.inference_mode()
    def plain(x):
        return [speech.text_tokens(r, eos) for r in target.generate(input_features=x, max_new_tokens=N_NEW,
                                                      do_sample=False).tolist()]

    @torch.inference_mode()
    def assisted(x):
        out = target.generate(input_features=x, max_new_tokens=N_NEW, do_sample=False, assistant_model=draft)
        return [speech.text_tokens(r, eos) for r in out.tolist()]

    stats_of: dict[str, list] = {}

    def ours(name, g=gen):
        def run(x):
            o = g.generate(input_features=x, max_new_tokens=N_NEW, temperature=0, rng=0)
            stats_of.setdefault(name, []).append(o.stats)
            return [speech.text_tokens(r, eos) for r in o.new_tokens]
        return run

    methods = {"plain_b1": (plain, 1), "assisted_b1": (assisted, 1), "ours_b1": (ours("ours_b1"), 1),
               "ours_k0_b1": (ours("ours_k0_b1", gen0), 1), "plain_b8": (plain, 8), "ours_b8": (ours("ours_b8"), 8)}
    for x in (feats[:1], feats[:8]):  # warm-up
        plain(x), gen.generate(input_features=x, max_new_tokens=N_NEW, temperature=0, rng=0)
    assisted(feats[:1]), gen0.generate(input_features=feats[:1], max_new_tokens=N_NEW, temperature=0, rng=0)
    times = {name: [] for name in methods}
    outputs = {}
    for _ in range(args.repeats):
        for name, (fn, b) in methods.items():
            rows = []
            t0 = time.perf_counter()
            for i in range(0, m, b):
                rows += fn(feats[i:i + b])
            times[name].append(time.perf_counter() - t0)
            outputs[name] = rows
    ref_rows = outputs["plain_b1"]
    tokens = sum(len(r) + (len(r) < N_NEW) for r in ref_rows)  # + the EOS of finished rows
    same = {name: rows == ref_rows for name, rows in outputs.items()}
    hyp = [tok.decode(r, skip_special_tokens=True) for r in ref_rows]
    wer = speech.word_error_rate(refs, hyp)
    res = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        res[name] = {"seconds": round(t, 4), "tokens_per_s": round(tokens / t, 1), "runs": [round(x, 4) for x in ts],
                     "identical_to_plain_greedy": same[name]}
    for b in (1, 8):
        res[f"ours_b{b}"]["speedup_vs_plain"] = round(res[f"plain_b{b}"]["seconds"] / res[f"ours_b{b}"]["seconds"], 3)
    res["assisted_b1"]["speedup_vs_plain"] = round(res["plain_b1"]["seconds"] / res["assisted_b1"]["seconds"], 3)
    res["ours_k0_b1"]["speedup_vs_plain"] = round(res["plain_b1"]["seconds"] / res["ours_k0_b1"]["seconds"], 3)
    res["ours_b1"]["speedup_vs_own_plain_loop"] = round(res["ours_k0_b1"]["seconds"] / res["ours_b1"]["seconds"], 3)
    res["ours_b1"]["speedup_vs_assisted"] = round(res["assisted_b1"]["seconds"] / res["ours_b1"]["seconds"], 3)
    spec = {}
    for name, st in stats_of.items():
        if name == "ours_k0_b1":
            continue
        s = sum(st[1:], st[0])
        a, c = s.alpha, s.cost_ratio
        spec[name] = {"alpha": round(a, 4), "tokens_per_call": round(s.tokens_per_call, 3),
                      "theory_tokens_per_call": round(theory.expected_tokens(a, k), 3), "c": round(c, 4),
                      "theory_speedup": round(theory.speedup(a, k, c), 3),
                      "histogram": s.accepted_per_position.tolist()}
    goals = {"wer_le_0.15": wer <= 0.15,
             "ours_b1_ge_1.8x_plain": res["ours_b1"]["speedup_vs_plain"] >= 1.8,
             "ours_b1_ge_1.3x_assisted": res["ours_b1"]["speedup_vs_assisted"] >= 1.3,
             "ours_b8_faster_than_plain_b8": res["ours_b8"]["speedup_vs_plain"] > 1.0}
    report = {"lookahead": k, "utterances": m, "target_tokens": tokens, "max_new_tokens": N_NEW,
              "threads": args.threads, "repeats": args.repeats, "heldout_wer": round(wer, 4),
              "methods": res, "speculative": spec, "goals": goals, "machine": env}
    write(args.results, report, markdown(report), folder=args.results_dir)
    print(markdown(report))
    return report


def markdown(r: dict) -> str:
    rows = [
        "# Speculative transcription (Whisper pair, CPU)",
        "",
        f"Command: `{r['machine']['command']}`. Machine: {describe(r['machine'])}.",
        "",
        f"{r['utterances']} held-out utterances, {r['target_tokens']} greedy target tokens (EOS included), "
        f"lookahead {r['lookahead']}, {r['threads']} thread, median of {r['repeats']} interleaved runs. "
        f"Held-out WER {r['heldout_wer']} (the same for every method: the transcripts are identical).",
        "",
        "| method | batch | seconds | tokens/s | speedup vs plain | identical transcripts |",
        "|---|---|---|---|---|---|",
    ]
    names = {"plain_b1": ("plain greedy `generate`", 1), "assisted_b1": ("transformers assisted generation", 1),
             "ours_b1": ("ours (`SpeculativeGenerator`)", 1),
             "ours_k0_b1": ("ours with `lookahead=0` (no drafts: our decoding loop alone)", 1),
             "plain_b8": ("plain greedy `generate`", 8),
             "ours_b8": ("ours (`SpeculativeGenerator`)", 8)}
    for key, (label, b) in names.items():
        m = r["methods"][key]
        sp = m.get("speedup_vs_plain", 1.0)
        rows.append(f"| {label} | {b} | {m['seconds']} | {m['tokens_per_s']} | {sp:.2f}x | "
                    f"{m['identical_to_plain_greedy']} |")
    rows += ["", f"Ours vs assisted generation at batch 1: {r['methods']['ours_b1']['speedup_vs_assisted']:.2f}x. "
             "Assisted generation cannot run at batch 8. Of the batch-1 speedup, "
             f"{r['methods']['ours_k0_b1']['speedup_vs_plain']:.2f}x comes from our decoding loop without drafts "
             "(lean decoder, no framework overhead) and "
             f"{r['methods']['ours_b1']['speedup_vs_own_plain_loop']:.2f}x from speculation on top of it.", "",
             "| ours | alpha | tokens per target call (theory) | c | theory speedup | accepted-length histogram |",
             "|---|---|---|---|---|---|"]
    for name, s in r["speculative"].items():
        rows.append(f"| {name} | {s['alpha']} | {s['tokens_per_call']} ({s['theory_tokens_per_call']}) | {s['c']} | "
                    f"{s['theory_speedup']} | {s['histogram']} |")
    rows += ["", "Goals: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in r["goals"].items()) + ".", ""]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
