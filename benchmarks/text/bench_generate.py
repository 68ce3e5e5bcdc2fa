"""Tokens/s of speculative decoding against plain sampling and transformers' assisted generation.

Same process, same prompts (held-out Python standard library sources), same number of new tokens
for every method (EOS does not stop rows, so all methods do the same work):

- ``plain``: ``target.generate(do_sample=True)`` (transformers, KV cache);
- ``assisted``: ``target.generate(assistant_model=draft, do_sample=True)`` with transformers'
  defaults (20 draft tokens, confidence threshold 0.4), and ``assisted-k``: ``num_assistant_tokens
  = k``, no confidence stop (the like-for-like setting);
- ``ours-token`` / ``ours-block``: ``SpeculativeGenerator(target, draft, lookahead=k)``;
- batch 8: ``plain`` (batched ``generate``, left padding) and ours; assisted generation refuses
  batches larger than 1 (the error message is recorded).

Methods are interleaved prompt by prompt and repeated; each repeat gives a time per method, and
every speedup is a ratio of times measured in the same repeat (the median over repeats is
reported, with its range). Theory: Leviathan et al.'s speedup ``(1 - a^(k+1)) / ((1 - a)(k c + 1))``
at the measured acceptance ``a`` (token rule) and cost ratio ``c`` = time of one draft step as our
generator runs it (its draft model forward, probabilities and sampling, from the runs' own
statistics) / time per token of ``plain``. (The draft model decoding alone through transformers,
``draft-alone``: ``draft.generate(do_sample=True)``, is reported too: that is the draft cost of
assisted generation; our generator runs Llama drafts in a leaner loop.) ``r`` = time of one of our
verification calls (k+1 tokens per row) / time per token of ``plain``: the cost of scoring k+1
tokens at once, which the formula takes as 1; ``E / (k c + r)`` is the prediction with it.

State-space pairs (``--pair mamba``: the Mamba pair of ``train_pair.py --size mamba``): transformers'
assisted generation and prompt lookup refuse stateful models; a method that raises on its untimed
first call is left out of the timings and its error message recorded in the table.

Run: ``python benchmarks/text/bench_generate.py`` (embedded pair, CPU, about 10 minutes on a quiet
core); ``--pair large`` for the larger pair, ``--pair mamba`` for the Mamba pair;
``--device cuda --dtype bfloat16`` on a GPU.
Writes ``benchmarks/results/text_generate[_<pair>][_<device>].{json,md,png}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import describe, machine, short_error, write  # noqa: E402
from speculate.domains.text import SpeculativeGenerator  # noqa: E402

from speculate import theory  # noqa: E402

LARGE = ROOT / "benchmarks" / "text" / "models" / "large"
#: pairs trained by train_pair.py outside the package, by preset name
NAMED = {name: ROOT / "benchmarks" / "text" / "models" / name for name in ("large", "mamba")}


def pair_path(pair: str) -> Path | None:
    """The folder of a pair named on a command line: None for ``embedded`` (``load_pair``'s default),
    a preset of :data:`NAMED`, or a folder."""
    return None if pair == "embedded" else NAMED.get(pair, Path(pair))

#: methods that must run (the others may be refused by transformers: their error is recorded)
REQUIRED = ("plain", "draft-alone", "ours-token", "ours-block")


def load(pair: str, device: str, dtype: torch.dtype, train_missing: bool):
    """The pair's (target, draft, tokenizer); ``large`` is trained first when missing and asked."""
    import subprocess

    from speculate.domains.text.examples.pair import load_pair

    path = pair_path(pair)
    if pair in NAMED and not (path / "draft" / "model.safetensors").is_file():
        cmd = [sys.executable, str(ROOT / "benchmarks" / "text" / "train_pair.py"), "--size", pair]
        if not train_missing:
            raise SystemExit(f"the {pair} pair is not in {path}; train it (about 30-40 min on one "
                             f"thread) with: {' '.join(cmd[1:])}, or pass --train-missing")
        print(f"the {pair} pair is missing: training it now with {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    return load_pair(device=device, dtype=dtype, path=path)


def prompts(tok, n: int, n_bytes: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``n_bytes`` bytes (BOS + text) cut at line starts of held-out files."""
    from speculate.domains.text.examples.corpus import load_corpus

    docs = [d for d in load_corpus("heldout").documents if len(d) > 4 * n_bytes]
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.permutation(len(docs))[:n]:
        text = docs[i].encode() if isinstance(docs[i], str) else bytes(docs[i])
        start = text.find(b"\n", int(rng.integers(0, len(text) - 2 * n_bytes))) + 1
        out.append(tok.encode_bytes(text[start : start + n_bytes], add_bos=True))
    return out


def batch(rows: list[list[int]], pad: int, device: str):
    L = max(map(len, rows))
    ids = torch.tensor([[pad] * (L - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def make_methods(target, draft, k: int, n_new: int, pad: int, device: str, batch_size: int,
                 early_exit: int = 0, cuda_graphs: bool = False):
    """name -> function(list of prompt rows, seed) -> (new tokens, stats or None).

    With ``early_exit`` > 0 (batch 1), also the draft-free variants: transformers' prompt lookup
    against ours (``"ngram"``), and ours with the target's first ``early_exit`` layers as draft.
    """
    gens = {rule: SpeculativeGenerator(target, draft, lookahead=k, verify=rule)
            for rule in ("token", "block")}
    gens["auto"] = SpeculativeGenerator(target, draft, lookahead="auto", verify="block")
    if cuda_graphs:  # static steps (CUDA graphs on a GPU) for the target and the draft
        gens["graphs"] = SpeculativeGenerator(target, draft, lookahead=k, verify="block", cuda_graphs=True)
    if early_exit:
        gens["ngram"] = SpeculativeGenerator(target, "ngram", lookahead=k, verify="block")
        gens["early-exit"] = SpeculativeGenerator(target, f"early-exit:{early_exit}",
                                                  lookahead=k, verify="block")

    def hf(extra, model=target):
        def run(rows, seed):
            ids, mask = batch(rows, pad, device)
            torch.manual_seed(seed)
            out = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=n_new,
                                  min_new_tokens=n_new, pad_token_id=pad, **extra)
            return out.shape[0] * (out.shape[1] - ids.shape[1]), None
        return run

    def ours(rule):
        def run(rows, seed):
            ids, mask = batch(rows, pad, device)
            out = gens[rule].generate(ids, attention_mask=mask, max_new_tokens=n_new,
                                      eos_token_id=[], rng=seed)
            return sum(len(t) for t in out.new_tokens), out.stats
        return run

    methods = {"plain": hf({}), "draft-alone": hf({}, model=draft)}
    if batch_size == 1:
        methods["assisted"] = hf({"assistant_model": draft})
        methods["assisted-k"] = hf({"assistant_model": draft, "num_assistant_tokens": k,
                                    "assistant_confidence_threshold": 0.0,
                                    "num_assistant_tokens_schedule": "constant"})
    methods["ours-token"] = ours("token")
    methods["ours-block"] = ours("block")
    methods["ours-block-auto"] = ours("auto")
    if cuda_graphs:
        methods["ours-block-graphs"] = ours("graphs")
    if early_exit and batch_size == 1:
        methods["hf-prompt-lookup"] = hf({"prompt_lookup_num_tokens": k})
        methods["ours-ngram"] = ours("ngram")
        methods[f"ours-early-exit-{early_exit}"] = ours("early-exit")
    return methods


def assisted_batch_error(target, draft, rows, pad, device) -> str:
    ids, mask = batch(rows, pad, device)
    try:
        target.generate(ids, attention_mask=mask, assistant_model=draft, do_sample=True,
                        max_new_tokens=4, pad_token_id=pad)
    except Exception as e:  # transformers refuses batch > 1
        return f"{type(e).__name__}: {e}"
    return "ran (no error)"


def warm_up(methods: dict, rows, refused: dict | None = None) -> dict:
    """Call every method once, untimed; drop the optional ones that raise (transformers refuses
    assisted generation and prompt lookup for stateful models) into ``refused``: name -> error."""
    refused = {} if refused is None else refused
    for m in list(methods):
        try:
            methods[m](rows, seed=0)
        except Exception as e:
            if m in REQUIRED:
                raise
            refused[m] = f"{type(e).__name__}: {e}"
            del methods[m]
    return refused


def interleaved(methods: dict, groups: list, repeats: int, label: str) -> tuple[dict, dict, dict]:
    """Time every method on every group of rows, the order rotating group by group, ``repeats``
    times. ``methods``: name -> function(rows, seed) -> (new tokens, stats or None). Returns
    ``(times, tokens, stats)``: per method the total time of each repeat, the new tokens of one
    repeat and every run's stats."""
    names = list(methods)
    times: dict[str, list] = {m: [] for m in names}
    tokens = dict.fromkeys(names, 0)
    stats: dict[str, list] = {m: [] for m in names}
    for rep in range(repeats):
        acc = dict.fromkeys(names, 0.0)
        for gi, rows in enumerate(groups):
            for m in names[gi % len(names):] + names[: gi % len(names)]:  # rotate the order
                t0 = time.perf_counter()
                n, st = methods[m](rows, seed=1000 * rep + gi)
                acc[m] += time.perf_counter() - t0
                if rep == 0:
                    tokens[m] += n
                if st is not None:
                    stats[m].append(st)
        for m in names:
            times[m].append(acc[m])
        print(f"  {label} repeat {rep}: " + ", ".join(f"{m} {tokens[m] / acc[m]:.1f} tok/s" for m in names),
              flush=True)
    return times, tokens, stats


def run_setting(target, draft, all_prompts, batch_size, args, pad) -> dict:
    k, n_new = args.lookahead, args.new_tokens
    methods = make_methods(target, draft, k, n_new, pad, args.device, batch_size,
                           early_exit=args.early_exit, cuda_graphs=args.cuda_graphs)
    groups = [all_prompts[i : i + batch_size] for i in range(0, len(all_prompts), batch_size)]
    refused = warm_up(methods, groups[0])  # warm-up at this batch size (allocations, first calls)
    names = list(methods)
    times, tokens, stats = interleaved(methods, groups, args.repeats, f"batch {batch_size}")
    out: dict = {"batch": batch_size, "lookahead": k, "methods": {}, "refused": refused,
                 # every method decodes the same number of new tokens (EOS stops no row)
                 "new_tokens_by_method": dict(tokens),
                 "same_new_tokens": len(set(tokens.values())) == 1
                 and tokens["plain"] == len(all_prompts) * n_new}
    plain_step = statistics.median(times["plain"]) / (tokens["plain"] / batch_size)
    draft_step = statistics.median(times["draft-alone"]) / (tokens["draft-alone"] / batch_size)
    c_hf = statistics.median([times["draft-alone"][r] / times["plain"][r] for r in range(args.repeats)])
    s_tok = stats["ours-token"]
    our_step = sum(x.draft_time for x in s_tok) / sum(x.draft_calls for x in s_tok)  # one batched draft step
    c = our_step / plain_step
    alpha = _pooled(stats["ours-token"], "alpha")
    for m in names:
        sp = [times["plain"][r] / times[m][r] for r in range(args.repeats)]
        rec = {"tokens_per_s": tokens[m] / statistics.median(times[m]),
               "speedup_vs_plain": statistics.median(sp), "speedup_range": [min(sp), max(sp)]}
        if batch_size == 1 and m.startswith("ours"):
            for ref in (x for x in ("assisted", "assisted-k") if x in times):
                r = [times[ref][i] / times[m][i] for i in range(args.repeats)]
                rec[f"speedup_vs_{ref}"] = statistics.median(r)
        if stats[m] and m in ("ours-token", "ours-block"):
            s = stats[m]
            rec["alpha"] = _pooled(s, "alpha")
            rec["acceptance_rate"] = _pooled(s, "acceptance_rate")
            rec["tokens_per_call"] = _pooled(s, "tokens_per_call")
            calls = sum(x.target_calls for x in s)
            rec["time_per_target_call_s"] = sum(x.target_time for x in s) / calls
            rec["accepted_length_histogram"] = np.sum(
                [np.pad(x.accepted_per_position, (0, k + 1 - len(x.accepted_per_position)))
                 for x in s], axis=0).tolist()
            rec["theory_speedup"] = theory.speedup(alpha, k, c)
            rec["measured_over_theory"] = rec["speedup_vs_plain"] / rec["theory_speedup"]
            r_k = rec["time_per_target_call_s"] / plain_step
            rec["width_cost_r"] = r_k
            rec["prediction_with_width_cost"] = theory.expected_tokens(alpha, k) / (k * c + r_k)
        elif stats[m]:
            rec["acceptance_rate"] = _pooled(stats[m], "acceptance_rate")
            rec["tokens_per_call"] = _pooled(stats[m], "tokens_per_call")
        out["methods"][m] = rec
    out.update(alpha_token=alpha, cost_ratio_c=c, plain_step_s=plain_step, draft_step_s=our_step,
               hf_draft_step_s=draft_step, cost_ratio_c_hf_draft=c_hf,
               expected_tokens_per_call=theory.expected_tokens(alpha, k),
               theory_speedup=theory.speedup(alpha, k, c))
    return out


def sweep(target, draft, rows, args, pad) -> dict:
    """Batch 1, speedup over plain sampling for k = 1..K (token and block) against theory."""
    ks = list(range(1, args.sweep + 1))
    names = ["plain", "draft-alone"] + [f"{rule}-{k}" for k in ks for rule in ("token", "block")]
    gens = {f"{rule}-{k}": SpeculativeGenerator(target, draft, lookahead=k, verify=rule)
            for k in ks for rule in ("token", "block")}
    base = make_methods(target, draft, 1, args.new_tokens, pad, args.device, 2)
    times = dict.fromkeys(names, 0.0)
    stats: dict[str, list] = {n: [] for n in names}
    for gi, row in enumerate(rows * args.sweep_repeats):
        order = names[gi % len(names):] + names[: gi % len(names)]
        for n in order:
            t0 = time.perf_counter()
            if n in base:
                base[n]([row], seed=gi)
            else:
                ids, mask = batch([row], pad, args.device)
                out = gens[n].generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                       eos_token_id=[], rng=gi)
                stats[n].append(out.stats)
            times[n] += time.perf_counter() - t0
    tok = [s for k in ks for s in stats[f"token-{k}"]]
    plain_step = times["plain"] / (len(rows) * args.sweep_repeats * args.new_tokens)
    c = sum(s.draft_time for s in tok) / sum(s.draft_calls for s in tok) / plain_step  # our draft step
    alpha = _pooled(tok, "alpha")
    res = {"k": ks, "alpha_token": alpha, "cost_ratio_c": c,
           "theory": [theory.speedup(alpha, k, c) for k in ks]}
    for rule in ("token", "block"):
        res[rule] = [times["plain"] / times[f"{rule}-{k}"] for k in ks]
        res[f"{rule}_tokens_per_call"] = [_pooled(stats[f"{rule}-{k}"], "tokens_per_call")
                                          for k in ks]
    res["theory_tokens_per_call"] = [theory.expected_tokens(alpha, k) for k in ks]
    return res


def plot(res: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["sweep"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(s["k"], s["theory"], "k--", label=f"theory (a={s['alpha_token']:.2f}, "
               f"c={s['cost_ratio_c']:.2f})")
    ax[0].plot(s["k"], s["token"], "o-", label="ours, token rule")
    ax[0].plot(s["k"], s["block"], "s-", label="ours, block rule")
    ax[0].axhline(1.0, color="grey", lw=0.5)
    ax[0].set(xlabel="lookahead k", ylabel="speedup over plain sampling (batch 1)",
              title=f"{res['pair']} pair, {res['device']}")
    ax[0].legend()
    ax[1].plot(s["k"], s["theory_tokens_per_call"], "k--", label="theory")
    ax[1].plot(s["k"], s["token_tokens_per_call"], "o-", label="token rule")
    ax[1].plot(s["k"], s["block_tokens_per_call"], "s-", label="block rule")
    ax[1].set(xlabel="lookahead k", ylabel="tokens per target call")
    ax[1].legend()
    fig.tight_layout()
    return fig


def _pooled(stats_list, name):
    if name == "alpha":
        a = sum(s.accepted for s in stats_list)
        return a / (a + sum(s.rejections for s in stats_list))
    if name == "acceptance_rate":
        return sum(s.accepted for s in stats_list) / sum(s.proposed for s in stats_list)
    rr = sum(s.row_rounds for s in stats_list)
    return (sum(s.accepted for s in stats_list) + rr) / rr


def setting_section(s: dict, step: str = "decoding step", per: str = "token") -> list[str]:
    """The Markdown of one setting (batch size, lookahead): the measured alpha and c with the
    theory, the table of methods, refusals and the same-work check (shared with bench_seq2seq)."""
    lines = [f"## Batch {s['batch']}, lookahead k = {s['lookahead']}", "",
             f"Measured: alpha (token rule) = {s['alpha_token']:.3f}, c = our draft step / plain "
             f"{step} = {s['draft_step_s'] * 1e3:.2f} ms / {s['plain_step_s'] * 1e3:.2f} ms"
             f" = {s['cost_ratio_c']:.3f} (the draft decoding alone through transformers: "
             f"{s.get('hf_draft_step_s', float('nan')) * 1e3:.2f} ms per {per}); theory: E[tokens/call] = "
             f"{s['expected_tokens_per_call']:.2f}, speedup = {s['theory_speedup']:.2f}.", "",
             "| method | tokens/s | speedup vs plain | vs assisted | vs assisted-k | "
             "alpha | tokens/call | measured / theory | r | E/(kc+r) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in s["methods"].items():
        def f(key, fmt="{:.2f}", r=r):
            return fmt.format(r[key]) if key in r else ""
        lines.append(
            f"| {m} | {r['tokens_per_s']:.1f} | {r['speedup_vs_plain']:.2f} "
            f"[{r['speedup_range'][0]:.2f}, {r['speedup_range'][1]:.2f}] | "
            f"{f('speedup_vs_assisted')} | {f('speedup_vs_assisted-k')} | "
            f"{f('alpha', '{:.3f}')} | {f('tokens_per_call')} | {f('measured_over_theory')} | "
            f"{f('width_cost_r')} | {f('prediction_with_width_cost')} |")
    if s.get("assisted_batch_error"):
        lines += ["", f"transformers assisted generation at batch {s['batch']}: "
                  f"`{short_error(s['assisted_batch_error'])}`"]
    for m, err in s.get("refused", {}).items():
        lines += ["", f"`{m}` refused (left out of the timings): `{short_error(err)}`"]
    if "same_new_tokens" in s:
        lines += ["", "Same work: every method decoded "
                  + (f"{s['new_tokens_by_method']['plain']} new tokens"
                     if s["same_new_tokens"] else f"NOT the same tokens: {s['new_tokens_by_method']}")
                  + " per repeat (EOS stops no row)."]
    lines.append("")
    return lines


def markdown(res: dict, command: str) -> str:
    lines = [f"# Text generation: speculative vs plain vs transformers assisted ({res['pair']})", "",
             f"Command: `{command}`", "",
             f"Machine: {describe(res['machine'])}; device {res['device']}, {res['dtype']}; "
             f"{res['n_prompts']} prompts of "
             f"{res['prompt_bytes']} bytes, {res['new_tokens']} new tokens each, temperature 1, "
             f"{res['repeats']} interleaved repeats. Speedups are medians over repeats of time "
             "ratios within a repeat (range in brackets).", ""]
    for s in res["settings"]:
        lines += setting_section(s)
    if "sweep" in res:
        s = res["sweep"]
        lines += ["## Lookahead sweep (batch 1; speedup over plain sampling; plot: the .png)", "",
                  "| k | theory | token rule | block rule | tokens/call theory | token | block |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {k} | {s['theory'][i]:.2f} | {s['token'][i]:.2f} | {s['block'][i]:.2f} | "
                  f"{s['theory_tokens_per_call'][i]:.2f} | {s['token_tokens_per_call'][i]:.2f} | "
                  f"{s['block_tokens_per_call'][i]:.2f} |" for i, k in enumerate(s["k"])]
        lines.append("")
    lines += ["## Goals", ""] + [f"- {g}" for g in res["goals"]]
    if res["device"] == "cpu":
        lines += ["", "The CUDA (bf16) run of this benchmark was not done here: no GPU was "
                  "available to this session. Run it with `--device cuda --dtype bfloat16`."]
    return "\n".join(lines) + "\n"



def goals(res: dict) -> list[str]:
    out = []
    for s in res["settings"]:
        ours = {m: r for m, r in s["methods"].items() if m in ("ours-token", "ours-block")}
        best = max(ours, key=lambda m: ours[m]["speedup_vs_plain"])
        r = ours[best]
        if s["batch"] == 1 and "assisted" in s.get("refused", {}):
            out.append(f"batch 1: {best} speedup over plain decoding = "
                       f"{r['speedup_vs_plain']:.2f}; transformers' assisted generation refuses "
                       f"this pair ({short_error(s['refused']['assisted'], 160)})")
        if s["batch"] == 1 and "assisted" not in s.get("refused", {}):
            v = r.get("speedup_vs_assisted", float("nan"))
            out.append(f"batch 1: {best} / assisted generation = {v:.2f} (goal >= 1.3: "
                       f"{'met' if v >= 1.3 else 'NOT met'}); vs assisted-k = "
                       f"{r.get('speedup_vs_assisted-k', float('nan')):.2f}")
        if s["batch"] == 1:
            for m, rr in ours.items():
                ok = rr["measured_over_theory"] >= 0.85
                out.append(f"batch 1: {m} measured / theoretical speedup = "
                           f"{rr['measured_over_theory']:.2f} (goal >= 0.85: "
                           f"{'met' if ok else 'NOT met'}; with the measured width cost r = "
                           f"{rr['width_cost_r']:.2f} the prediction is "
                           f"{rr['prediction_with_width_cost']:.2f} vs measured "
                           f"{rr['speedup_vs_plain']:.2f})")
        else:
            out.append(f"batch {s['batch']}: {best} speedup over plain batched decoding = "
                       f"{r['speedup_vs_plain']:.2f} (goal > 1: "
                       f"{'met' if r['speedup_vs_plain'] > 1 else 'NOT met'})")
    return out


def _fingerprint(pair: str) -> dict:
    """SHA-256 (first 16 hex digits) of the pair's weight files, to tie results to weights."""
    import hashlib

    from speculate.domains.text.examples.pair import MODELS_DIR

    base = pair_path(pair) or MODELS_DIR
    return {sub: hashlib.sha256((base / sub / "model.safetensors").read_bytes()).hexdigest()[:16]
            for sub in ("target", "draft")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="embedded",
                    help="embedded, large, mamba, or a folder with target/ and draft/")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-bytes", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--early-exit", type=int, default=3,
                    help="batch 1 also runs n-gram and early-exit:N drafts (0: skip)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="also ours with cuda_graphs=True (static steps; CUDA graphs on a GPU)")
    ap.add_argument("--sweep", type=int, default=8, help="also sweep k = 1..SWEEP at batch 1 (0: skip)")
    ap.add_argument("--sweep-prompts", type=int, default=4)
    ap.add_argument("--sweep-repeats", type=int, default=2)
    ap.add_argument("--out", default=None,
                    help="path of the results without suffix (default: results/text_generate[_<pair>][_<device>])")
    ap.add_argument("--train-missing", action="store_true",
                    help="train a named pair first when it is missing (--pair large / mamba)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = machine(args.device)
    dtype = getattr(torch, args.dtype)
    target, draft, tok = load(args.pair, args.device, dtype, args.train_missing)
    pad = tok.pad_token_id
    rows = prompts(tok, args.prompts, args.prompt_bytes, args.seed)
    res = {"pair": args.pair, "pair_files_sha256": _fingerprint(args.pair), "device": args.device,
           "dtype": args.dtype, "threads": args.threads, "machine": env,
           "n_prompts": len(rows), "prompt_bytes": args.prompt_bytes,
           "new_tokens": args.new_tokens, "repeats": args.repeats, "settings": []}
    # warm-up: numba kernels, allocator, the models' first calls
    warm_up(make_methods(target, draft, args.lookahead, 8, pad, args.device, 1), rows[:1])
    for b in args.batch:
        s = run_setting(target, draft, rows, b, args, pad)
        if b > 1:
            s["assisted_batch_error"] = assisted_batch_error(target, draft, rows[:b], pad, args.device)
        res["settings"].append(s)
    if args.sweep:
        res["sweep"] = sweep(target, draft, rows[: args.sweep_prompts], args, pad)
    res["goals"] = goals(res)
    res["command"] = env["command"]
    suffix = "" if args.pair == "embedded" else f"_{Path(args.pair).name}"
    suffix += "" if args.device == "cpu" else f"_{args.device.split(':')[0]}"
    out = Path(args.out) if args.out else None
    write(out.with_suffix("").name if out else f"text_generate{suffix}", res, markdown(res, res["command"]),
          figure=plot(res) if args.sweep else None, folder=out.parent if out else None, dpi=120)
    print(markdown(res, res["command"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
