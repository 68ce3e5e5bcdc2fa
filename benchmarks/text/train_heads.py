"""Train Medusa heads and an EAGLE feature draft on a frozen target (byte-level Llama).

    python benchmarks/text/train_heads.py     # -> domains/text/examples/weights/target-{heads,feature-draft}
    python benchmarks/text/train_heads.py --pair large   # -> benchmarks/text/models/large/target-...

The two kinds train independently: on two cores, ``--only heads`` and ``--only draft`` can run side
by side, each merging its part into the same results file.

Both drafts live on the frozen target of ``load_pair()`` (``--pair``) (``speculate.domains.text.training.heads`` and
``.feature_draft``) and train on random windows of the Python standard library's sources
(``corpus.load_corpus``), the corpus the target was trained on: its continuations are close to
the target's own, and for the same wall time corpus windows (5x cheaper than windows whose second
half the target samples, ``--self-distill``) gave higher acceptance (``TUNING``). Each draft is
saved in float16, reloaded with ``from_pretrained`` and measured on the states ``train_pair.py``
measured the distilled draft model on: 64 held-out prefixes of 128 bytes continued by 128 bytes
sampled from the target (the same seeds), every continuation state. Batch-1 latencies (1 thread)
give the cost ratio c of a draft step to a target step. Results:
benchmarks/results/text_train_heads[_large].{json,md}. 1 thread, seeded.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from bench_generate import pair_path  # noqa: E402  (this script's folder is on sys.path)
from report import RESULTS, command, describe, machine, relative, write  # noqa: E402
from speculate.domains.text.examples.corpus import load_corpus  # noqa: E402
from speculate.domains.text.examples.pair import MODELS_DIR, load_pair  # noqa: E402
from speculate.domains.text.training.distill import acceptance_rate, sample_continuations, sample_windows  # noqa: E402
from speculate.domains.text.training.feature_draft import (  # noqa: E402
    FeatureDraft,
    feature_draft_acceptance,
    train_feature_draft,
)
from speculate.domains.text.training.heads import MedusaHeads, expected_tokens, heads_acceptance, train_heads  # noqa: E402
from train_pair import latency_ms  # noqa: E402  (this script's folder is on sys.path)

HEADS_DIR, DRAFT_DIR = MODELS_DIR / "target-heads", MODELS_DIR / "target-feature-draft"
#: what --only heads / --only draft train, and the label of each one's drafting latency
PARTS = {"heads": "Medusa heads (all)", "feature_draft": "feature draft (one column)"}
# Trials that chose the defaults (seed 0, two runs at a time on the 2-core machine; alphas on the
# evaluation states; tokens per call as in the report).
TUNING = [
    "heads 4 x 1 block, lr 3e-3: self-distilled 400 steps (530 s) alpha 0.575/0.496/0.457/0.426 "
    "(2.05 tokens/call); corpus windows 1500 steps (458 s) 0.625/0.528/0.490/0.457 (2.19)",
    "heads 4 x 2 blocks, corpus, 2000 steps: lr 3e-3 0.662/0.561/0.511/0.475 (2.31); lr 6e-3 "
    "0.672/0.569/0.515/0.474 (2.34)",
    "feature draft, corpus, 1500 steps, lr 3e-3, windows of 128: token weight 0.1 (EAGLE's) first "
    "token 0.767, second 0.708; token weight 1 0.826, 0.761 (positions past the training windows "
    "hurt: 0.864 on windows of 128)",
    "feature draft, windows of 256: token weight 1 0.858, 0.805 (3.55 tokens/call); token weight 3 "
    "0.859, 0.775 (3.44); weight 1 + input noise 0.1 0.859, 0.812 (3.58); noise 0.2 0.859, 0.817 (3.60)",
]


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@torch.inference_mode()
def step_ms(call, reps: int = 200) -> float:
    """Median milliseconds of ``call()``."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return 1e3 * sorted(ts)[len(ts) // 2]


def feature_draft_ms(draft: FeatureDraft, prefix: int = 128) -> float:
    """One drafted column at batch 1 on a cache of ``prefix`` columns."""
    H = draft.config["hidden_size"]
    cache = draft.new_cache(1, prefix + 1)
    f, tok = torch.zeros(1, 1, H), torch.zeros(1, 1, dtype=torch.long)
    pos, vis = torch.full((1, 1), prefix), torch.ones(1, 1, prefix + 1, dtype=torch.bool)
    return step_ms(lambda: draft(f, tok, pos, cache, pos, vis))


def folder_kb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.iterdir()) / 1e3, 1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--head-layers", type=int, default=2)
    ap.add_argument("--heads-steps", type=int, default=2000)
    ap.add_argument("--heads-lr", type=float, default=6e-3)
    ap.add_argument("--heads-seq-len", type=int, default=128)
    ap.add_argument("--heads-divergence", default="tv")
    ap.add_argument("--draft-steps", type=int, default=1500)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--draft-seq-len", type=int, default=256, help="windows as long as the evaluated ones")
    ap.add_argument("--draft-mlp", type=int, default=256, help="the feature draft's MLP width")
    ap.add_argument("--feature-weight", type=float, default=1.0)
    ap.add_argument("--token-weight", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--self-distill", action="store_true", help="second halves sampled from the target")
    ap.add_argument("--only", choices=("heads", "draft"), default=None, help="train one kind only")
    ap.add_argument("--pair", default="embedded", help="embedded, large, or a folder with target/ and draft/")
    ap.add_argument("--out", type=Path, default=None, help="folder of the two model folders (default: the pair's)")
    ap.add_argument("--results", default=None, help="results name (default text_train_heads[_<pair>])")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    path = pair_path(args.pair)
    args.out = args.out or path or MODELS_DIR
    args.results = args.results or "text_train_heads" + ("" if path is None else f"_{path.name}")
    torch.set_num_threads(args.threads)
    env = machine()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    target, draft_model, _ = load_pair(path=path)
    train, held = load_corpus("train"), load_corpus("heldout")
    tr = [torch.from_numpy(train.token_stream())]
    he = [torch.from_numpy(held.token_stream())]
    # the evaluation states of train_pair.py: 64 held-out prefixes of 128 bytes + 128 target bytes
    prefixes = sample_windows(he[0], 64, 128, torch.Generator().manual_seed(args.seed + 7))
    states = sample_continuations(target, prefixes, 128, 1.0, torch.Generator().manual_seed(args.seed + 8))
    pair_alpha = acceptance_rate(target, draft_model, states, start=127)
    log(f"draft model of the pair: alpha {pair_alpha:.4f} on the evaluation states")
    common = dict(batch_size=args.batch, rng=args.seed, eval_texts=he, log=log, self_distill=args.self_distill)
    report: dict = {"command": command(argv, __file__), "seed": args.seed, "threads": args.threads, "pair": args.pair,
                    "target": {k: target.config.to_dict()[k] for k in
                               ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")},
                    "draft_model": f"{draft_model.config.num_hidden_layers} x {draft_model.config.hidden_size} Llama",
                    "environment": {"python": platform.python_version(), "torch": torch.__version__},
                    "corpus": {"python_version": train.python_version, "train_bytes": train.n_bytes,
                               "heldout_bytes": held.n_bytes, "train_sha256": train.digest()},
                    "evaluation": "64 held-out prefixes of 128 bytes continued by 128 bytes sampled from "
                                  "the target at temperature 1 (train_pair.py's seeds); alpha = mean over "
                                  "the continuation states of sum_x min(p, q)",
                    "pair_draft_alpha": pair_alpha, "pair_tokens_per_call_4": expected_tokens([pair_alpha] * 4),
                    "tuning": TUNING}
    latency = {"target": latency_ms(target, 1), "pair draft model": latency_ms(draft_model, 1)}

    if args.only in (None, "heads"):
        res = train_heads(target, tr, n_heads=args.n_heads, n_layers=args.head_layers, steps=args.heads_steps,
                          lr=args.heads_lr, divergence=args.heads_divergence, seq_len=args.heads_seq_len, **common)
        float32 = heads_acceptance(target, res.heads.eval(), states, 127)
        res.heads.save_pretrained(args.out / HEADS_DIR.name, dtype=torch.float16)
        heads = MedusaHeads.from_pretrained(args.out / HEADS_DIR.name, target)
        before = heads_acceptance(target, MedusaHeads.for_target(target, args.n_heads, args.head_layers), states, 127)
        after = heads_acceptance(target, heads, states, 127)
        report["heads"] = {**res.config, "command": report["command"], "folder": relative(args.out / HEADS_DIR.name),
                           "params": n_params(heads), "folder_kb": folder_kb(args.out / HEADS_DIR.name),
                           "seconds": round(res.seconds, 1), "alpha_before": before, "alpha_after": after,
                           "tokens_per_call": expected_tokens(after), "alpha_float32_before_saving": float32,
                           "loss_first": res.losses[0],
                           "loss_last50": sum(res.losses[-50:]) / len(res.losses[-50:])}
        log(f"heads: {report['heads']}")
        feat = torch.zeros(1, heads.config["hidden_size"])  # [R, H]: one row's last feature
        latency[PARTS["heads"]] = step_ms(lambda: heads.draft_logits(feat))  # what drafting calls

    if args.only in (None, "draft"):
        fresh = FeatureDraft.for_target(target, intermediate_size=args.draft_mlp)
        res = train_feature_draft(target, tr, steps=args.draft_steps, lr=args.draft_lr, noise=args.noise,
                                  feature_weight=args.feature_weight, token_weight=args.token_weight,
                                  seq_len=args.draft_seq_len, draft=fresh, **common)
        float32 = feature_draft_acceptance(target, res.draft.eval(), states, 127)
        res.draft.save_pretrained(args.out / DRAFT_DIR.name, dtype=torch.float16)
        draft = FeatureDraft.from_pretrained(args.out / DRAFT_DIR.name, target)
        before = feature_draft_acceptance(target, FeatureDraft.for_target(target, intermediate_size=args.draft_mlp),
                                          states, 127)
        tf, roll = feature_draft_acceptance(target, draft, states, 127)
        report["feature_draft"] = {
            **res.config, "command": report["command"], "folder": relative(args.out / DRAFT_DIR.name),
            "n_heads": draft.n_heads, "intermediate_size": args.draft_mlp, "params": n_params(draft),
            "folder_kb": folder_kb(args.out / DRAFT_DIR.name), "seconds": round(res.seconds, 1),
            "alpha_before": before[0], "alpha_rollout_before": before[1], "alpha_teacher_forced": tf,
            "alpha_rollout": roll, "alpha_float32_before_saving": float32,
            "tokens_per_call_4": expected_tokens([tf] + [roll] * 3),
            "loss_first": res.losses[0], "loss_last50": sum(res.losses[-50:]) / len(res.losses[-50:])}
        log(f"feature draft: {report['feature_draft']}")
        latency[PARTS["feature_draft"]] = feature_draft_ms(draft)

    report["latency_ms"] = latency
    report["machine"] = env
    if args.only is not None:  # keep the other kind's part of an earlier run (or of one beside this)
        report = merged(Path(args.results_dir) / f"{args.results}.json", report)
    write(args.results, report, markdown(report), folder=args.results_dir)
    return report


def merged(old_path: Path, new: dict) -> dict:
    """``new`` with the part it did not train (and that part's latency) taken from ``old_path``."""
    if not old_path.is_file():
        return new
    old = json.loads(old_path.read_text())
    if old.get("pair", "embedded") != new["pair"]:
        return new
    out = dict(new)
    latency = dict(new["latency_ms"])
    for part, label in PARTS.items():
        if part not in new and part in old:
            out[part] = old[part]
            if label in old.get("latency_ms", {}):
                latency[label] = old["latency_ms"][label]
    out["latency_ms"] = latency
    out["command"] = " ; ".join(dict.fromkeys(out[p].get("command", "") for p in PARTS if p in out)) or new["command"]
    return out


def markdown(r: dict) -> str:
    rows = [
        f"# Medusa heads and EAGLE feature draft on the {r.get('pair', 'embedded')} target: training record", "",
        f"Target: {_target(r)}.", "",
        f"Command: `{r['command']}` (seed {r['seed']}, {r['threads']} thread, Python "
        f"{r['environment']['python']}, torch {r['environment']['torch']}).", "",
        f"Machine: {describe(r['machine'])}.", "",
        f"Evaluation: {r['evaluation']}. Both drafts were reloaded from their saved folders "
        "(weights stored in float16) before measuring (the float32 weights before saving: "
        "`alpha_float32_before_saving` in the JSON).", "",
    ]
    if "heads" in r:
        h = r["heads"]
        rows += [
            f"## Medusa heads (`{h.get('folder', 'domains/text/examples/weights/target-heads')}`, "
            f"{h['params']:,} parameters, "
            f"{h['folder_kb']} KB)", "",
            f"{h['n_heads']} heads of {h['n_layers']} residual block(s); {h['steps']} steps of batch "
            f"{h['batch_size']} x {h['seq_len']} bytes, lr {h['lr']}, loss {h['divergence']}, "
            f"{'self-distilled' if h['self_distill'] else 'corpus windows'}; {h['seconds']:.0f} s.", "",
            "| head (drafts token) | alpha fresh | alpha trained |", "|---|---|---|",
            *[f"| {i} (t + {i + 2}) | {b:.4f} | {a:.4f} |"
              for i, (b, a) in enumerate(zip(h["alpha_before"], h["alpha_after"], strict=True))], "",
            f"Tokens per target call of a chain of all heads, heads taken as independent "
            f"(1 + a0 + a0 a1 + ...): {h['tokens_per_call']:.3f}.", "",
        ]
    if "feature_draft" in r:
        d = r["feature_draft"]
        rows += [
            f"## EAGLE feature draft (`{d.get('folder', 'domains/text/examples/weights/target-feature-draft')}`, "
            f"{d['params']:,} parameters, "
            f"{d['folder_kb']} KB)", "",
            f"One decoder layer ({d['n_heads']} heads, MLP {d['intermediate_size']}); {d['steps']} steps of "
            f"batch {d['batch_size']} x {d['seq_len']} bytes, lr {d['lr']}, loss {d['feature_weight']} x "
            f"smooth L1 (features) + {d['token_weight']} x {d['divergence']} (tokens), noise {d['noise']}, "
            f"{'self-distilled' if d['self_distill'] else 'corpus windows'}; {d['seconds']:.0f} s.", "",
            "| draft | alpha, first token (teacher-forced) | alpha, second token (own feature) |",
            "|---|---|---|",
            f"| fresh (the target's head one step late) | {d['alpha_before']:.4f} | {d['alpha_rollout_before']:.4f} |",
            f"| trained | {d['alpha_teacher_forced']:.4f} | {d['alpha_rollout']:.4f} |",
            f"| draft model of the pair ({r.get('draft_model', '1 x 96 Llama')}, distilled) "
            f"| {r['pair_draft_alpha']:.4f} | |", "",
            f"Tokens per target call drafting 4 tokens, steps after the second taken at the rollout alpha "
            f"(1 + a + a r + a r^2 + a r^3): {d['tokens_per_call_4']:.3f}; the pair's draft model "
            f"(1 + a + ... + a^4): {r['pair_tokens_per_call_4']:.3f}.", "",
        ]
    lat = r["latency_ms"]
    rows += ["## Cost of a draft step (batch 1, 1 thread, median of 200)", "",
             "| step | ms | c = draft / target |", "|---|---|---|",
             *[f"| {k} | {v:.4f} | {v / lat['target'] :.4f} |" for k, v in lat.items()], "",
             "## Tuning on the embedded target (how the defaults were chosen)", "", *[f"- {t}" for t in TUNING], ""]
    return "\n".join(rows)


def _target(r: dict) -> str:
    t = r.get("target")
    if not t:
        return "the embedded pair's"
    return (f"Llama, {t['num_hidden_layers']} layers of width {t['hidden_size']} (MLP {t['intermediate_size']}), "
            f"vocabulary {t['vocab_size']}")


if __name__ == "__main__":
    main()
