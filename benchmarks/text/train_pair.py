"""Train a Llama target + distilled draft on the Python standard library's sources (byte level).

    python benchmarks/text/train_pair.py --size small   # -> domains/text/models (embedded)
    python benchmarks/text/train_pair.py --size large   # -> benchmarks/text/models/large
    python benchmarks/text/train_pair.py --size mamba   # -> benchmarks/text/models/mamba (state-space)

Stages: (1) train the target as a language model; (2) pre-train the draft as a language model;
(3) distil the draft toward the target with ``speculate.domains.text.training.distill`` (optionally trying several
divergences from the same pre-trained draft and keeping the one that raises acceptance most);
(4) save both in Hugging Face format (float16 where the size budget needs it), reload them from
disk and measure what was saved: held-out loss (nats and bits per byte), acceptance
``alpha = E[sum_x min(p, q)]`` at temperature 1 before and after distillation, batch-1 forward
latency and the cost ratio c. Results go to benchmarks/results/text_train[_large].{json,md}.
Everything runs on 1 CPU thread (``--threads``) and is seeded.

The ``mamba`` preset trains a ``MambaForCausalLM`` pair the same way. transformers' Mamba has no
CPU kernels: it runs its torch-only sequential scan, whose backward (one indexing of the
``[B, D, T, N]`` discretised tensors per position, each giving a full-size gradient) dominates a
training step; :func:`mamba_training_scan` swaps in the same arithmetic with ``unbind`` (bitwise the
same outputs and gradients, checked at start; about 6x faster to train). Its batch-1 latencies
are measured through the model's own ``cache_params`` (1 token) and through speculate's
``CachedModel`` (k+1 tokens, the verification call), since a recurrent cache cannot be cropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import RESULTS, describe, machine, relative, write  # noqa: E402
from speculate.domains.text.examples.corpus import load_corpus  # noqa: E402
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer  # noqa: E402
from speculate.domains.text.models.transformers_api import cache_kwarg, output_cache  # noqa: E402
from speculate.domains.text.request.progress import progress_bar  # noqa: E402
from speculate.domains.text.training.distill import (  # noqa: E402
    acceptance_rate,
    cross_entropy,
    distill,
    sample_continuations,
    sample_windows,
)


@dataclass
class ModelSpec:
    layers: int
    dim: int
    heads: int
    mlp: int
    context: int


@dataclass
class MambaSpec:
    layers: int
    dim: int
    state: int
    context: int
    expand: int = 2
    conv: int = 4


@dataclass
class TrainSpec:
    steps: int
    batch: int
    lr: float
    warmup: int
    weight_decay: float = 0.1


@dataclass
class DistillSpec:
    steps: int
    batch: int
    prefix_len: int
    continuation_len: int
    lr: float
    on_policy: float
    divergences: tuple[str, ...]


PRESETS = {
    "small": dict(
        target=ModelSpec(layers=12, dim=128, heads=4, mlp=352, context=256),
        draft=ModelSpec(layers=1, dim=96, heads=3, mlp=256, context=256),
        target_train=TrainSpec(steps=2000, batch=8, lr=2e-3, warmup=100),
        draft_train=TrainSpec(steps=2000, batch=8, lr=3e-3, warmup=50),
        distill=DistillSpec(steps=500, batch=16, prefix_len=128, continuation_len=64, lr=1e-3,
                            on_policy=1.0, divergences=("tv", "fkl")),
        max_mb=dict(target=10.0, draft=1.0),
        out=ROOT / "domains" / "text" / "examples" / "weights",
        results="text_train",
    ),
    "large": dict(
        target=ModelSpec(layers=16, dim=192, heads=6, mlp=512, context=256),
        draft=ModelSpec(layers=1, dim=128, heads=4, mlp=352, context=256),
        target_train=TrainSpec(steps=1000, batch=8, lr=1.5e-3, warmup=100),
        draft_train=TrainSpec(steps=2000, batch=8, lr=3e-3, warmup=50),
        distill=DistillSpec(steps=500, batch=16, prefix_len=128, continuation_len=64, lr=1e-3,
                            on_policy=1.0, divergences=("tv",)),
        max_mb=dict(target=16.0, draft=1.0),
        out=ROOT / "benchmarks" / "text" / "models" / "large",
        results="text_train_large",
    ),
    # A state-space pair (issue 13). Sized for about 25 minutes on one shared CPU thread: measured
    # with the unbind scan (mamba_training_scan) at batch 8 x 128 on a loaded 2-core machine,
    # a training step takes ~1.7 s for 6 x 128 (state 16), ~1.1 s for 4 x 128, ~2.5 s for
    # 6 x 192 (transformers' own scan: ~6-9 s for 4 x 128), and ~0.13 s for the 1 x 64 draft;
    # 6 layers keep the draft cheap relative to the target (c ~ 0.2; per-layer overhead dominates
    # a forward this small). Hence 600 target steps (~17 min), 1500 draft steps (~3 min) and
    # 150 distillation steps on 128-token windows (~2 s per step with the target's forward and
    # the draft's on-policy samples: ~5 min).
    "mamba": dict(
        arch="mamba",
        target=MambaSpec(layers=6, dim=128, state=16, context=128),
        draft=MambaSpec(layers=1, dim=64, state=16, context=128),
        target_train=TrainSpec(steps=600, batch=8, lr=2e-3, warmup=50),
        draft_train=TrainSpec(steps=1500, batch=8, lr=3e-3, warmup=50),
        distill=DistillSpec(steps=150, batch=16, prefix_len=64, continuation_len=64, lr=1e-3,
                            on_policy=1.0, divergences=("tv",)),
        max_mb=dict(target=16.0, draft=4.0),
        out=ROOT / "benchmarks" / "text" / "models" / "mamba",
        results="text_train_mamba",
    ),
}


def llama(spec: ModelSpec):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=spec.dim, intermediate_size=spec.mlp,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads, max_position_embeddings=spec.context,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return LlamaForCausalLM(cfg)


def mamba(spec: MambaSpec):
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=spec.dim, state_size=spec.state,
        num_hidden_layers=spec.layers, expand=spec.expand, conv_kernel=spec.conv,
        tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return MambaForCausalLM(cfg)


def build(spec: ModelSpec | MambaSpec):
    """A freshly initialised model for ``spec`` (Llama or Mamba)."""
    return mamba(spec) if isinstance(spec, MambaSpec) else llama(spec)


def spec_text(c: dict) -> str:
    """``layers x dim (heads, mlp)``, or ``layers x dim (state N, expand E)`` for Mamba."""
    if "state" in c:
        return f"{c['layers']} x {c['dim']} (state {c['state']}, expand {c['expand']})"
    return f"{c['layers']} x {c['dim']} ({c['heads']}, {c['mlp']})"


def _unbind_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None,
                 delta_softplus=False, return_last_state=False, **kwargs):
    """transformers' torch-only ``mamba_selective_scan`` (sequential path), stepping over
    ``unbind`` slices instead of indexing: the same operations in the same order."""
    batch, inner, _ = hidden_states.shape
    dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)  # [b, T, N]
    dA = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # [b, D, T, N]
    dBu = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()
    h = torch.zeros(batch, inner, A.shape[-1], dtype=dtype, device=hidden_states.device)
    ys = []
    for a, b, c in zip(dA.unbind(2), dBu.unbind(2), C.unbind(1), strict=True):
        h = a * h + b
        ys.append(torch.matmul(h.to(dtype), c.unsqueeze(-1))[:, :, 0])
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + hidden_states * D[None, :, None]
    if z is not None:
        y = y * F.silu(z)
    return (y, h) if return_last_state else y


@contextlib.contextmanager
def mamba_training_scan(active: bool = True):
    """Run transformers' Mamba with :func:`_unbind_scan` inside the block (after checking on a
    small model that its logits and gradients are bitwise those of transformers' own scan)."""
    if not active:
        yield
        return
    import transformers.models.mamba.modeling_mamba as mm

    original = mm.mamba_selective_scan
    try:
        grads = []
        for scan in (original, _unbind_scan):
            mm.mamba_selective_scan = scan
            torch.manual_seed(0)
            m = mamba(MambaSpec(layers=2, dim=32, state=8, context=16)).train()
            ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
            logits = m(input_ids=ids[:, :-1], use_cache=False).logits
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
            grads.append([logits.detach()] + [p.grad for p in m.parameters()])
        if not all(torch.equal(a, b) for a, b in zip(*grads, strict=True)):
            raise RuntimeError("the unbind scan does not reproduce transformers' Mamba scan")
        mm.mamba_selective_scan = _unbind_scan
        yield
    finally:
        mm.mamba_selective_scan = original


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def train_lm(model, stream: torch.Tensor, spec: TrainSpec, context: int, seed: int, log) -> list:
    """Next-byte cross-entropy, AdamW, warm-up + cosine to 10%, grad clip 1. Returns the curve."""
    gen = torch.Generator().manual_seed(seed)
    # no decay on vectors, nor on Mamba's A_log and D (its recipe's _no_weight_decay)
    ssm = {n for n, _ in model.named_parameters() if n.endswith(("A_log", ".D"))}
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in ssm]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n in ssm]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=spec.lr,
                            betas=(0.9, 0.95))
    model.train()
    curve, t0, acc = [], time.perf_counter(), 0.0
    bar_cm = progress_bar(spec.steps, "train", unit="step")  # shown on a terminal only
    bar = bar_cm.__enter__()
    for step in range(spec.steps):
        bar.update(1)
        if step < spec.warmup:
            lr = spec.lr * (step + 1) / spec.warmup
        else:
            frac = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
            lr = spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = sample_windows(stream, spec.batch, context + 1, gen)  # [B, T+1]
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.item()
        if (step + 1) % 50 == 0 or step + 1 == spec.steps:
            curve.append((step + 1, acc / (50 if (step + 1) % 50 == 0 else (step + 1) % 50)))
            el = time.perf_counter() - t0
            log(f"  step {step + 1}/{spec.steps} loss {curve[-1][1]:.4f} nats "
                f"lr {lr:.2e} {el:.0f}s ({el / (step + 1):.2f}s/step)")
            acc = 0.0
    bar_cm.__exit__(None, None, None)
    model.eval()
    return curve


def heldout_windows(stream: torch.Tensor, context: int, n: int) -> torch.Tensor:
    """``n`` evenly spaced, non-overlapping windows ``[n, context]`` of the held-out stream."""
    n = min(n, stream.numel() // context)
    starts = torch.linspace(0, stream.numel() - context, n).long()
    return stream[starts[:, None] + torch.arange(context)]


def heldout_loss(model, windows: torch.Tensor, batch: int = 16) -> float:
    tot = 0.0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        tot += cross_entropy(model, w) * w.shape[0]
    return tot / windows.shape[0]


def alpha_on(target, draft, ids: torch.Tensor, start: int, batch: int = 16) -> float:
    tot = 0.0
    for i in range(0, ids.shape[0], batch):
        w = ids[i:i + batch]
        tot += acceptance_rate(target, draft, w, start=start) * w.shape[0]
    return tot / ids.shape[0]


@torch.inference_mode()
def latency_ms(model, n_new: int, prefix: int = 128, reps: int = 200) -> float:
    """Median seconds x 1000 of one batch-1 forward of ``n_new`` tokens on a ``prefix`` cache."""
    ids = torch.randint(0, 256, (1, prefix), generator=torch.Generator().manual_seed(0))
    past = output_cache(model(input_ids=ids, use_cache=True))
    x = ids[:, :n_new]
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        model(input_ids=x, use_cache=True, **{cache_kwarg(model): past})
        ts.append(time.perf_counter() - t)
        past.crop(-n_new)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


@torch.inference_mode()
def latency_ms_recurrent(model, n_new: int, prefix: int = 128, reps: int = 200) -> float:
    """:func:`latency_ms` for a recurrent model (its cache cannot be cropped): one token through
    the model's own ``cache_params`` (the state advances by one token per repetition, which
    does not change the work); ``n_new`` > 1 tokens as speculate's verification call, a
    ``CachedModel`` forward from the prefix's state that is never committed (a free rollback)."""
    from speculate.domains.text.models.kv_cache import CachedModel

    ids = torch.randint(0, 256, (1, prefix), generator=torch.Generator().manual_seed(0))
    x = ids[:, :n_new]
    if n_new == 1:
        cache = model(input_ids=ids, use_cache=True).cache_params

        def call():
            model(input_ids=x, cache_params=cache, use_cache=True)
    else:
        lm = CachedModel(model)
        lm.reset(batch=1, capacity=prefix + n_new)
        lm.forward(ids, np.array([0]))
        lm.keep(np.array([prefix]))

        def call():
            lm.forward(x, np.array([prefix]))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def save(model, folder: Path, max_mb: float, tok: ByteTokenizer) -> dict:
    """Save in float32, or float16 if float32 exceeds ``max_mb``; config says load as float32."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    dtype = torch.float32 if 4 * n_params(model) / 1e6 <= max_mb * 0.995 else torch.float16
    copy = llama_like(model) if isinstance(model, _llama_class()) else type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    copy.to(dtype).save_pretrained(folder)
    cfg_file = folder / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["dtype"] = "float32"
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(folder)
    mb = (folder / "model.safetensors").stat().st_size / 1e6
    if mb > max_mb:
        raise RuntimeError(f"{folder} weighs {mb:.2f} MB > {max_mb} MB")
    return {"stored_dtype": str(dtype).removeprefix("torch."), "safetensors_mb": round(mb, 3),
            "folder_mb": round(sum(f.stat().st_size for f in folder.iterdir()) / 1e6, 3)}


def _llama_class():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM


def llama_like(model):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(model.config)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(PRESETS), default="small")
    ap.add_argument("--out", type=Path, default=None, help="folder for target/ and draft/")
    ap.add_argument("--results", default=None, help="results basename in --results-dir")
    ap.add_argument("--results-dir", type=Path, default=RESULTS,
                    help="folder of the results (default benchmarks/results, or $SPECULATE_BENCH_RESULTS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reuse-target", action="store_true",
                    help="load the target already in --out instead of training it")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply all step counts (e.g. 0.02 for a smoke run)")
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--draft", default=None, metavar="L,D,H,MLP",
                    help="override the draft's layers, width, heads, MLP width (Mamba: L,D,STATE)")
    ap.add_argument("--divergences", default=None, help="comma-separated, e.g. tv,fkl")
    ap.add_argument("--distill-steps", type=int, default=None)
    ap.add_argument("--render", action="store_true",
                    help="only recompute the theory section and the Markdown from the JSON")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in
                                   ["benchmarks/text/train_pair.py", *argv])

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    P = PRESETS[args.size]
    out = args.out or P["out"]
    results = args.results or P["results"]
    res_dir = args.results_dir
    if args.render:
        report = with_theory(json.loads((res_dir / f"{results}.json").read_text()))
        report.setdefault("machine", None)  # a record from before machine records: not this machine's
        write(results, report, markdown(report), folder=res_dir)
        return report
    env = machine()
    tspec, dspec = P["target"], P["draft"]
    is_mamba = P.get("arch", "llama") == "mamba"
    if args.draft and is_mamba:
        layers, dim, state = (int(x) for x in args.draft.split(","))
        dspec = MambaSpec(layers, dim, state, dspec.context)
    elif args.draft:
        layers, dim, heads, mlp = (int(x) for x in args.draft.split(","))
        dspec = ModelSpec(layers, dim, heads, mlp, dspec.context)

    def scaled(s: TrainSpec) -> TrainSpec:
        return TrainSpec(max(1, round(s.steps * args.scale)), s.batch, s.lr,
                         min(s.warmup, max(1, round(s.steps * args.scale) // 4)), s.weight_decay)

    tt, dt, ds = scaled(P["target_train"]), scaled(P["draft_train"]), P["distill"]
    ds = DistillSpec(**{**asdict(ds), "steps": max(1, round(
        (args.distill_steps or ds.steps) * args.scale))})
    if args.divergences:
        ds.divergences = tuple(args.divergences.split(","))
    keep_log = (ROOT / "scratch").is_dir() and args.results_dir == ROOT / "benchmarks" / "results"
    logf = open(ROOT / "scratch" / f"{results}.log", "a") if keep_log else None

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if logf:
            logf.write(line + "\n")
            logf.flush()

    log(f"command: {command}")
    train, held = load_corpus("train"), load_corpus("heldout")
    tr_stream = torch.from_numpy(train.token_stream())
    he_stream = torch.from_numpy(held.token_stream())
    log(f"corpus: python {train.python_version}, train {len(train.paths)} files "
        f"{train.n_bytes / 1e6:.2f} MB, heldout {len(held.paths)} files "
        f"{held.n_bytes / 1e6:.2f} MB")
    tok = ByteTokenizer()
    timing: dict[str, float] = {}

    # (1) target
    torch.manual_seed(args.seed)
    curves = {}
    if args.reuse_target:
        target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
        log(f"target: reused from {out / 'target'}")
        prev = res_dir / f"{results}.json"
        prior = json.loads(prev.read_text()) if prev.is_file() else {}
        for key in ("target_train_s", "target_train_cpu_s"):
            timing[key] = prior.get("timing", {}).get(key, float("nan"))
        curves["target"] = prior.get("curves", {}).get("target", [])
    else:
        target = build(tspec)
        log(f"target: {tspec} {n_params(target) / 1e6:.3f} M params; training {tt}")
        t0, c0 = time.perf_counter(), time.process_time()
        with mamba_training_scan(is_mamba):
            curves["target"] = train_lm(target, tr_stream, tt, tspec.context, args.seed, log)
        timing["target_train_s"] = time.perf_counter() - t0
        timing["target_train_cpu_s"] = time.process_time() - c0
        save(target, out / "target", P["max_mb"]["target"], tok)
        target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)

    # (2) draft language-model pre-training
    torch.manual_seed(args.seed + 1)
    draft = build(dspec)
    log(f"draft: {dspec} {n_params(draft) / 1e6:.3f} M params; pre-training {dt}")
    t0, c0 = time.perf_counter(), time.process_time()
    with mamba_training_scan(is_mamba):
        curves["draft_pretrain"] = train_lm(draft, tr_stream, dt, dspec.context, args.seed + 1,
                                            log)
    timing["draft_pretrain_s"] = time.perf_counter() - t0
    timing["draft_pretrain_cpu_s"] = time.process_time() - c0

    # evaluation states, fixed for every measurement below
    windows = heldout_windows(he_stream, tspec.context, args.eval_windows)  # [N, T]
    g = torch.Generator().manual_seed(args.seed + 7)
    prefixes = sample_windows(he_stream, 64, ds.prefix_len, g)  # [64, P]
    on_target = sample_continuations(target, prefixes, 128, 1.0,
                                     torch.Generator().manual_seed(args.seed + 8))  # [64, P+128]

    def alphas(d) -> dict:
        return {"alpha_heldout_text": alpha_on(target, d, windows, start=0),
                "alpha_target_samples": alpha_on(target, d, on_target, start=ds.prefix_len - 1)}

    before = alphas(draft)
    log(f"draft before distillation: {before}")

    # (3) distillation: every divergence from the same pre-trained draft; keep the best
    pre_state = {k: v.clone() for k, v in draft.state_dict().items()}
    texts = [tr_stream]
    trials = {}
    best = None
    for div in ds.divergences:
        draft.load_state_dict(pre_state)
        t0 = time.perf_counter()
        with mamba_training_scan(is_mamba):
            res = distill(target, draft, texts, divergence=div, steps=ds.steps,
                          batch_size=ds.batch, prefix_len=ds.prefix_len,
                          continuation_len=ds.continuation_len, on_policy=ds.on_policy, lr=ds.lr,
                          eval_texts=[he_stream], eval_batch=32,
                          eval_every=max(1, ds.steps // 6), rng=args.seed + 2, log=log)
        el = time.perf_counter() - t0
        after = alphas(draft)
        log(f"distill {div}: {el:.0f}s {after}")
        trials[div] = {"seconds": el, "history": res.history, "losses_every_10":
                       res.losses[::10], **after}
        if best is None or after["alpha_target_samples"] > trials[best[0]][
                "alpha_target_samples"]:
            best = (div, {k: v.clone() for k, v in draft.state_dict().items()}, el)
    draft.load_state_dict(best[1])
    timing["distill_s"] = sum(t["seconds"] for t in trials.values())
    log(f"keeping the draft distilled with {best[0]}")

    # (4) save, reload what was saved, measure it
    info_t = save(target, out / "target", P["max_mb"]["target"], tok) if not args.reuse_target \
        else _folder_info(out / "target")
    info_d = save(draft, out / "draft", P["max_mb"]["draft"], tok)
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32).eval()
    loss_t, loss_d = heldout_loss(target, windows), heldout_loss(draft, windows)
    draft_pre = build(dspec)
    draft_pre.load_state_dict(pre_state)
    loss_pre = heldout_loss(draft_pre.eval(), windows)
    after = alphas(draft)
    lat = {}
    for name, m in (("target", target), ("draft", draft)):
        for n_new in (1, 5):
            lat[f"{name}_{n_new}tok_ms"] = (latency_ms_recurrent if is_mamba else latency_ms)(
                m, n_new)
    c = lat["draft_1tok_ms"] / lat["target_1tok_ms"]

    def nb(x: float) -> dict:
        return {"nats_per_byte": round(x, 4), "bits_per_byte": round(x / math.log(2), 4)}

    report = {
        "command": command,
        "size": args.size,
        **({"arch": "mamba", "train_scan": "mamba_training_scan (unbind; bitwise transformers' "
            "torch scan)"} if is_mamba else {}),
        "seed": args.seed,
        "out": relative(out),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__,
                        "threads": args.threads, "machine": platform.machine()},
        "machine": env,
        "corpus": {"python_version": train.python_version, "train_files": len(train.paths),
                   "train_bytes": train.n_bytes, "train_sha256": train.digest(),
                   "heldout_files": len(held.paths), "heldout_bytes": held.n_bytes,
                   "heldout_sha256": held.digest()},
        "target": {"config": asdict(tspec), "params": n_params(target), "train": asdict(tt),
                   **info_t},
        "draft": {"config": asdict(dspec), "params": n_params(draft), "pretrain": asdict(dt),
                  **info_d},
        "distill": {**asdict(ds), "kept": best[0], "trials": trials},
        "heldout_loss": {"windows": int(windows.shape[0]), "context": tspec.context,
                         "target": nb(loss_t), "draft_pretrained": nb(loss_pre),
                         "draft": nb(loss_d)},
        "alpha": {"temperature": 1.0, "before_distill": before, "after_distill": after,
                  "definition": "mean over states of sum_x min(p(x), q(x)); heldout_text: "
                  "every position of the held-out windows; target_samples: 64 held-out "
                  "prefixes of 128 bytes continued by 128 bytes sampled from the target"},
        "latency_batch1": {**{k: round(v, 4) for k, v in lat.items()}, "c": round(c, 4),
                           "note": ("median of 200 forwards after a 128-token prefix, 1 thread: "
                                    "1 token through the model's own cache_params, 5 tokens as "
                                    "speculate's CachedModel verification call; c = draft / "
                                    "target for 1 token") if is_mamba else
                           "median of 200 HF forwards with a 128-token KV cache, "
                           "1 thread; c = draft / target for 1 token"},
        "timing": {k: round(v, 1) for k, v in timing.items()},
        "curves": curves,
    }
    report = with_theory(report)
    write(results, report, markdown(report), folder=res_dir)
    log(f"wrote {res_dir / results}.json/.md")
    return report


def with_theory(report: dict) -> dict:
    """Expected speedup (speculate.theory) at the measured alpha (target samples) and c."""
    from speculate.theory import optimal_lookahead, speedup

    a = report["alpha"]["after_distill"]["alpha_target_samples"]
    c = report["latency_batch1"]["c"]
    report["theory"] = {
        "alpha": round(a, 4), "c": c,
        "speedup_by_lookahead": {k: round(speedup(a, k, c), 3) for k in range(1, 9)},
        "optimal_lookahead": optimal_lookahead(a, c),
        "formula": "(1 - a^(k+1)) / ((1 - a)(k c + 1)), token-wise verification, i.i.d. a",
    }
    return report


def _folder_info(folder: Path) -> dict:
    import safetensors

    with safetensors.safe_open(folder / "model.safetensors", "pt") as f:
        dtype = str(f.get_tensor(next(iter(f.keys()))).dtype).removeprefix("torch.")
    return {"stored_dtype": dtype,
            "safetensors_mb": round((folder / "model.safetensors").stat().st_size / 1e6, 3),
            "folder_mb": round(sum(f.stat().st_size for f in folder.iterdir()) / 1e6, 3)}


def markdown(r: dict) -> str:
    t, d, h, a, lat = r["target"], r["draft"], r["heldout_loss"], r["alpha"], r["latency_batch1"]
    rows = [
        f"# Text model pair ({r['size']}): training record",
        "",
        f"Command: `{r['command']}` (seed {r['seed']}, {r['environment']['threads']} thread, "
        f"Python {r['environment']['python']}, torch {r['environment']['torch']}, "
        f"transformers {r['environment']['transformers']}).",
        "",
        *([f"Machine: {describe(r['machine'])}.", ""] if r.get("machine") else []),
        f"Corpus: Python {r['corpus']['python_version']} standard library `.py` sources, "
        f"train {r['corpus']['train_files']} files / {r['corpus']['train_bytes']:,} bytes, "
        f"held-out {r['corpus']['heldout_files']} files / {r['corpus']['heldout_bytes']:,} bytes.",
        "",
        ("| model | layers x dim (state, expand) | params | stored | file MB | held-out nats/byte |"
         " bits/byte |") if "state" in t["config"] else
        ("| model | layers x dim (heads, mlp) | params | stored | file MB | held-out nats/byte |"
         " bits/byte |"),
        "|---|---|---|---|---|---|---|",
    ]
    for name, m, loss in (("target", t, h["target"]), ("draft", d, h["draft"])):
        c = m["config"]
        rows.append(f"| {name} | {spec_text(c)} | "
                    f"{m['params']:,} | {m['stored_dtype']} | {m['safetensors_mb']} | "
                    f"{loss['nats_per_byte']} | {loss['bits_per_byte']} |")
    rows += [
        f"| draft before distillation | | | | | {h['draft_pretrained']['nats_per_byte']} | "
        f"{h['draft_pretrained']['bits_per_byte']} |",
        "",
        f"Held-out loss: {h['windows']} evenly spaced windows of {h['context']} bytes, every "
        "position scored.",
        "",
        "Acceptance alpha = E[sum_x min(p, q)] at temperature 1:",
        "",
        "| draft | on held-out text | on target samples |",
        "|---|---|---|",
        f"| pre-trained only | {a['before_distill']['alpha_heldout_text']:.4f} | "
        f"{a['before_distill']['alpha_target_samples']:.4f} |",
    ]
    for div, tr in r["distill"]["trials"].items():
        kept = " (kept)" if div == r["distill"]["kept"] else ""
        rows.append(f"| distilled, {div}{kept} | {tr['alpha_heldout_text']:.4f} | "
                    f"{tr['alpha_target_samples']:.4f} |")
    rows += [
        f"| saved draft (reloaded) | {a['after_distill']['alpha_heldout_text']:.4f} | "
        f"{a['after_distill']['alpha_target_samples']:.4f} |",
        "",
        f"({a['definition']}.)",
        "",
        "Recipe:",
        "",
        f"- target training: {t['train']}",
        f"- draft pre-training: {d['pretrain']}",
        f"- distillation: steps {r['distill']['steps']}, batch {r['distill']['batch']}, "
        f"prefix {r['distill']['prefix_len']}, continuation {r['distill']['continuation_len']}, "
        f"lr {r['distill']['lr']}, on-policy fraction {r['distill']['on_policy']}, "
        f"divergences tried {list(r['distill']['divergences'])}, kept {r['distill']['kept']}",
        "- AdamW (0.9, 0.95), weight decay 0.1 on matrices (0 in distillation), linear warm-up "
        "then cosine decay to 10%, gradient clip 1.0, random windows of the train stream "
        "(documents as BOS bytes EOS).",
        "",
        f"Batch-1 latency (1 thread): target {lat['target_1tok_ms']} ms per token, "
        f"{lat['target_5tok_ms']} ms for 5 tokens; draft {lat['draft_1tok_ms']} ms per token; "
        f"c = {lat['c']}. ({lat['note']}.)",
        "",
        f"Wall time: {r['timing']}.",
        "",
    ]
    if "theory" in r:
        th = r["theory"]
        ks = th["speedup_by_lookahead"]
        rows += [
            f"Theory at alpha = {th['alpha']} (target samples) and c = {th['c']}: expected "
            f"speedup {th['formula']}:",
            "",
            "| k | " + " | ".join(str(k) for k in ks) + " |",
            "|---|" + "---|" * len(ks),
            "| speedup | " + " | ".join(f"{v:.3f}" for v in ks.values()) + " |",
            "",
            f"Optimal lookahead: k = {th['optimal_lookahead']}.",
            "",
        ]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
