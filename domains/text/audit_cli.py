"""``speculate audit``: does a speculative decoder keep its target's distribution? (``audit.py``)

    speculate audit                                        # the embedded pair, transformers' assisted generation
    speculate audit --sampler hf-prompt-lookup --top-k 8 --tokens 2
    speculate audit --target T --draft D --temperature 0.7 --top-p 0.9 --tv 0.05 --budget 600 --json
    speculate audit --sampler speculate --verify block      # our own SpeculativeGenerator
    speculate audit --sampler mypkg.mod:my_sampler           # any function
    speculate audit --guidance-scale 1.5 --reference hf-plain   # no exact law: against plain generate

``--target PATH`` (a transformers causal LM folder; default the embedded pair) and ``--draft PATH``
(default: the embedded draft with the embedded target; ``none`` for samplers that need none).
``--sampler``: ``hf-assisted`` (``generate(assistant_model=draft)``), ``hf-prompt-lookup``
(``prompt_lookup_num_tokens``), ``hf-early-exit`` (``assistant_early_exit``), ``hf-plain``,
``speculate`` (``SpeculativeGenerator(target, draft)``, ``--draft ngram`` / ``early-exit:N`` too) or
``module:function``: a sampler ``function(n, seed)`` returning ``n`` lists of new token ids, or, if
it takes ``target=``, a factory called with ``target``, ``draft``, ``tokenizer``, ``prompt`` (ids),
``tokens`` and ``settings`` (the generation flags as ``generate`` keywords) that returns one.
The law is the target's under the generation flags, read as ``model.generate`` reads them
(sampling unless ``--temperature 0``; transformers' default top-k of 50 unless ``--top-k``; ``--top-k 0``
disables it). ``--reference hf-plain`` compares with plain ``generate`` instead (two samples).

The report goes to standard output (``--json``: as JSON, with the command line and versions); exit
status 0 when consistent, 1 when biased, 3 when inconclusive (the budget ran out), 4 when the sampler
raised during the audit (verdict ``error``: e.g. a NaN guard refusing a broken law), 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
from typing import Any

__all__ = ["main"]

SAMPLERS = ("hf-assisted", "hf-prompt-lookup", "hf-early-exit", "hf-plain", "speculate")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculate audit", description=(
        "Test whether a speculative decoder samples from its target's exact law (default: transformers' "
        "assisted generation on the embedded pair)."))
    p.add_argument("--target", metavar="PATH", help="target model folder (default: the embedded pair)")
    p.add_argument("--draft", metavar="PATH|none|ngram|early-exit:N",
                   help="draft model folder or 'none' (default: the embedded draft with the embedded target)")
    p.add_argument("--sampler", default="hf-assisted", metavar="|".join(SAMPLERS) + "|module:function",
                   help="what draws the continuations (default hf-assisted)")
    p.add_argument("--reference", choices=["hf-plain"], default=None,
                   help="two-sample mode: compare with plain generate instead of the exact law")
    p.add_argument("--prompt", default="def fib(n):", help="the prompt text (default 'def fib(n):')")
    p.add_argument("--prompt-ids", default=None, metavar="I,J,...", help="the prompt as token ids (instead of text)")
    p.add_argument("--tokens", type=int, default=2, metavar="M",
                   help="new tokens whose joint law is tested (default 2)")
    g = p.add_argument_group("generation settings (as model.generate reads them)")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    g.add_argument("--top-k", type=int, default=None, help="(transformers' default: 50; 0 disables)")
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--typical-p", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--no-repeat-ngram-size", type=int, default=None)
    g.add_argument("--bad-words-ids", default=None, metavar="JSON", help="e.g. '[[5], [7, 8]]'")
    g.add_argument("--min-new-tokens", type=int, default=None)
    g.add_argument("--eos", default=None, metavar="ID,...|none", help="EOS ids (default: the target's)")
    g.add_argument("--guidance-scale", type=float, default=None, help="classifier-free guidance (two-sample only)")
    g.add_argument("--num-assistant-tokens", type=int, default=None)
    g.add_argument("--num-assistant-tokens-schedule", default=None, choices=["constant", "heuristic", "dynamic"])
    g.add_argument("--prompt-lookup-num-tokens", type=int, default=3, help="for hf-prompt-lookup (default 3)")
    g.add_argument("--early-exit", type=int, default=1, metavar="LAYER", help="for hf-early-exit (default 1)")
    g.add_argument("--lookahead", default="auto", help="for speculate: drafts per round or 'auto'")
    g.add_argument("--verify", default="block", choices=["block", "token"], help="for speculate (default block)")
    a = p.add_argument_group("the test")
    a.add_argument("--tv", type=float, default=0.1, help="total variation to detect (default 0.1)")
    a.add_argument("--alpha", type=float, default=1e-3, help="significance level (default 1e-3)")
    a.add_argument("--power", type=float, default=0.99, help="probability of catching --tv (default 0.99)")
    a.add_argument("--n", type=int, default=None, help="samples (default: planned from --tv/--alpha/--power)")
    a.add_argument("--budget", type=float, default=600.0, metavar="SECONDS", help="sampling time at most (600)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The generation flags as ``generate`` keyword arguments (transformers' names)."""
    kw: dict[str, Any] = {"do_sample": args.temperature > 0}
    if args.temperature > 0:
        kw["temperature"] = args.temperature
    for name in ("top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size",
                 "min_new_tokens", "guidance_scale"):
        v = getattr(args, name)
        if v is not None:
            kw[name] = v
    if args.bad_words_ids is not None:
        kw["bad_words_ids"] = json.loads(args.bad_words_ids)
    if args.eos is not None:
        kw["eos_token_id"] = [] if args.eos == "none" else [int(x) for x in args.eos.split(",")]
    return kw


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    from .examples.pair import load_pair

    if args.target is None:
        target, draft, tok = load_pair()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not os.path.isdir(args.target):
            raise FileNotFoundError(f"--target {args.target!r} is not a folder (a transformers model folder)")
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        try:
            tok = AutoTokenizer.from_pretrained(args.target)
        except (OSError, ValueError, KeyError):
            tok = None
        draft = None
    if args.draft is not None:
        if args.draft == "none":
            draft = None
        elif os.path.isdir(args.draft):
            from transformers import AutoModelForCausalLM

            draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        else:
            draft = args.draft  # 'ngram', 'early-exit:N' (SpeculativeGenerator's own kinds)
    return target, draft, tok


def _prompt(args: argparse.Namespace, tok: Any) -> list[int]:
    if args.prompt_ids is not None:
        return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    if tok is None:
        raise ValueError("the target folder has no tokenizer: give the prompt as --prompt-ids 1,2,3")
    return list(tok(args.prompt)["input_ids"])


def _sampler(args: argparse.Namespace, target: Any, draft: Any, tok: Any, prompt: list[int],
             settings: dict[str, Any]) -> tuple[Any, Any, str]:
    """``(sampler, oracle semantics, description)``."""
    from . import audit as A

    m, name = args.tokens, args.sampler
    if name.startswith("hf-"):
        kw = dict(settings)
        if name == "hf-assisted":
            if not hasattr(draft, "generate"):
                raise ValueError("--sampler hf-assisted needs a draft model folder (--draft PATH)")
            kw["assistant_model"] = draft
        elif name == "hf-prompt-lookup":
            kw["prompt_lookup_num_tokens"] = args.prompt_lookup_num_tokens
        elif name == "hf-early-exit":
            kw["assistant_early_exit"] = args.early_exit
        elif name != "hf-plain":
            raise ValueError(f"--sampler {name!r}: expected one of {', '.join(SAMPLERS)} or module:function")
        for flag in ("num_assistant_tokens", "num_assistant_tokens_schedule"):
            if getattr(args, flag) is not None:
                kw[flag] = getattr(args, flag)
        return A.hf_sampler(target, prompt, m, **kw), "transformers", f"model.generate({_show(kw)})"
    if name == "speculate":
        from .api import SpeculativeGenerator

        lookahead = args.lookahead if args.lookahead == "auto" else int(args.lookahead)
        gen = SpeculativeGenerator(target, draft if draft is not None else "ngram", lookahead=lookahead,
                                   verify="greedy" if args.temperature == 0 else args.verify)
        kw = _speculate_kw(settings)
        return A.speculate_sampler(gen, prompt, m, **kw), "transformers", f"SpeculativeGenerator.generate({_show(kw)})"
    if ":" not in name:
        raise ValueError(f"--sampler {name!r}: expected one of {', '.join(SAMPLERS)} or module:function")
    mod, _, fn_name = name.partition(":")
    fn = getattr(importlib.import_module(mod), fn_name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "target" in params:
        fn = fn(target=target, draft=draft, tokenizer=tok, prompt=prompt, tokens=m, settings=settings)
    return fn, "transformers", name


def _speculate_kw(settings: dict[str, Any]) -> dict[str, Any]:
    """The flags for SpeculativeGenerator.generate: transformers' top-k default made explicit (the
    oracle reads the flags as generate does)."""
    kw = dict(settings)
    if kw.get("do_sample") and "top_k" not in kw:
        kw["top_k"] = 50
    if kw.get("top_k") == 0:
        kw["top_k"] = None
    if not kw.get("do_sample"):
        kw["temperature"] = 0.0
    return kw


def _show(kw: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'<model>' if hasattr(v, 'config') else repr(v)}" for k, v in kw.items())


def main(argv: list[str] | None = None) -> int:
    """Run ``speculate audit`` with ``argv``; returns the exit status."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be >= 1")
    if args.sampler == "speculate" and args.reference is not None:
        parser.error("--reference hf-plain compares transformers samplers; audit --sampler speculate against the law")
    try:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging

        from speculate import __version__
        from speculate.testing import audit

        from . import audit as A

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        target, draft, tok = _load(args)
        prompt = _prompt(args, tok)
        settings = _settings(args)
        sampler, semantics, what = _sampler(args, target, draft, tok, prompt, settings)
        common = dict(tv=args.tv, alpha=args.alpha, power=args.power, n=args.n, budget=args.budget, seed=args.seed)
        if args.reference is not None:
            ref = A.hf_sampler(target, prompt, args.tokens, **settings)
            report = audit(sampler, reference=ref, horizon=args.tokens, **common)
            law_desc = f"plain model.generate({_show(settings)})"
        else:
            law = A.text_oracle(target, prompt, args.tokens, semantics=semantics, **settings)
            report = audit(sampler, law, **common)
            law_desc = f"exact law of {len(law)} outcomes: {law.settings}"
    except (ValueError, TypeError, FileNotFoundError, ImportError, AttributeError) as e:
        print(f"speculate audit: {e}", file=sys.stderr)
        return 2
    status = {"consistent": 0, "biased": 1, "inconclusive": 3, "error": 4}[report.verdict]
    if args.json:
        print(json.dumps({"command": "speculate audit " + " ".join(argv), "sampler": what, "law": law_desc,
                          "prompt_ids": prompt, "versions": {"speculate": __version__,
                                                             "transformers": transformers.__version__,
                                                             "torch": torch.__version__},
                          "report": report.as_dict()}, default=str))
    else:
        print(f"sampler: {what}\nagainst: {law_desc}\nprompt ids: {prompt}\n{report}")
    return status


if __name__ == "__main__":
    sys.exit(main())
