"""Train the embedded digits pair: a class-conditional target denoiser and a distilled draft (CPU).

    python benchmarks/diffusion/train_digits.py            # -> domains/diffusion/models (embedded)

About 7.5 minutes on one CPU thread (6 of them the target). Deterministic: a second run on the
same machine and torch version wrote the shipped files again bit for bit.

Data: scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``: 1797 images of
8x8 grey levels 0..16, offline), scaled to [-1, 1]; 10% held out (seeded). Schedule: DDPM, linear
betas 1e-4..0.02, T = 1000, eps prediction.

Stages: (1) the target (``MLPDenoiser`` width 640, 5 blocks, 4.3M parameters) with the standard denoising loss
E |eps_theta(sqrt(ab_t) x_0 + sqrt(1 - ab_t) eps, t, y) - eps|^2, t uniform in 1..T, the label
replaced by the null label 10 with probability 0.1 (classifier-free guidance), AdamW, warm-up then
cosine decay, gradient clip 1, an exponential moving average of the weights (kept); (2) the draft
(width 96, 2 blocks, 64k parameters) distilled toward the target: E |eps_draft(x_t, t, y) - eps_target(x_t, t, y)|^2
on the same noised data (null label w.p. 0.1), the quantity speculative acceptance depends on;
(3) save both as safetensors (the target in float16 to fit the 10 MB budget) with
``digits.json`` (architecture, sampler, and the recipe, seed and losses), reload them and measure
what was saved: held-out denoising loss, draft-target distance, size, and the batch latency of
each on 1 thread (the cost ratio). Results: benchmarks/results/diffusion_train.{json,md}.
Everything is seeded; the latencies depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import describe, machine, write  # noqa: E402
from speculate.domains.diffusion import DDPM  # noqa: E402
from speculate.domains.diffusion.digits import MODELS, NULL_LABEL, MLPDenoiser, load_digits_pair  # noqa: E402


@dataclass
class Spec:
    width: int
    blocks: int
    steps: int
    batch: int
    lr: float
    warmup: int
    weight_decay: float
    ema: float


TARGET = Spec(width=640, blocks=5, steps=6000, batch=128, lr=1e-3, warmup=300, weight_decay=0.0, ema=0.999)
DRAFT = Spec(width=96, blocks=2, steps=6000, batch=128, lr=2e-3, warmup=200, weight_decay=0.0, ema=0.0)
P_NULL = 0.1
SAMPLER = dict(timesteps=1000, schedule="linear", variance="beta")


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 8.0 - 1.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = len(x) // 10
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def lr_at(step: int, spec: Spec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    frac = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def noised(x0, ab, gen):
    """(x_t, t, eps) for a batch of clean images, t uniform in 1..T."""
    T = len(ab) - 1
    t = torch.randint(1, T + 1, (x0.shape[0],), generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    a = ab[t].reshape(-1, 1, 1, 1)
    return a.sqrt() * x0 + (1 - a).sqrt() * eps, t, eps


def drop_labels(y, gen):
    return torch.where(torch.rand(y.shape, generator=gen) < P_NULL, torch.full_like(y, NULL_LABEL), y)


def fixed_eval_batch(x, y, ab, seed, repeats=8):
    """Held-out images, each noised ``repeats`` times (fixed seed): with their labels and with the null label."""
    gen = torch.Generator().manual_seed(seed)
    x0 = x.repeat(repeats, 1, 1, 1)
    xt, t, eps = noised(x0, ab, gen)
    return xt, t, eps, y.repeat(repeats)


@torch.no_grad()
def eval_loss(net, batch) -> dict:
    xt, t, eps, y = batch
    out = {}
    for name, labels in (("conditional", y), ("unconditional", torch.full_like(y, NULL_LABEL))):
        out[name] = float(((net(xt, t, labels) - eps) ** 2).mean())
    return out


@torch.no_grad()
def distance(draft, target, batch) -> dict:
    xt, t, _, y = batch
    out = {}
    for name, labels in (("conditional", y), ("unconditional", torch.full_like(y, NULL_LABEL))):
        out[name] = float(((draft(xt, t, labels) - target(xt, t, labels)) ** 2).mean())
    return out


def train(net, spec: Spec, x, y, ab, seed, loss_fn, log) -> list:
    gen = torch.Generator().manual_seed(seed)
    decay = [p for p in net.parameters() if p.dim() >= 2]
    other = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=spec.lr, betas=(0.9, 0.99))
    ema = {k: v.detach().clone() for k, v in net.state_dict().items()} if spec.ema else None
    curve, run = [], 0.0
    for step in range(spec.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spec)
        idx = torch.randint(0, len(x), (spec.batch,), generator=gen)
        loss = loss_fn(net, x[idx], y[idx], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for k, v in net.state_dict().items():
                    if v.is_floating_point():
                        ema[k].mul_(spec.ema).add_(v.detach(), alpha=1 - spec.ema)
        value = float(loss.detach())
        run = 0.98 * run + 0.02 * value if step else value
        if (step + 1) % 500 == 0 or step == 0:
            curve.append((step + 1, run))
            log(f"  step {step + 1}/{spec.steps} loss {run:.4f} lr {lr_at(step, spec):.2e}")
    if ema is not None:
        net.load_state_dict(ema)
    return curve


def latency(net, B: int, repeats: int = 200) -> float:
    x = torch.randn(B, 1, 8, 8)
    t = torch.randint(1, 1001, (B,))
    y = torch.randint(0, 11, (B,))
    with torch.inference_mode():
        for _ in range(10):
            net(x, t, y)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            net(x, t, y)
            times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for training (latency: always 1)")
    ap.add_argument("--target-steps", type=int, default=TARGET.steps)
    ap.add_argument("--draft-steps", type=int, default=DRAFT.steps)
    ap.add_argument("--out", default=str(MODELS))
    ap.add_argument("--results", default="diffusion_train")
    ap.add_argument("--results-folder", default=None, help="write the results here instead of benchmarks/results")
    args = ap.parse_args(argv)
    m = machine()  # first: it starts numba's threading layer, which resets the OpenMP threads torch uses
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target_spec = Spec(**{**asdict(TARGET), "steps": args.target_steps})
    draft_spec = Spec(**{**asdict(DRAFT), "steps": args.draft_steps})
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    x, y, xt_, yt_ = load_data(args.seed)
    sched = DDPM(**SAMPLER)
    ab = torch.tensor(sched.alpha_bar, dtype=torch.float32)
    held = fixed_eval_batch(xt_, yt_, ab, args.seed + 1)
    log(f"data: {len(x)} train / {len(xt_)} held-out images; T = {sched.timesteps}")

    def denoising_loss(net, x0, labels, gen):
        xt, t, eps = noised(x0, ab, gen)
        return ((net(xt, t, drop_labels(labels, gen)) - eps) ** 2).mean()

    target = MLPDenoiser(width=target_spec.width, blocks=target_spec.blocks)
    log(f"target: {sum(p.numel() for p in target.parameters()):,} parameters")
    t0 = time.perf_counter()
    target_curve = train(target, target_spec, x, y, ab, args.seed + 2, denoising_loss, log)
    target_time = time.perf_counter() - t0
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    log(f"target held-out loss {eval_loss(target, held)}")

    def distill_loss(net, x0, labels, gen):
        xt, t, _ = noised(x0, ab, gen)
        lab = drop_labels(labels, gen)
        with torch.no_grad():
            want = target(xt, t, lab)
        return ((net(xt, t, lab) - want) ** 2).mean()

    draft = MLPDenoiser(width=draft_spec.width, blocks=draft_spec.blocks)
    log(f"draft: {sum(p.numel() for p in draft.parameters()):,} parameters")
    t0 = time.perf_counter()
    draft_curve = train(draft, draft_spec, x, y, ab, args.seed + 3, distill_loss, log)
    draft_time = time.perf_counter() - t0
    draft.eval()

    from safetensors.torch import save_file

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in target.state_dict().items()},
              str(out / "digits_target.safetensors"))
    save_file({k: v.contiguous() for k, v in draft.state_dict().items()}, str(out / "digits_draft.safetensors"))
    cfg = {"target": target.config(), "draft": draft.config(), "sampler": SAMPLER, "prediction": "eps",
           "null_label": NULL_LABEL, "data": "sklearn.datasets.load_digits, x / 8 - 1 (8x8 in [-1, 1])"}
    (out / "digits.json").write_text(json.dumps(cfg, indent=2) + "\n")

    _, T, D = load_digits_pair(out)  # what was saved, reloaded
    torch.set_num_threads(1)
    sizes = {name: (out / f"digits_{name}.safetensors").stat().st_size / 1e6 for name in ("target", "draft")}
    params = {"target": sum(p.numel() for p in T.parameters()), "draft": sum(p.numel() for p in D.parameters())}
    lat = {name: {B: latency(net, B) for B in (1, 9, 16, 64, 144)} for name, net in (("target", T), ("draft", D))}
    res = {
        "seed": args.seed,
        "target_spec": asdict(target_spec),
        "draft_spec": asdict(draft_spec),
        "p_null": P_NULL,
        "sampler": SAMPLER,
        "params": params,
        "file_mb": sizes,
        "held_out_loss": {"target_saved": eval_loss(T, held), "draft_saved": eval_loss(D, held)},
        "draft_target_mse_held_out": distance(D, T, held),
        "target_curve": target_curve,
        "draft_curve": draft_curve,
        "latency_ms_1_thread": lat,
        "cost_ratio_by_batch": {B: lat["draft"][B] / lat["target"][B] for B in lat["target"]},
        "train_seconds": {"target": target_time, "draft": draft_time},
        "machine": {**m, "torch_threads": args.threads, "torch_threads_latency": torch.get_num_threads()},
    }
    cfg["training"] = {  # the recipe, seed and losses next to the weights
        "script": "benchmarks/diffusion/train_digits.py", "command": res["machine"]["command"], "seed": args.seed,
        "torch": torch.__version__, "threads": args.threads, "target_spec": asdict(target_spec),
        "draft_spec": asdict(draft_spec), "p_null": P_NULL,
        "final_train_loss": {"target": target_curve[-1][1], "draft": draft_curve[-1][1]},
        "held_out_loss": res["held_out_loss"], "draft_target_mse_held_out": res["draft_target_mse_held_out"],
        "train_seconds": res["train_seconds"], "file_mb": sizes, "params": params,
        "results": "benchmarks/results/diffusion_train.md",
    }
    (out / "digits.json").write_text(json.dumps(cfg, indent=2) + "\n")
    md = ["# Diffusion digits pair: training record\n",
          f"Command: `{m['command']}` (seed {args.seed}, {args.threads} torch thread(s) for training, 1 for the "
          f"latencies; {describe(res['machine'])}).\n",
          f"Data: `sklearn.datasets.load_digits` (1797 images 8x8, grey levels 0..16 scaled to [-1, 1]), "
          f"{len(x)} train / {len(xt_)} held-out (seeded split). Sampler: DDPM, linear betas 1e-4..0.02, "
          "T = 1000, eps prediction.\n",
          "| model | width x blocks | params | stored | file MB | held-out loss (cond.) | (uncond.) |",
          "|---|---|---|---|---|---|---|"]
    for name, spec, dtype in (("target", target_spec, "float16"), ("draft", draft_spec, "float32")):
        h = res["held_out_loss"][f"{name}_saved"]
        md.append(f"| {name} | {spec.width} x {spec.blocks} | {params[name]:,} | {dtype} | {sizes[name]:.3f} | "
                  f"{h['conditional']:.4f} | {h['unconditional']:.4f} |")
    dm = res["draft_target_mse_held_out"]
    md += ["", "Held-out loss: mean |eps_theta(x_t, t, y) - eps|^2 per coordinate over the held-out images, each "
           "noised 8 times (fixed seed, t uniform in 1..1000); with the true label and with the null label.",
           f"Draft-target distance (what acceptance depends on): mean |eps_draft - eps_target|^2 per coordinate = "
           f"{dm['conditional']:.5f} (conditional), {dm['unconditional']:.5f} (unconditional), same inputs.\n",
           "Recipe:\n",
           f"- target: {asdict(target_spec)}; loss E|eps_theta(x_t, t, y) - eps|^2, labels dropped to the null label "
           f"w.p. {P_NULL}; AdamW (0.9, 0.99), linear warm-up then cosine decay to 10%, gradient clip 1, EMA of "
           f"the weights (decay {target_spec.ema}) kept.",
           f"- draft: {asdict(draft_spec)}; distilled: loss E|eps_draft(x_t, t, y) - eps_target(x_t, t, y)|^2 "
           f"on the same noised training images (null label w.p. {P_NULL}), no EMA.",
           f"- final training loss (moving average): target {target_curve[-1][1]:.4f}, draft {draft_curve[-1][1]:.6f}.",
           f"- wall time: target {target_time:.0f} s, draft {draft_time:.0f} s.\n",
           "Latency per call, 1 torch thread (median of 200 calls, ms) and the cost ratio c = draft / target:\n",
           "| batch | target ms | draft ms | c |", "|---|---|---|---|"]
    for B in lat["target"]:
        c = lat["draft"][B] / lat["target"][B]
        md.append(f"| {B} | {lat['target'][B]:.3f} | {lat['draft'][B]:.3f} | {c:.3f} |")
    write(args.results, res, "\n".join(md), folder=args.results_folder)
    log(f"saved to {out}; results {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
