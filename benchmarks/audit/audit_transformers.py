"""Audit transformers' assisted generation: does each variant keep the target's distribution?

    python benchmarks/audit/audit_transformers.py                      # every variant, 60 s each at most
    python benchmarks/audit/audit_transformers.py --budget 20 --only plain,assisted
    python benchmarks/audit/audit_transformers.py --only Kirchenbauer --budget 400 --merge   # rerun one variant

Writes ``benchmarks/results/audit_transformers.md`` and ``.json`` (the exact command, the transformers
version, and per variant: the call, the test, n, the TV estimate with its interval next to an exact
sampler's at that n, p, the verdict, and for every bias the code path responsible in the installed
transformers and a minimal reproduction). Re-run it on each new transformers release. ``--merge``
keeps the other variants' rows of the existing files: the variants run now (``--only``) replace
theirs, and the report names each rerun's command.

The models are tiny random Llamas (vocabulary 10: a 2-layer target, a 1-layer assistant, no
download); each variant samples ``--tokens`` new tokens of one prompt (one row per ``generate``
call: transformers' assisted generation is batch 1) and is audited with
``speculate.domains.text.audit.audit_generate``: against the target's exact law (an enumeration
through the same settings) where it can be built, else (guidance, watermarks) against plain
``generate`` with the same settings (two-sample mode). Each audit is sized to catch a TV of
``--tv`` with probability ``--power`` at level ``--alpha``, stops early when its sequential test
is overwhelming, and is cut at ``--budget`` seconds (then "inconclusive", with the TV it could
catch). 23 variants are audited, so a level of 1e-3 each keeps the report's false-alarm rate below 2.3%.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import command, machine, write

G = "transformers/generation"
SHARED = (f"{G}/candidate_generator.py: AssistedCandidateGenerator.__init__ keeps the target's logits_processor "
          "list and _prepare_generation_args hands it to the assistant's generate(), so one stateful instance is "
          "called on the assistant's drafted prefixes as well as the target's verified ones")
PATHS = {
    "guidance": (f"{G}/logits_process.py: UnbatchedClassifierFreeGuidanceLogitsProcessor (runs the model on the "
                 "unconditional context and caches it between calls; built by GenerationMixin._get_logits_processor "
                 f"in {G}/utils.py); " + SHARED),
    "synthid": (f"{G}/logits_process.py: SynthIDTextWatermarkLogitsProcessor (keeps state between calls); " + SHARED),
    "watermark": (f"{G}/logits_process.py: WatermarkLogitsProcessor; " + SHARED),
    "universal": (f"{G}/candidate_generator.py: UniversalSpeculativeDecodingGenerator.get_candidates and "
                  "AssistantToTargetTranslator.get_target_logits / _get_assistant_to_target_input_ids (the draft "
                  f"law handed to {G}/utils.py: _speculative_sampling is the assistant's logits scattered into the "
                  "target's vocabulary, not the law the candidates were sampled from)"),
}
TOKENS = "__tokens__"  #: a variant's own horizon (default --tokens)
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "red"]


def word_tokenizer(words: list[str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=words[0], pad_token=words[0])


def tuned(draft: Any, **fields: Any) -> Any:
    """A copy of ``draft`` whose generation_config sets ``fields`` (where transformers reads the schedule)."""
    import copy

    twin = copy.deepcopy(draft)
    for k, v in fields.items():
        setattr(twin.generation_config, k, v)
    return twin


def variants(target: Any, draft: Any, eos: int) -> list[tuple[str, dict[str, Any], str | None]]:
    """(name, generate kwargs, reference) for every variant: reference "plain" = two-sample mode."""
    from speculate.domains.text.conformance import tiny_llama
    from transformers import SynthIDTextWatermarkingConfig, WatermarkingConfig

    s = {"do_sample": True}
    a = {**s, "assistant_model": draft}
    blocks = tuned(draft, assistant_confidence_threshold=0.0)  # drafts as many tokens as allowed
    # the assistant's tokenizer: the same words in another order, and two more (transformers refuses
    # assistant_tokenizer= when the two vocabularies have the same size)
    other = [*WORDS[::-1], "blue", "fox"]
    uad_draft = tiny_llama(vocab=len(other), layers=1, hidden=16, heads=2, kv_heads=1, rng=3)
    uad = {**s, "assistant_model": uad_draft, "tokenizer": word_tokenizer(WORDS),
           "assistant_tokenizer": word_tokenizer(other)}
    return [
        ("plain", s, None),
        ("assisted", a, None),
        ("assisted, greedy", {"do_sample": False, "assistant_model": draft}, None),
        ("prompt lookup", {**s, "prompt_lookup_num_tokens": 2}, None),
        ("early exit (assistant_early_exit=1)", {**s, "assistant_early_exit": 1}, None),
        ("universal assisted decoding (different tokenizers)", uad, None),
        # 3 tokens (top-k 4 keeps the law to 64 outcomes) and the assistant's confidence threshold off: with
        # its default (0.4) this tiny assistant stops after one token, and transformers caps a round's
        # candidates at the tokens still needed minus one, so only then do blocks of 2 drafts (and EOS
        # inside them) occur. The schedule is read from the ASSISTANT's generation_config
        # (candidate_generator.py: AssistedCandidateGenerator.__init__), not from generate()'s kwargs.
        ("assisted, 3 tokens, top-k 4, blocks of 2", {**s, "top_k": 4, "assistant_model": blocks, TOKENS: 3}, None),
        ("assisted, 3 tokens, top-k 4, 1 assistant token",
         {**s, "top_k": 4, "assistant_model": tuned(blocks, num_assistant_tokens=1), TOKENS: 3}, None),
        ("assisted, 3 tokens, top-k 4, heuristic schedule from 1 token",
         {**s, "top_k": 4, "assistant_model": tuned(blocks, num_assistant_tokens=1,
                                                    num_assistant_tokens_schedule="heuristic"), TOKENS: 3}, None),
        ("assisted, 3 tokens, top-k 4, confidence threshold 0.2 (dynamic stop)",
         {**s, "top_k": 4, "assistant_model": tuned(draft, assistant_confidence_threshold=0.2), TOKENS: 3}, None),
        ("assisted, 3 tokens, top-k 4, EOS in drafted blocks",
         {**s, "top_k": 4, "assistant_model": blocks, "eos_token_id": eos, TOKENS: 3}, None),
        ("prompt lookup, 3 tokens, top-k 4, EOS", {**s, "top_k": 4, "prompt_lookup_num_tokens": 2,
                                                   "eos_token_id": eos, TOKENS: 3}, None),
        ("assisted, temperature 0.7", {**a, "temperature": 0.7}, None),
        ("assisted, top-k 4 + top-p 0.8", {**a, "top_k": 4, "top_p": 0.8}, None),
        ("assisted, min-p 0.1", {**a, "min_p": 0.1}, None),
        ("assisted, typical-p 0.8", {**a, "typical_p": 0.8}, None),
        ("assisted, repetition penalty 1.5", {**a, "repetition_penalty": 1.5}, None),
        ("assisted, no-repeat-ngram 2 + bad words", {**a, "no_repeat_ngram_size": 2, "bad_words_ids": [[3]]}, None),
        ("assisted, min_new_tokens 2 + EOS", {**a, "min_new_tokens": 2, "eos_token_id": eos}, None),
        ("assisted, guidance_scale 1.5", {**a, "guidance_scale": 1.5}, "plain"),
        ("assisted, 3 tokens, top-k 4, blocks of 2, guidance_scale 1.5",
         {**s, "assistant_model": blocks, "top_k": 4, "guidance_scale": 1.5, TOKENS: 3}, "plain"),
        ("assisted, watermark (Kirchenbauer)", {**a, "watermarking_config": WatermarkingConfig(bias=2.5)}, "plain"),
        ("assisted, SynthID watermark", {**a, "watermarking_config": SynthIDTextWatermarkingConfig(
            keys=[654, 400, 836, 123, 340, 443, 597, 160, 57, 29], ngram_len=2)}, "plain"),
    ]


def _path(name: str) -> str | None:
    for key, path in (("guidance", PATHS["guidance"]), ("SynthID", PATHS["synthid"]),
                      ("Kirchenbauer", PATHS["watermark"]), ("universal", PATHS["universal"])):
        if key in name:
            return path
    return None


def _call(kw: dict[str, Any], reference: str | None, tokens: int) -> str:
    def show(v: Any) -> str:
        if hasattr(v, "config"):
            own = {k: getattr(v.generation_config, k) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                                                                "assistant_confidence_threshold")
                   if getattr(v.generation_config, k, None) is not None}
            return f"draft (generation_config: {own})" if own else "draft"
        if hasattr(v, "get_vocab"):
            return "<tokenizer>"
        if type(v).__name__.endswith("Config"):
            return f"{type(v).__name__}(...)"
        return repr(v)
    args = ", ".join(f"{k}={show(v)}" for k, v in kw.items())
    ref = ', reference="plain"' if reference else ""
    return f"audit_generate(target, PROMPT, tokens={tokens}, {args}{ref})"


def _merged(new: list[dict], cmd: str, args: dict[str, Any], order: list[str]
            ) -> tuple[list[dict], dict[str, Any], str, list[dict], dict[str, Any]]:
    """The existing results' rows with ``new`` in place of the same variants (in the variants' order):
    (rows, the base run's args and command, the reruns so far with this one, the base run's machine)."""
    from report import RESULTS

    old = json.loads((RESULTS / "audit_transformers.json").read_text())
    budget = old["args"].get("budget")
    base_cmd = old.get("command") or ("python benchmarks/audit/audit_transformers.py"
                                      + (f" --budget {budget:g}" if budget is not None else ""))
    for r in old["rows"]:
        r.setdefault("budget", old["args"].get("budget"))
        r.setdefault("command", base_cmd)
    fresh = {r["variant"]: r for r in new}
    rows = [fresh.get(r["variant"], r) for r in old["rows"]]
    rows += [r for r in new if r["variant"] not in {x["variant"] for x in old["rows"]}]
    rank = {n: i for i, n in enumerate(order)}
    rows.sort(key=lambda r: rank.get(r["variant"], len(rank)))
    reruns = [*old.get("reruns", []), {"command": cmd, "args": args, "variants": [r["variant"] for r in new],
                                       "machine": machine()}]
    return rows, old["args"], base_cmd, reruns, old["machine"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=60.0, help="seconds of sampling per variant (default 60)")
    p.add_argument("--tv", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=1e-3)
    p.add_argument("--power", type=float, default=0.99)
    p.add_argument("--tokens", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated variant names (substrings)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other variants' rows of the existing results (a partial rerun with --only)")
    args = p.parse_args(argv)
    cmd = command(argv, __file__)

    import torch
    import transformers
    from speculate.domains.text.audit import audit_generate, text_oracle
    from speculate.domains.text.conformance import tiny_llama
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    target = tiny_llama(vocab=len(WORDS))
    draft = tiny_llama(vocab=len(WORDS), layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    prompt = [1, 5, 7, 1, 5]
    first = text_oracle(target, prompt, 1, do_sample=True).table
    eos = max(first, key=first.get)[0]  # the likeliest first token: EOS often lands inside a drafted block
    rows = []
    for name, kw, ref in variants(target, draft, eos):
        if args.only and not any(o.strip() in name for o in args.only.split(",")):
            continue
        t0 = time.perf_counter()
        kw = dict(kw)
        tokens = kw.pop(TOKENS, args.tokens)
        row: dict[str, Any] = {"variant": name, "call": _call(kw, ref, tokens), "tokens": tokens,
                               "mode": "two-sample vs plain generate" if ref else "exact law",
                               "budget": args.budget, "command": cmd}
        try:
            r = audit_generate(target, prompt, tokens, reference=ref, tv=args.tv, alpha=args.alpha,
                               power=args.power, budget=args.budget, seed=args.seed, progress=False, **kw)
            row.update(verdict=r.verdict, pvalue=r.pvalue, n=r.n, n_planned=r.n_planned, tv_hat=r.tv_hat,
                       tv_ci=list(r.tv_ci), tv_exact_mean=r.tv_exact_mean, tv_detectable=r.tv_detectable,
                       reason=r.reason, impossible=list(r.impossible) if r.impossible else None,
                       samples_per_second=r.samples_per_second, over=[o["outcome"] for o in r.over[:2]],
                       under=[o["outcome"] for o in r.under[:2]])
            if r.biased:
                row["code_path"] = _path(name) or "not identified"
        except Exception as e:
            row.update(verdict="error", reason=f"{type(e).__name__}: {str(e)[:300]}")
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{name:52s} {row['verdict']:12s} {row.get('tv_hat', float('nan')):.3f} "
              f"p={row.get('pvalue', float('nan')):.2g} n={row.get('n', 0)} ({row['seconds']:.0f} s)", flush=True)

    base, reruns, where = vars(args), [], machine()
    if args.merge:
        rows, base, cmd, reruns, where = _merged(rows, cmd, vars(args), [n for n, _, _ in variants(target, draft, eos)])
    biased = [r for r in rows if r["verdict"] == "biased"]
    exact = [r["variant"] for r in rows if r["verdict"] == "consistent"]
    args = argparse.Namespace(**base)
    md = [f"# Audit of transformers {transformers.__version__} assisted generation", "",
          f"Command: `{cmd}`  ", *(f"Rerun: `{x['command']}` ({', '.join(x['variants'])})  " for x in reruns),
          f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"tiny random Llamas (vocabulary {len(WORDS)}, target 2 layers, assistant 1), prompt {prompt}, "
          f"the joint law of {args.tokens} new tokens (3 where the variant says so); "
          f"each audit sized for TV {args.tv} at power {args.power}, "
          f"level {args.alpha}, at most {args.budget:g} s of sampling.", "",
          f"**Consistent with the target's law** ({len(exact)}): {', '.join(exact) or 'none'}.  ",
          f"**Biased** ({len(biased)}): " + ("; ".join(f"{r['variant']} (TV {r['tv_hat']:.2f})" for r in biased)
                                             or "none") + ".", "",
          "| variant | test | n (planned) | TV est. [95% CI] | exact sampler's TV at n | p | verdict |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["verdict"] == "error":
            md.append(f"| {r['variant']} | {r['mode']}, {r['tokens']} tokens | - | - | - | - | "
                      f"error: {r['reason'][:120]} |")
            continue
        md.append(f"| {r['variant']} | {r['mode']}, {r['tokens']} tokens | {r['n']} ({r['n_planned']}) | "
                  f"{r['tv_hat']:.3f} "
                  f"[{r['tv_ci'][0]:.3f}, {r['tv_ci'][1]:.3f}] | {r['tv_exact_mean']:.3f} | {r['pvalue']:.2g} | "
                  f"{r['verdict']} |")
    if biased:
        md += ["", "## The biases: code paths and minimal reproductions", ""]
        for r in biased:
            md += [f"### {r['variant']}", "", f"- {r['reason']}", f"- code path: {r['code_path']}",
                   "- reproduction (`from speculate.domains.text.audit import audit_generate`; `target`, `draft`: "
                   "`speculate.domains.text.conformance.tiny_llama(vocab=10)` and "
                   "`tiny_llama(vocab=10, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)`, "
                   "`PROMPT = [1, 5, 7, 1, 5]`):",
                   "", f"      {r['call']}", ""]
    md += ["", "Inconclusive: the budget ran out before the planned n (the row says what n was reached); "
           "a longer --budget settles it."]
    write("audit_transformers", {"args": base, "command": cmd, "reruns": reruns,
                                 "transformers": transformers.__version__, "rows": rows, "machine": where},
          "\n".join(md) + "\n")
    print(json.dumps({"consistent": exact, "biased": [r["variant"] for r in biased]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
