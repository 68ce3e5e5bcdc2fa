"""Real-size speed model: c, r(k) and our per-round overhead for random-weight Llama models.

Random-weight ``LlamaForCausalLM`` models at real sizes (the ``1b`` preset: a Llama-3.2-1B-shaped
target with a ~140M draft; ``8b``: a Llama-3-8B-shaped target with the 1B shape as its draft, run
when the device has the memory and the time budget allows; ``tiny`` for CPU smoke tests), created
directly in their dtype on the device. Their acceptance means nothing (random weights): only the
timings are used, and the speedups are predicted at given acceptances alpha.

Per batch size, at a context of ``--context`` prompt tokens (KV cache filled), and for the two ways
our ``SpeculativeGenerator`` runs the models (``default``: the target through the transformers
forward with our position-indexed cache, the draft in the lean Llama loop; ``cuda_graphs``: both in
static steps, recorded as CUDA graphs on a GPU and run eagerly on a CPU):

- standalone model costs (synchronised wall time, warm-up, median of ``--repeats`` samples of
  ``--iters`` calls): the target's one-token step T1, its (k+1)-token scoring call s(k) for
  k = 1..8 and the draft's one-token step d, each through the code the generator runs it with;
  ``c = d / T1`` and ``r(k) = s(k) / T1``. The transformers forward with a ``DynamicCache`` (what
  plain ``generate`` runs) is timed too, as a reference.
- our per-round overhead (everything in a round except the two models' forward passes), measured
  as follows: the generator decodes ``--new-tokens`` tokens per row (EOS stops nothing; the same
  seed every run, so every run does the same rounds), alternately as is and with every forward
  call of its target and draft wrapped in ``torch.cuda.synchronize()`` timers. Overhead per round
  = (round time of the runs as is: draft + target + verify + commit time from the stats, over the
  rounds) - (the forward time per round of the wrapped runs: the draft steps and the target's
  scoring call, prefill excluded); medians over repeats. Also reported: the same difference within
  the wrapped runs (an upper bound: the synchronisation removes any overlap of host work with GPU
  work) and the round time minus the standalone costs ``k_mean d + s(k)`` (which also holds what
  the loop's forwards cost above the standalone ones: ragged rows' attention masks at batch > 1,
  the draft's 2-token first steps). It is measured at the lookaheads ``--overhead-k`` and fitted
  as ``o(k) = a + b k`` (least squares in the mean drafts per round).
- the speed model: predicted speedup over plain decoding (the target's one-token step, in the
  same engine) ``E / (k c + r(k) + o(k) / T1)`` with ``E = (1 - alpha^(k+1)) / (1 - alpha)``
  (``speculate.theory.expected_tokens``), for alpha in ``--alphas`` and k = 1..8, and the best k;
  checked against the measured round times at the measured k, and given again (``anchored``) with
  o(k) fitted to the round time minus the standalone costs instead.

Run: ``python benchmarks/gpu/bench_speed_model.py --device cuda`` (presets 1b and 8b, batch
1 / 8 / 32, budgeted at 4 minutes on an H100, not yet run on one; ``--max-seconds`` skips what is left and says so);
``--preset tiny --device cpu`` for a smoke test. Writes ``benchmarks/results/gpu_speed_model.{json,md}``
(``speed_model_cpu`` on a CPU) or ``--out PREFIX``.{json,md}, after every finished batch size.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import command, describe, machine, short_error, write  # noqa: E402

from speculate import theory  # noqa: E402

KS = list(range(1, 9))  #: lookaheads of the speed model
ALPHAS = [0.6, 0.8, 0.9]
GOAL = 0.05  #: per-round overhead / the 1B target's verification call at batch 1
VOCAB_LLAMA3 = 128256


def _llama(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool) -> dict:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                tie_word_embeddings=tied)


#: preset -> its target and draft configs, default context and new tokens per row
_1B = _llama(2048, 16, 32, 8, 8192, VOCAB_LLAMA3, True)  # Llama-3.2-1B's shape (tied embeddings)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(target=_llama(64, 2, 4, 2, 128, 512, True), draft=_llama(32, 1, 2, 1, 64, 512, True),
                 context=32, new_tokens=16),
    "1b": dict(target=_1B, draft=_llama(768, 6, 12, 4, 2048, VOCAB_LLAMA3, True), context=512, new_tokens=48),
    "8b": dict(target=_llama(4096, 32, 32, 8, 14336, VOCAB_LLAMA3, False),  # Llama-3-8B's shape
               draft=_1B, context=512, new_tokens=48),
}
#: how each configuration of our generator runs the target and the draft (see engine())
CONFIGS = {"default": {"target": "cached", "draft": "lean", "cuda_graphs": False},
           "cuda_graphs": {"target": "static", "draft": "static", "cuda_graphs": True}}
ENGINES = {"transformers": "transformers forward with a DynamicCache (plain generate)",
           "cached": "transformers forward with our position-indexed cache (CachedModel: our target)",
           "lean": "our lean Llama loop, eager (LeanLlama: our draft)",
           "static": "our lean Llama loop in static steps (CUDA graphs on a GPU, eager on a CPU)"}


def n_params(cfg: dict) -> int:
    """Parameters of a LlamaForCausalLM with this shape (no biases)."""
    H, L, I, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = H // cfg["num_attention_heads"]
    attn = H * cfg["num_attention_heads"] * hd * 2 + H * cfg["num_key_value_heads"] * hd * 2
    layer = attn + 3 * H * I + 2 * H
    return V * H * (1 if cfg["tie_word_embeddings"] else 2) + L * layer + H


def kv_bytes_per_token(cfg: dict, itemsize: int) -> int:
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * itemsize


@contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build(cfg: dict, device: str, dtype: torch.dtype, seed: int):
    """A random-weight LlamaForCausalLM created in ``dtype`` on ``device`` (never materialised in
    float32 on the host)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**cfg, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    with default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLM(config)
    model.eval().requires_grad_(False)
    p = next(model.parameters())
    if p.dtype != dtype or p.device.type != torch.device(device).type:
        raise RuntimeError(f"the model was created in {p.dtype} on {p.device}, not {dtype} on {device}")
    return model


def free_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:  # MemAvailable counts the page cache the kernel would give back
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def make_sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        dev = torch.device(device)
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def bench(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int, iters: int) -> dict:
    """Seconds per call of ``fn``: the median (and range) over ``repeats`` samples of ``iters`` calls,
    synchronised before and after each sample, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    return {"s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


def free_memory(device: str) -> None:
    """Collect the cycles that hold device memory (a static step's graphs refer to their loop)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- standalone model costs


def engine(kind: str, model):
    """The decoding object our generator runs ``model`` with, by kind (see ENGINES)."""
    from speculate.domains.text.models.kv_cache import CachedModel
    from speculate.domains.text.models.lean_llama import LeanLlama

    if kind == "cached":
        return CachedModel(model)
    lm = LeanLlama(model)
    if kind == "static":
        lm.use_static()
    return lm


@torch.inference_mode()
def time_engine(kind: str, model, B: int, ctx: int, widths: list[int], args, sync) -> dict:
    """Seconds per forward of ``W`` new tokens per row after a ``ctx``-token prefix, for each width."""
    V = model.config.vocab_size
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(B * 1000 + ctx)
    prompt = torch.randint(0, V, (B, ctx), generator=g).to(dev)
    out = {}
    if kind == "transformers":  # plain decoding: the model's own forward and DynamicCache
        from speculate.domains.text.models.transformers_api import cache_kwarg, output_cache

        cache = output_cache(model.model(input_ids=prompt, use_cache=True))  # no [B, ctx, V] logits
        for W in widths:
            x = torch.randint(0, V, (B, W), generator=g).to(dev)

            def step(x=x, W=W):
                model(input_ids=x, use_cache=True, **{cache_kwarg(model): cache})
                try:
                    cache.crop(-W)  # back to the prefix (a negative count works in 4.x and 5.x)
                except Exception:  # an older Cache API: the context grows by W per call, negligibly
                    pass

            out[W] = bench(step, sync, args.warmup, args.repeats, args.iters)
        del cache
        return out
    lm = engine(kind, model)
    lm.reset(B, ctx + max(widths) + 2)
    start = np.zeros(B, np.int64)
    lm.forward(prompt, start, last_only=True)
    lm.keep(np.full(B, ctx, np.int64))
    start = lm.length.copy()
    for W in widths:  # each call writes the same slots ctx .. ctx+W-1: the cache never grows
        x = torch.randint(0, V, (B, W), generator=g).to(dev)
        out[W] = bench(lambda x=x: lm.forward(x, start), sync, args.warmup, args.repeats, args.iters)
    if kind == "static":
        lm.use_static(False)  # drops the recorded graphs and the buffers they read
    lm.release()
    return out


def generator_engines(target, draft, conf: dict) -> dict[str, str]:
    """The engines a generator of this configuration really runs: with cuda_graphs=True, a model
    whose static step fails the generator's cache check keeps the general one."""
    from speculate.domains.text import SpeculativeGenerator

    engines = {"target": conf["target"], "draft": conf["draft"]}
    if conf["cuda_graphs"]:
        static = SpeculativeGenerator(target, draft, lookahead=1, cuda_graphs=True).static_models
        engines = {"target": "static" if "target" in static else "cached",
                   "draft": "static" if "draft" in static else "lean"}
    return engines


# ----------------------------------------------------------------------------- our per-round overhead


class ForwardTimer:
    """Wraps an object's ``forward`` (a CachedModel or LeanLlama of a generator) with synchronised
    timers; ``calls``: (width, seconds) of every call since the last ``clear``."""

    def __init__(self, lm, sync: Callable[[], None]) -> None:
        self.lm, self.sync, self.calls = lm, sync, []
        self.orig = lm.forward

    def __enter__(self) -> ForwardTimer:
        def timed(tokens, *a, **kw):
            self.sync()
            t0 = time.perf_counter()
            out = self.orig(tokens, *a, **kw)
            self.sync()
            self.calls.append((int(tokens.shape[1]), time.perf_counter() - t0))
            return out

        self.lm.forward = timed  # an instance attribute: the class's method comes back on exit
        return self

    def __exit__(self, *exc) -> None:
        del self.lm.forward

    def in_rounds(self, prefill_width: int) -> tuple[float, int]:
        """Seconds and count of the calls made by the rounds (the prefill's block is left out)."""
        calls = [t for w, t in self.calls if w != prefill_width]
        return sum(calls), len(calls)


def measure_overhead(target, draft, conf: dict, k: int, B: int, ctx: int, args, sync) -> dict:
    from speculate.domains.text import SpeculativeGenerator

    on = {"auto": None, "on": True, "off": False}[args.on_device]
    gen = SpeculativeGenerator(target, draft, lookahead=k, verify=args.verify, cuda_graphs=conf["cuda_graphs"],
                               verify_on_device=on)
    V = target.config.vocab_size
    dev = next(target.parameters()).device
    g = torch.Generator().manual_seed(7 + B)
    ids = torch.randint(0, V, (B, ctx), generator=g).to(dev)

    def run():
        sync()
        out = gen.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=[], rng=args.seed)
        sync()
        s = out.stats
        return out, s, s.draft_time + s.target_time + s.verify_time + s.commit_time

    run()  # warm-up: allocations, graph captures, the generator's first-call checks
    plain, wrapped = [], []
    for _ in range(args.repeats):
        out, s, rt = run()
        plain.append({"round_s": rt / s.rounds, "wall_per_round_s": (out.wall_time - out.prefill_time) / s.rounds,
                      "rounds": s.rounds, "draft_steps": s.draft_calls / s.rounds, "alpha": s.alpha})
        with ForwardTimer(gen._target_lm, sync) as tt, ForwardTimer(gen.draft.lm, sync) as td:
            out, s, rt = run()
        t_fwd, t_n = tt.in_rounds(ctx - 1)
        d_fwd, d_n = td.in_rounds(ctx - 1)
        if t_n != s.target_calls or d_n != s.draft_calls:
            raise RuntimeError(f"forward calls in the rounds: target {t_n} (stats: {s.target_calls}), "
                               f"draft {d_n} (stats: {s.draft_calls})")
        wrapped.append({"round_s": rt / s.rounds, "forward_s": (t_fwd + d_fwd) / s.rounds,
                        "target_call_s": t_fwd / t_n, "draft_step_s": d_fwd / d_n, "rounds": s.rounds})
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    fwd = med(wrapped, "forward_s")
    res = {
        "k": k, "k_mean": med(plain, "draft_steps"), "rounds": med(plain, "rounds"),
        "alpha_random_weights": med(plain, "alpha"),
        "round_s": med(plain, "round_s"), "wall_per_round_s": med(plain, "wall_per_round_s"),
        "forward_s": fwd, "target_call_s": med(wrapped, "target_call_s"),
        "draft_step_in_loop_s": med(wrapped, "draft_step_s"),
        "wrapped_round_s": med(wrapped, "round_s"),
        "overhead_s": med(plain, "round_s") - fwd,
        "overhead_in_run_s": statistics.median(w["round_s"] - w["forward_s"] for w in wrapped),
        "overhead_with_setup_s": med(plain, "wall_per_round_s") - fwd,
        "static_models": list(gen.static_models),
        "on_device": bool(gen.verify_on_device if gen.verify_on_device is not None else dev.type == "cuda"),
    }
    res["overhead_fraction_of_verify"] = res["overhead_s"] / res["target_call_s"]
    return res  # the generator (its static buffers and graphs) goes with this frame


def fit_overhead(points: list[dict], key: str = "overhead_s") -> tuple[float, float]:
    """Least squares ``o = a + b k`` over the measured (mean drafts per round, ``key``) points."""
    ks = np.array([p["k_mean"] for p in points], float)
    os_ = np.array([p[key] for p in points], float)
    if len(points) < 2 or np.ptp(ks) == 0:
        return float(os_.mean()), 0.0
    b, a = np.polyfit(ks, os_, 1)
    return float(a), float(b)


# ----------------------------------------------------------------------------- the speed model


def speed_model(T1: float, d: float, scoring: dict[int, float], a: float, b: float, alphas: list[float]) -> dict:
    """c, r(k), o(k)/T1 and the predicted speedups E / (k c + r(k) + o(k) / T1) for k in KS."""
    c = d / T1
    r = [scoring[k + 1] / T1 for k in KS]
    o = [(a + b * k) / T1 for k in KS]
    sp = {str(al): [theory.expected_tokens(al, k) / (k * c + r[i] + o[i]) for i, k in enumerate(KS)]
          for al in alphas}
    best = {al: {"k": KS[int(np.argmax(v))], "speedup": max(v)} for al, v in sp.items()}
    return {"c": c, "r": r, "overhead_ratio": o, "speedup": sp, "best_k": best}


def measure_batch(target, draft, B: int, ctx: int, args, sync, deadline: float) -> dict:
    """Everything at one batch size: standalone costs, overheads per configuration, the speed model."""
    widths = [k + 1 for k in [0, *KS]]
    costs: dict[str, dict] = {}
    t0 = time.perf_counter()
    out: dict[str, Any] = {"batch": B, "configs": {}, "skipped": []}
    try:  # the reference: plain transformers decoding
        costs["transformers"] = {"target": time_engine("transformers", target, B, ctx, [1], args, sync),
                                 "draft": time_engine("transformers", draft, B, ctx, [1], args, sync)}
    except Exception as e:
        out["transformers_error"] = f"{type(e).__name__}: {e}"
        print(f"  batch {B} transformers reference: FAILED: {out['transformers_error']}", flush=True)
    for name, conf in CONFIGS.items():
        if name not in args.configs:
            continue
        if time.perf_counter() > deadline:
            out["skipped"].append(f"{name}: time budget (--max-seconds) spent")
            continue
        rec: dict[str, Any] = {}
        try:
            engines = generator_engines(target, draft, conf)
            rec["engines"] = engines
            for role, model, ws in (("target", target, widths), ("draft", draft, [1])):
                kind = engines[role]
                if role not in costs.setdefault(kind, {}):
                    costs[kind][role] = time_engine(kind, model, B, ctx, ws, args, sync)
                    free_memory(args.device)
            T1 = costs[engines["target"]]["target"][1]["s"]
            d = costs[engines["draft"]]["draft"][1]["s"]
            scoring = {W: v["s"] for W, v in costs[engines["target"]]["target"].items()}
            rec.update(T1_s=T1, draft_step_s=d, scoring_s=[scoring[k + 1] for k in KS])
            points = []
            for k in args.overhead_k:
                if time.perf_counter() > deadline:
                    out["skipped"].append(f"{name} overhead at k={k}: time budget (--max-seconds) spent")
                    continue
                p = measure_overhead(target, draft, conf, k, B, ctx, args, sync)
                free_memory(args.device)
                p["overhead_vs_standalone_s"] = p["round_s"] - (p["k_mean"] * d + scoring[k + 1])
                points.append(p)
                print(f"  batch {B} {name} k={k}: round {p['round_s'] * 1e3:.2f} ms, forwards "
                      f"{p['forward_s'] * 1e3:.2f} ms, overhead {p['overhead_s'] * 1e3:.3f} ms = "
                      f"{100 * p['overhead_fraction_of_verify']:.1f}% of the verification call", flush=True)
            rec["overhead"] = points
            if points:
                a, b = fit_overhead(points)
                rec["overhead_fit"] = {"a_s": a, "b_s_per_draft": b}
                rec.update(speed_model(T1, d, scoring, a, b, args.alphas))
                for p in points:  # the model against the measured round: k d + s(k) + o(k)
                    p["predicted_round_s"] = p["k_mean"] * d + scoring[p["k"] + 1] + a + b * p["k_mean"]
                # anchored: o(k) fitted to round - standalone forwards, which also takes in what the
                # loop's forwards cost above the standalone ones (ragged rows' masks, 2-token draft steps)
                a2, b2 = fit_overhead(points, "overhead_vs_standalone_s")
                anch = speed_model(T1, d, scoring, a2, b2, args.alphas)
                rec["anchored"] = {"overhead_fit": {"a_s": a2, "b_s_per_draft": b2},
                                   "overhead_ratio": anch["overhead_ratio"], "speedup": anch["speedup"],
                                   "best_k": anch["best_k"]}
                if "transformers" in costs:
                    rec["T1_transformers_over_T1"] = costs["transformers"]["target"][1]["s"] / T1
            rec["static_models"] = points[0]["static_models"] if points else []
        except Exception as e:  # e.g. CUDA graphs failing for these models: say so, go on
            import traceback

            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-3000:]
            print(f"  batch {B} {name}: FAILED: {rec['error']}", flush=True)
            free_memory(args.device)
        out["configs"][name] = rec
    out["costs"] = {kind: {role: {str(W): v for W, v in per.items()} for role, per in roles.items()}
                    for kind, roles in costs.items()}
    if "transformers" in costs:
        ref = costs["transformers"]
        out["transformers_T1_s"] = ref["target"][1]["s"]
        out["transformers_c"] = ref["draft"][1]["s"] / ref["target"][1]["s"]
    out["seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- report


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}" if abs(x) < 0.01 else f"{x * 1e3:.2f}"


def goals(res: dict) -> list[str]:
    out = []
    for run in res["runs"]:
        for b in run["batches"]:
            if b["batch"] != 1:
                continue
            for name, rec in b["configs"].items():
                if "error" in rec or not rec.get("overhead"):
                    out.append(f"{run['preset']}, batch 1, {name}: no overhead measured "
                               f"({rec.get('error', 'skipped')})")
                    continue
                worst = max(rec["overhead"], key=lambda p: p["overhead_fraction_of_verify"])
                fr = ", ".join(f"k={p['k']}: {100 * p['overhead_fraction_of_verify']:.1f}% "
                               f"({_ms(p['overhead_s'])} ms of {_ms(p['target_call_s'])} ms)"
                               for p in rec["overhead"])
                if run["preset"] == "1b":
                    ok = worst["overhead_fraction_of_verify"] <= GOAL
                    verdict = (f"goal <= {100 * GOAL:.0f}% of the 1B target's verification call: "
                               f"{'met' if ok else 'NOT met'}" + ("" if res["device"].startswith("cuda")
                                                                   else " (the goal is for an H100)"))
                else:
                    verdict = "no goal for this preset (the goal is for the 1b preset on an H100)"
                out.append(f"{run['preset']}, batch 1, {name}: per-round overhead / verification call: {fr}; "
                           f"{verdict}")
    return out


def markdown(res: dict) -> str:
    L = [f"# Real-size speed model ({', '.join(r['preset'] for r in res['runs']) or 'nothing run'})", "",
         f"Command: `{res['command']}`", "",
         f"Machine: {describe(res['machine'])}; device {res['device']}"
         + (f" ({res['gpu']})" if res.get("gpu") else "")
         + f", {res['dtype']}; torch {res['torch']}, transformers {res['transformers']}.", "",
         f"Random-weight Llama models; context {res['context_note']} prompt tokens in the KV cache; "
         f"overheads from {res['new_tokens_note']} new tokens per row, `verify={res['verify']!r}`, drafting and "
         f"verification on the device: {res['on_device']}; timings: "
         f"median of {res['repeats']} samples ({res['iters']} calls each for the standalone costs), "
         f"after {res['warmup']} warm-up calls, synchronised. Acceptance of random weights means "
         "nothing: the speedups are predictions at the given alphas.", "",
         "## Models", "", "| preset | role | hidden | layers | heads / kv | intermediate | vocab | tied | "
         "parameters |", "|---|---|---|---|---|---|---|---|---|"]
    for p, m in res["models"].items():
        for role in ("target", "draft"):
            c = m[role]
            L.append(f"| {p} | {role} | {c['hidden_size']} | {c['num_hidden_layers']} | "
                     f"{c['num_attention_heads']} / {c['num_key_value_heads']} | {c['intermediate_size']} | "
                     f"{c['vocab_size']} | {c['tie_word_embeddings']} | {c['parameters'] / 1e6:.1f}M |")
    L += ["", "Engines: " + "; ".join(f"`{k}`: {v}" for k, v in ENGINES.items()) + ". Configurations of "
          "our generator: " + "; ".join(f"`{n}`: target `{c['target']}`, draft `{c['draft']}`"
                                       for n, c in CONFIGS.items()) + ".", "",
          "How the overhead is measured: " + res["overhead_method"], ""]
    for run in res["runs"]:
        for b in run["batches"]:
            L += [f"## {run['preset']}, batch {b['batch']} ({b['seconds']:.0f} s)", ""]
            L += ["Standalone costs (ms per call; T1 = the target's one-token step, d = the draft's; "
                  "r(k) = (k+1)-token scoring / T1):", "",
                  "| engine | T1 | d | c = d / T1 | " + " | ".join(f"r({k})" for k in KS) + " |",
                  "|---|---|---|---|" + "---|" * len(KS)]
            for kind, roles in b["costs"].items():
                t, d = roles.get("target", {}), roles.get("draft", {})
                T1 = t["1"]["s"] if "1" in t else None
                D = d["1"]["s"] if "1" in d else None
                rs = " | ".join(f"{t[str(k + 1)]['s'] / T1:.2f}" if T1 and str(k + 1) in t else "" for k in KS)
                c = f"{D / T1:.3f}" if T1 and D else ""
                L.append(f"| {kind} | {_ms(T1) if T1 else ''} | {_ms(D) if D else ''} | {c} | {rs} |")
            L += ["", "Per-round overhead (ms; `verify call` = the target's scoring call in the loop; `in run` = "
                  "within the synchronised runs, an upper bound; `vs standalone` = round - (k d + s(k)) from "
                  "the standalone costs; `with setup` = (wall - prefill) / rounds - forwards):", "",
                  "| config | k | drafts/round | rounds | round | forwards | verify call | draft step in loop | "
                  "overhead | % of verify call | in run | vs standalone | with setup |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for name, rec in b["configs"].items():
                if "error" in rec:
                    L.append(f"| {name} | failed: `{short_error(rec['error'], 300)}` |||||||||||")
                    continue
                for p in rec.get("overhead", []):
                    L.append(f"| {name} | {p['k']} | {p['k_mean']:.2f} | {p['rounds']:.0f} | {_ms(p['round_s'])} | "
                             f"{_ms(p['forward_s'])} | {_ms(p['target_call_s'])} | "
                             f"{_ms(p['draft_step_in_loop_s'])} | {_ms(p['overhead_s'])} | "
                             f"{100 * p['overhead_fraction_of_verify']:.1f}% | {_ms(p['overhead_in_run_s'])} | "
                             f"{_ms(p['overhead_vs_standalone_s'])} | {_ms(p['overhead_with_setup_s'])} |")
            for name, rec in b["configs"].items():
                if "speedup" not in rec:
                    continue
                fit = rec["overhead_fit"]
                ratio = (f"; x {rec['T1_transformers_over_T1']:.2f} for the speedup over plain transformers "
                         "decoding" if "T1_transformers_over_T1" in rec else "")
                L += ["", f"Predicted speedup, `{name}` (target `{rec['engines']['target']}`, draft "
                      f"`{rec['engines']['draft']}`; c = {rec['c']:.3f}, o(k) = {_ms(fit['a_s'])} + "
                      f"{_ms(fit['b_s_per_draft'])} k ms, T1 = {_ms(rec['T1_s'])} ms; static steps: "
                      f"{', '.join(rec['static_models']) or 'none'}; over plain decoding in the same engine"
                      f"{ratio}):",
                      "", "| k | r(k) | o(k) / T1 | " + " | ".join(f"alpha {a}" for a in rec["speedup"]) + " |",
                      "|---|---|---|" + "---|" * len(rec["speedup"])]
                for i, k in enumerate(KS):
                    L.append(f"| {k} | {rec['r'][i]:.2f} | {rec['overhead_ratio'][i]:.3f} | "
                             + " | ".join(f"{v[i]:.2f}" for v in rec["speedup"].values()) + " |")
                L.append("| best k | | | " + " | ".join(f"{v['k']} ({v['speedup']:.2f})"
                                                         for v in rec["best_k"].values()) + " |")
                an = rec["anchored"]
                L += ["", "Model check (measured round / k d + s(k) + o(k)): " + ", ".join(
                    f"k={p['k']}: {p['round_s'] / p['predicted_round_s']:.2f}" for p in rec["overhead"])
                    + ". Anchored variant, o(k) fitted to round - (k d + s(k)) instead ("
                    f"{_ms(an['overhead_fit']['a_s'])} + {_ms(an['overhead_fit']['b_s_per_draft'])} k ms: "
                    "it also holds what the loop's forwards cost above the standalone ones, such as ragged "
                    "rows' attention masks and the draft's 2-token first steps): best k " + ", ".join(
                        f"alpha {al}: {v['k']} ({v['speedup']:.2f})" for al, v in an["best_k"].items()) + "."]
            for s in b["skipped"]:
                L += ["", f"Skipped: {s}."]
            L.append("")
    for s in res["skipped"]:
        L.append(f"Skipped: {s}.")
    L += ["", "## Goals", ""] + [f"- {g}" for g in res["goals"]]
    if not res["device"].startswith("cuda"):
        L += ["", "These are CPU timings (a smoke test of the script); the speed model is meant for a GPU: "
              "run it with `--device cuda`."]
    return "\n".join(L) + "\n"



OVERHEAD_METHOD = (
    "the generator decodes the same rounds (same seed, EOS stops nothing) alternately as is and with "
    "every forward call of its target and draft objects wrapped in synchronised timers; overhead per round "
    "= the round time of the runs as is (draft + target + verify + commit time from its stats, over the "
    "rounds) minus the forward time per round of the wrapped runs (the draft steps and the target's scoring "
    "call; prefill excluded). A forward is our cache wrapper's call (CachedModel.forward: the transformers "
    "forward with our cache and masks; LeanLlama.forward: the lean step or the CUDA graph replay): "
    "everything else (sampling the drafts, probabilities, verification, transfers, commit, bookkeeping) is "
    "overhead. Fitted as o(k) = a + b k over the measured lookaheads for the speed model.")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def _alpha(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"alpha must lie in [0, 1), got {text!r}")
    return v


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", nargs="+", choices=list(PRESETS), default=None,
                    help="model pairs (default: 1b 8b on CUDA, tiny on a CPU); 8b runs only with the memory")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on CUDA, float32 on a CPU")
    ap.add_argument("--batch", type=_positive_int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=_positive_int, default=None,
                    help="prompt tokens in the KV cache (default: 512; 32 for tiny)")
    ap.add_argument("--new-tokens", type=_positive_int, default=None,
                    help="new tokens per row of each overhead run (default: 48; 16 for tiny)")
    ap.add_argument("--overhead-k", type=_positive_int, nargs="+", default=[1, 4, 8],
                    help=f"lookaheads at which the overhead is measured (within {KS[0]}..{KS[-1]})")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--verify", default="block", choices=["block", "token"])
    ap.add_argument("--on-device", default="auto", choices=["auto", "on", "off"],
                    help="draft and verify where the logits are (auto: on CUDA, the generator's default)")
    ap.add_argument("--alphas", type=_alpha, nargs="+", default=ALPHAS)
    ap.add_argument("--repeats", type=_positive_int, default=3)
    ap.add_argument("--iters", type=_positive_int, default=10, help="calls per standalone timing sample")
    ap.add_argument("--warmup", type=_positive_int, default=3)
    ap.add_argument("--threads", type=_positive_int, default=1, help="torch threads on a CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=200.0,
                    help="skip what is left (and say so) once this much time has passed")
    ap.add_argument("--out", default=None, help="path of the results without suffix "
                    "(default: results/gpu_speed_model on CUDA, results/speed_model_cpu on a CPU)")
    args = ap.parse_args(argv)
    bad_k = [k for k in args.overhead_k if k not in KS]
    if bad_k:
        ap.error(f"--overhead-k: lookaheads must lie in {KS[0]}..{KS[-1]}, got {bad_k}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA device is available here (use --device cpu --preset tiny)")
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    cuda = args.device.startswith("cuda")
    args.preset = args.preset or (["1b", "8b"] if cuda else ["tiny"])
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    if args.context is not None and args.context < 2 * (KS[-1] + 2):
        ap.error(f"--context must be >= {2 * (KS[-1] + 2)} (the prefill must be wider than any round's block)")
    if args.new_tokens is not None and args.new_tokens < max(args.overhead_k) + 1:
        ap.error(f"--new-tokens must be > the largest --overhead-k ({max(args.overhead_k)})")
    return args


def run_preset(preset: str, ctx: int, n_new: int, sizes: dict, args, dtype, sync, deadline: float,
               res: dict, save: Callable[[], None]) -> None:
    """Build one preset's pair and measure it at every batch size (results saved after each)."""
    p = PRESETS[preset]
    t0 = time.perf_counter()
    target = build(p["target"], args.device, dtype, args.seed)
    draft = build(p["draft"], args.device, dtype, args.seed + 1)
    res["models"][preset] = {
        role: {**p[role], "parameters": sum(x.numel() for x in m.parameters()), "parameters_formula": sizes[role]}
        for role, m in (("target", target), ("draft", draft))}
    print(f"{preset}: target {res['models'][preset]['target']['parameters'] / 1e6:.1f}M, draft "
          f"{res['models'][preset]['draft']['parameters'] / 1e6:.1f}M parameters, built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    run: dict[str, Any] = {"preset": preset, "context": ctx, "new_tokens": n_new, "batches": []}
    res["runs"].append(run)
    sub = argparse.Namespace(**{**vars(args), "new_tokens": n_new})
    for B in args.batch:
        if time.perf_counter() > deadline:
            res["skipped"].append(f"preset {preset} batch {B}: time budget (--max-seconds {args.max_seconds:g}) spent")
            print(res["skipped"][-1], flush=True)
            continue
        run["batches"].append(measure_batch(target, draft, B, ctx, sub, sync, deadline))
        save()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    deadline = t_start + args.max_seconds
    cuda = args.device.startswith("cuda")
    threads = torch.get_num_threads()
    import transformers

    dtype = getattr(torch, args.dtype)
    sync = make_sync(args.device)
    env = machine(args.device)
    if argv is not None:  # called as main([...]) (tests, other scripts): the arguments it was given
        env["command"] = command(argv, __file__)
    if not cuda:  # after machine(): starting numba's threads (numba.get_num_threads) resets torch's
        torch.set_num_threads(args.threads)
        env["torch_threads"] = torch.get_num_threads()
    res: dict[str, Any] = {
        "device": args.device, "gpu": env.get("gpu"), "dtype": args.dtype, "torch": torch.__version__,
        "transformers": transformers.__version__, "machine": env, "command": env["command"],
        "presets": args.preset, "batches": args.batch, "ks": KS, "alphas": args.alphas,
        "overhead_k": args.overhead_k, "verify": args.verify, "on_device": {"auto": cuda, "on": True, "off": False}[
            args.on_device], "repeats": args.repeats, "iters": args.iters,
        "warmup": args.warmup, "max_seconds": args.max_seconds, "engines": ENGINES, "configs": CONFIGS,
        "overhead_method": OVERHEAD_METHOD, "models": {}, "runs": [], "skipped": [], "goals": [],
    }
    res["context_note"] = "/".join(dict.fromkeys(str(args.context or PRESETS[q]["context"]) for q in args.preset))
    res["new_tokens_note"] = "/".join(dict.fromkeys(str(args.new_tokens or PRESETS[q]["new_tokens"])
                                                   for q in args.preset))
    out = Path(args.out) if args.out else None
    name = out.name if out else ("gpu_speed_model" if cuda else f"speed_model_{args.device.split(':')[0]}")

    def save() -> None:
        res["goals"] = goals(res)
        res["seconds"] = time.perf_counter() - t_start
        write(name, res, markdown(res), folder=out.parent if out else None)

    try:
        for preset in args.preset:
            p = PRESETS[preset]
            ctx = args.context or p["context"]
            n_new = args.new_tokens or p["new_tokens"]
            sizes = {role: n_params(p[role]) for role in ("target", "draft")}
            need = (sum(sizes.values()) * dtype.itemsize + max(args.batch) * (ctx + n_new + 160)
                    * sum(kv_bytes_per_token(p[r], dtype.itemsize) for r in ("target", "draft")) * 4
                    + (4 << 30 if cuda else 1 << 30))
            free_memory(args.device)
            free = free_bytes(args.device)
            if need > free:
                res["skipped"].append(f"preset {preset}: needs about {need / 2**30:.1f} GiB, "
                                      f"{free / 2**30:.1f} GiB free on {args.device}")
                print(res["skipped"][-1], flush=True)
                continue
            if time.perf_counter() > deadline - (20 if preset == "8b" else 0):
                res["skipped"].append(f"preset {preset}: time budget (--max-seconds {args.max_seconds:g}) spent")
                print(res["skipped"][-1], flush=True)
                continue
            try:
                run_preset(preset, ctx, n_new, sizes, args, dtype, sync, deadline, res, save)
            except Exception as e:  # out of memory building the 8B, say: record it, go on
                res["skipped"].append(f"preset {preset}: failed: {type(e).__name__}: {short_error(str(e), 300)}")
                print(res["skipped"][-1], flush=True)
            free_memory(args.device)
        save()
        if not cuda and torch.get_num_threads() != args.threads:
            print(f"warning: torch used {torch.get_num_threads()} threads by the end, not {args.threads}")
    finally:
        torch.set_num_threads(threads)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
