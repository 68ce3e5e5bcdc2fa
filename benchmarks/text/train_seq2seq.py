"""Train a BART encoder-decoder pair (target + distilled draft) on a translation task generated offline.

    python benchmarks/text/train_seq2seq.py            # -> benchmarks/text/models/seq2seq/{target,draft}

The task ("pyglot"): translate short chunks of Python standard-library source (1-3 consecutive
lines, 48-112 bytes, from ``speculate.domains.text.examples.corpus``'s train / held-out files) into a
pseudo-language by a deterministic rewrite (:func:`translate`): keywords renamed (``def`` -> ``fn``,
``return`` -> ``give``, ``None`` -> ``nil``, ...), identifiers from snake_case to camelCase (a leading
underscore becomes ``~``), ``for X in Y:`` reordered to ``each Y as X {``, ``if C:`` / ``while C:`` to
``when (C) {`` / ``loop (C) {``, a plain assignment ``x = e`` reordered to ``e -> x``, a block-opening
``:`` to `` {``, indentation to one tab per 4 spaces; string literals and comments are copied
verbatim. The output is mostly a copy with local, learnable edits (so a small draft agrees with the
target most of the time) but needs the encoder (identifiers, literals, reordering).

Byte level, with ``speculate.domains.text.examples.tokenizer.ByteTokenizer`` (259 ids; BOS = decoder start,
EOS ends the target). Stages: (1) train the target (BART, 3 encoder + 6 decoder layers, d 160: a
decoder step is dominated by per-layer overhead on one CPU thread, so depth sets its cost) on the
references; (2) train the draft (1 + 1 layers, d 64) on the references; (3) distil the draft toward
the target: total variation (``speculate.domains.text.training.distill.divergence_loss``, 1 - acceptance)
between teacher-forced target and draft distributions on the target's own temperature-1 samples
(``distill.distill`` is decoder-only, so this stage is a small seq2seq loop around its loss);
(4) save both (Hugging Face format, float32), reload them and measure what was saved: held-out
loss (nats per byte), greedy exact match and character accuracy, acceptance
``alpha = E[sum_x min(p, q)]`` at temperature 1 on target samples (before and after distillation),
batch-1 decoder-step latency and c. Results: benchmarks/results/text_train_seq2seq.{json,md}.
One CPU thread (``--threads``), seeded.
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py

from report import describe, machine, relative, write  # noqa: E402
from speculate.domains.text.examples.corpus import load_corpus  # noqa: E402
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer  # noqa: E402
from speculate.domains.text.models.transformers_api import cache_kwarg, output_cache  # noqa: E402
from speculate.domains.text.training.distill import divergence_loss  # noqa: E402

OUT = ROOT / "benchmarks" / "text" / "models" / "seq2seq"
MAX_SRC, MAX_TGT, MIN_SRC = 112, 128, 48

# ---------------------------------------------------------------------------------------- the task

KEYWORDS = {
    "def": "fn", "return": "give", "if": "when", "elif": "orwhen", "else": "otherwise",
    "for": "each", "in": "of", "while": "loop", "not": "no", "and": "&&", "or": "||",
    "import": "use", "from": "out", "class": "type", "self": "me", "None": "nil",
    "True": "yes", "False": "nope", "try": "attempt", "except": "rescue", "finally": "always",
    "raise": "throw", "with": "using", "as": "named", "lambda": "fun", "is": "iz",
    "pass": "skip", "break": "stop", "continue": "next", "yield": "emit", "assert": "check",
    "del": "drop", "global": "shared", "async": "later", "await": "wait",
}
_TOKEN = re.compile(r"""(?P<str>[rbfuRBFU]{0,2}(?:'[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"))"""
                    r"|(?P<comment>#.*)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<ws>[ \t]+)|(?P<other>.)")
_FOR = re.compile(r"^for (.+?) in (.+):$")
_COND = re.compile(r"^(if|elif|while) (.+):$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*) = (.+)$")


def _name(word: str) -> str:
    if word in KEYWORDS:
        return KEYWORDS[word]
    stripped = word.lstrip("_")
    head = "~" * (len(word) - len(stripped))
    parts = stripped.split("_")
    return head + parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _words(code: str) -> str:
    """Rename keywords and identifiers outside strings and comments."""
    out = []
    for m in _TOKEN.finditer(code):
        out.append(_name(m.group()) if m.lastgroup == "name" else m.group())
    return "".join(out)


def _split_comment(code: str) -> tuple[str, str]:
    for m in _TOKEN.finditer(code):
        if m.lastgroup == "comment":
            return code[: m.start()].rstrip(), code[m.start():]
    return code, ""


def translate_line(line: str) -> str:
    indent = len(line) - len(line.lstrip(" "))
    code, comment = _split_comment(line.strip())
    if m := _FOR.match(code):
        body = f"each {_words(m.group(2))} named {_words(m.group(1))} {{"
    elif m := _COND.match(code):
        body = f"{_words(m.group(1))} ({_words(m.group(2))}) {{"
    elif (m := _ASSIGN.match(code)) and not code.endswith(":"):
        body = f"{_words(m.group(2))} -> {_words(m.group(1))}"
    elif code.endswith(":"):
        body = _words(code[:-1]).rstrip() + " {"
    else:
        body = _words(code)
    return "\t" * (indent // 4) + body + (" " + comment if comment and body else comment)


def translate(src: str) -> str:
    """The pseudo-language rewrite of a chunk of Python lines (deterministic)."""
    return "\n".join(translate_line(line) for line in src.split("\n"))


def examples(split: str, seed: int) -> list[tuple[bytes, bytes]]:
    """(source, target) byte pairs: chunks of 1-3 consecutive lines, ASCII, no triple quotes, no
    line continuations, common indentation removed, source 48-112 bytes, target <= 128 bytes."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    for doc in load_corpus(split).documents:
        try:
            lines = doc.decode("ascii").split("\n")
        except UnicodeDecodeError:
            continue
        i = 0
        while i < len(lines):
            n = int(rng.integers(1, 4))
            chunk = [x.rstrip() for x in lines[i : i + n]]
            i += n
            if not all(chunk) or any('"""' in x or "'''" in x or x.endswith("\\") or "\t" in x
                                     for x in chunk):
                continue
            base = min(len(x) - len(x.lstrip(" ")) for x in chunk)
            src = "\n".join(x[base:] for x in chunk)
            if not MIN_SRC <= len(src) <= MAX_SRC or src.lstrip().startswith(("#", "@")):
                continue
            tgt = translate(src)
            if len(tgt) <= MAX_TGT and src not in seen:
                seen.add(src)
                out.append((src.encode(), tgt.encode()))
    rng.shuffle(out)
    return out


def collate(pairs: list[tuple[bytes, bytes]]) -> dict[str, torch.Tensor]:
    """Encoder ids ``src EOS`` (right-padded), decoder input ``BOS tgt``, labels ``tgt EOS``."""
    S = max(len(s) for s, _ in pairs) + 1
    T = max(len(t) for _, t in pairs) + 1
    ids = torch.full((len(pairs), S), PAD_ID)
    mask = torch.zeros((len(pairs), S), dtype=torch.long)
    dec = torch.full((len(pairs), T), PAD_ID)
    lab = torch.full((len(pairs), T), -100)
    for r, (s, t) in enumerate(pairs):
        ids[r, : len(s) + 1] = torch.tensor([*s, EOS_ID])
        mask[r, : len(s) + 1] = 1
        dec[r, : len(t) + 1] = torch.tensor([BOS_ID, *t])
        lab[r, : len(t) + 1] = torch.tensor([*t, EOS_ID])
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec, "labels": lab}


# ------------------------------------------------------------------------------------------ models


@dataclass
class Spec:
    encoder_layers: int
    decoder_layers: int
    dim: int
    heads: int
    ffn: int
    positions: int = 256


@dataclass
class TrainSpec:
    steps: int
    batch: int
    lr: float
    warmup: int
    weight_decay: float = 0.01


TARGET = Spec(3, 6, 160, 4, 640)
DRAFT = Spec(1, 1, 64, 2, 256)
TARGET_TRAIN = TrainSpec(steps=1000, batch=16, lr=2e-3, warmup=100)
DRAFT_TRAIN = TrainSpec(steps=1500, batch=16, lr=3e-3, warmup=50)
DISTILL = dict(steps=150, batch=16, lr=1e-3, divergence="tv")


def bart(spec: Spec):
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
        vocab_size=VOCAB_SIZE, d_model=spec.dim, encoder_layers=spec.encoder_layers,
        decoder_layers=spec.decoder_layers, encoder_attention_heads=spec.heads,
        decoder_attention_heads=spec.heads, encoder_ffn_dim=spec.ffn, decoder_ffn_dim=spec.ffn,
        max_position_embeddings=spec.positions, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, scale_embedding=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, decoder_start_token_id=BOS_ID, forced_bos_token_id=None,
        forced_eos_token_id=None)
    return BartForConditionalGeneration(cfg)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _lr(spec: TrainSpec, step: int) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    frac = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def _optimiser(model, spec: TrainSpec):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=spec.lr, betas=(0.9, 0.98))


def _steps(model, spec: TrainSpec, loss_fn, log, name: str) -> list:
    """AdamW, warm-up + cosine to 10%, grad clip 1; ``loss_fn(step)`` -> loss. Returns the curve."""
    opt = _optimiser(model, spec)
    model.train()
    curve, acc, t0 = [], 0.0, time.perf_counter()
    for step in range(spec.steps):
        for g in opt.param_groups:
            g["lr"] = _lr(spec, step)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.item()
        every = 50 if spec.steps >= 200 else 10
        if (step + 1) % every == 0 or step + 1 == spec.steps:
            n = every if (step + 1) % every == 0 else (step + 1) % every
            curve.append((step + 1, round(acc / n, 4)))
            el = time.perf_counter() - t0
            log(f"  {name} step {step + 1}/{spec.steps} loss {curve[-1][1]:.4f} "
                f"{el:.0f}s ({el / (step + 1):.3f}s/step)")
            acc = 0.0
    model.eval()
    return curve


def train_ce(model, data, spec: TrainSpec, seed: int, log, name: str) -> list:
    g = np.random.default_rng(seed)

    def loss_fn(step):
        b = collate([data[i] for i in g.integers(0, len(data), spec.batch)])
        return model(**b).loss

    return _steps(model, spec, loss_fn, log, name)


@torch.inference_mode()
def sample_targets(target, sources: list[bytes], seed: int, batch: int = 64) -> list[tuple[bytes, list[int]]]:
    """The target's temperature-1 translations (decoder ids, EOS included when produced)."""
    torch.manual_seed(seed)
    out = []
    for i in range(0, len(sources), batch):
        b = collate([(s, b"") for s in sources[i : i + batch]])
        gen = target.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                              do_sample=True, top_k=0, max_new_tokens=MAX_TGT + 1,
                              pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        for s, row in zip(sources[i : i + batch], gen[:, 1:].tolist(), strict=True):
            out.append((s, row[: row.index(EOS_ID) + 1] if EOS_ID in row else row))
    return out


def _forced(samples: list[tuple[bytes, list[int]]]) -> dict[str, torch.Tensor]:
    """A teacher-forcing batch of sampled decoder ids (labels -100 on padding)."""
    b = collate([(s, b"") for s, _ in samples])
    T = max(len(t) for _, t in samples)
    dec = torch.full((len(samples), T), PAD_ID)
    valid = torch.zeros((len(samples), T), dtype=torch.bool)
    for r, (_, t) in enumerate(samples):
        dec[r, : len(t)] = torch.tensor([BOS_ID, *t[:-1]]) if t else torch.tensor([BOS_ID])[:0]
        valid[r, : len(t)] = True
    return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"],
            "decoder_input_ids": dec, "valid": valid}


def distill_seq2seq(target, draft, samples, spec: TrainSpec, divergence: str, seed: int, log) -> list:
    g = np.random.default_rng(seed)

    def loss_fn(step):
        b = _forced([samples[i] for i in g.integers(0, len(samples), spec.batch)])
        kw = {k: b[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}
        with torch.no_grad():
            lt = target(**kw).logits
        ld = draft(**kw).logits
        return divergence_loss(lt, ld, divergence)[b["valid"]].mean()

    return _steps(draft, spec, loss_fn, log, f"distill ({divergence})")


@torch.inference_mode()
def alpha_on(target, draft, samples, batch: int = 32) -> float:
    """E[sum_x min(p, q)] = 1 - TV over every decoder state of the target's samples."""
    tot = n = 0.0
    for i in range(0, len(samples), batch):
        b = _forced(samples[i : i + batch])
        kw = {k: b[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}
        tv = divergence_loss(target(**kw).logits, draft(**kw).logits, "tv")[b["valid"]]
        tot += float((1 - tv).sum())
        n += tv.numel()
    return tot / n


@torch.inference_mode()
def heldout_loss(model, data, batch: int = 32) -> float:
    tot = n = 0.0
    for i in range(0, len(data), batch):
        b = collate(data[i : i + batch])
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
        tot += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1),
                                     ignore_index=-100, reduction="sum"))
        n += int((b["labels"] != -100).sum())
    return tot / n


@torch.inference_mode()
def greedy_scores(model, data, batch: int = 32) -> dict:
    """Greedy translations: exact match, and character accuracy = matching positions over
    max(len(output), len(reference))."""
    exact = chars = total = 0
    for i in range(0, len(data), batch):
        part = data[i : i + batch]
        b = collate(part)
        gen = model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                             do_sample=False, num_beams=1, max_new_tokens=MAX_TGT + 1,
                             pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        for (_, ref), row in zip(part, gen[:, 1:].tolist(), strict=True):
            hyp = bytes(x for x in (row[: row.index(EOS_ID)] if EOS_ID in row else row) if x < 256)
            exact += hyp == ref
            chars += sum(a == c for a, c in zip(hyp, ref, strict=False))
            total += max(len(hyp), len(ref))
    return {"examples": len(data), "exact_match": exact / len(data), "char_accuracy": chars / total}


@torch.inference_mode()
def step_ms(model, n_new: int = 1, src: int = 96, prefix: int = 48, reps: int = 200) -> float:
    """Median ms of one batch-1 decoder forward of ``n_new`` tokens (KV cache of ``prefix``)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (1, src), generator=g)
    dec = torch.randint(0, 256, (1, prefix), generator=g)
    out = model(input_ids=ids, decoder_input_ids=dec, use_cache=True)
    past, enc = output_cache(out), (out.encoder_last_hidden_state,)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        model(encoder_outputs=enc, decoder_input_ids=dec[:, :n_new], **{cache_kwarg(model): past},
              use_cache=True)
        ts.append(time.perf_counter() - t)
        past.self_attention_cache.crop(-n_new)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def save(model, folder: Path, tok: ByteTokenizer) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    model.generation_config.forced_bos_token_id = None
    model.generation_config.forced_eos_token_id = None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {"safetensors_mb": round((folder / "model.safetensors").stat().st_size / 1e6, 3),
            "folder_mb": round(sum(f.stat().st_size for f in folder.iterdir()) / 1e6, 3)}


def load(folder: Path):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()


# -------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every step count (smoke tests)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--results-dir", type=Path, default=None)
    ap.add_argument("--eval", type=int, default=256, help="held-out examples for loss / greedy / alpha")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = machine()
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def scaled(s: TrainSpec) -> TrainSpec:
        steps = max(1, round(s.steps * args.scale))
        return TrainSpec(steps, s.batch, s.lr, min(s.warmup, max(1, steps // 4)), s.weight_decay)

    tt, dt = scaled(TARGET_TRAIN), scaled(DRAFT_TRAIN)
    ds = scaled(TrainSpec(DISTILL["steps"], DISTILL["batch"], DISTILL["lr"], 10, 0.0))
    log(f"command: {env['command']}")
    train, held = examples("train", args.seed), examples("heldout", args.seed + 1)
    held = held[: args.eval]
    src_len = [len(s) for s, _ in train]
    tgt_len = [len(t) for _, t in train]
    log(f"task: {len(train)} train pairs, {len(held)} held-out; source bytes median "
        f"{np.median(src_len):.0f}, target bytes median {np.median(tgt_len):.0f}")
    tok = ByteTokenizer()
    timing, curves = {}, {}

    torch.manual_seed(args.seed)
    target = bart(TARGET)
    log(f"target {TARGET}: {n_params(target) / 1e6:.3f} M params; {tt}")
    t0 = time.perf_counter()
    curves["target"] = train_ce(target, train, tt, args.seed, log, "target")
    timing["target_train_s"] = time.perf_counter() - t0
    for p in target.parameters():
        p.requires_grad_(False)

    torch.manual_seed(args.seed + 1)
    draft = bart(DRAFT)
    log(f"draft {DRAFT}: {n_params(draft) / 1e6:.3f} M params; {dt}")
    t0 = time.perf_counter()
    curves["draft_train"] = train_ce(draft, train, dt, args.seed + 1, log, "draft")
    timing["draft_train_s"] = time.perf_counter() - t0

    # distillation data: the target's temperature-1 translations of train sources; alpha is
    # measured on its translations of held-out sources
    t0 = time.perf_counter()
    pool = sample_targets(target, [s for s, _ in train[: ds.steps * ds.batch // 2 + 64]], args.seed + 2)
    held_samples = sample_targets(target, [s for s, _ in held], args.seed + 3)
    timing["sample_s"] = time.perf_counter() - t0
    before = alpha_on(target, draft, held_samples)
    loss_before = heldout_loss(draft, held)
    log(f"draft before distillation: alpha {before:.4f}, held-out loss {loss_before:.4f}")
    t0 = time.perf_counter()
    curves["distill"] = distill_seq2seq(target, draft, pool, ds, DISTILL["divergence"],
                                        args.seed + 4, log)
    timing["distill_s"] = time.perf_counter() - t0

    info = {"target": save(target, args.out / "target", tok),
            "draft": save(draft, args.out / "draft", tok)}
    target, draft = load(args.out / "target"), load(args.out / "draft")
    after = alpha_on(target, draft, held_samples)
    log(f"draft after distillation: alpha {after:.4f}")
    lat = {f"{name}_{n}tok_ms": round(step_ms(m, n), 4)
           for name, m in (("target", target), ("draft", draft)) for n in (1, 5)}
    c = lat["draft_1tok_ms"] / lat["target_1tok_ms"]
    scores = {"target": greedy_scores(target, held), "draft": greedy_scores(draft, held)}
    losses = {"target": heldout_loss(target, held), "draft": heldout_loss(draft, held),
              "draft_before_distill": loss_before}
    log(f"held-out: loss {losses}, greedy {scores}, c {c:.4f}")
    from speculate.theory import optimal_lookahead, speedup

    report = {
        "command": env["command"], "seed": args.seed,
        "out": relative(args.out),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__,
                        "threads": args.threads},
        "machine": env,
        "task": {"name": "pyglot", "train_pairs": len(train), "heldout_pairs": len(held),
                 "source_bytes_median": float(np.median(src_len)),
                 "target_bytes_median": float(np.median(tgt_len)),
                 "example": {"source": held[0][0].decode(), "target": held[0][1].decode()}},
        "target": {"arch": "BartForConditionalGeneration", "config": asdict(TARGET),
                   "params": n_params(target), "train": asdict(tt), **info["target"]},
        "draft": {"arch": "BartForConditionalGeneration", "config": asdict(DRAFT),
                  "params": n_params(draft), "train": asdict(dt), **info["draft"]},
        "distill": {**asdict(ds), "divergence": DISTILL["divergence"], "pool": len(pool),
                    "method": "TV(p, q) per decoder state (speculate.domains.text.training.distill."
                    "divergence_loss), teacher-forced on the target's temperature-1 samples"},
        "heldout_loss_nats_per_byte": {k: round(v, 4) for k, v in losses.items()},
        "greedy": scores,
        "alpha": {"before_distill": round(before, 4), "after_distill": round(after, 4),
                  "definition": "mean over decoder states of sum_x min(p(x), q(x)) at temperature "
                  "1, on the target's sampled translations of the held-out sources"},
        "latency_batch1": {**lat, "c": round(c, 4), "note": "median of 200 decoder forwards, "
                           "96-byte source, 48-token KV cache, 1 thread; c = draft / target"},
        "theory": {"speedup_by_lookahead": {k: round(speedup(after, k, c), 3) for k in range(1, 9)},
                   "optimal_lookahead": optimal_lookahead(after, c)},
        "timing": {**{k: round(v, 1) for k, v in timing.items()},
                   "total_s": round(time.perf_counter() - t_start, 1)},
        "curves": curves,
    }
    write("text_train_seq2seq", report, markdown(report), folder=args.results_dir)
    log(f"wrote text_train_seq2seq.json/.md; total {report['timing']['total_s']:.0f}s")
    return report


def markdown(r: dict) -> str:
    t, d, L, g, a, lat = (r["target"], r["draft"], r["heldout_loss_nats_per_byte"], r["greedy"],
                          r["alpha"], r["latency_batch1"])

    def arch(m):
        c = m["config"]
        return f"{c['encoder_layers']}+{c['decoder_layers']} x {c['dim']} ({c['heads']}, {c['ffn']})"

    ks = r["theory"]["speedup_by_lookahead"]
    ex = r["task"]["example"]
    return "\n".join([
        "# Encoder-decoder pair (BART, pyglot translation): training record", "",
        f"Command: `{r['command']}` (seed {r['seed']}, {r['environment']['threads']} thread, "
        f"torch {r['environment']['torch']}, transformers {r['environment']['transformers']}).", "",
        f"Machine: {describe(r['machine'])}.", "",
        f"Task: Python standard-library lines (1-3 consecutive, 48-112 bytes) -> a pseudo-language "
        f"(keywords renamed, snake_case -> camelCase, `for`/`if`/assignment reordered); "
        f"{r['task']['train_pairs']:,} train pairs, {r['task']['heldout_pairs']} held-out "
        f"(held-out files); median source {r['task']['source_bytes_median']:.0f} bytes, target "
        f"{r['task']['target_bytes_median']:.0f} bytes. Example:", "",
        "```", ex["source"], "```", "->", "```", ex["target"], "```", "",
        "| model | enc+dec layers x d (heads, ffn) | params | file MB | held-out nats/byte | "
        "greedy exact match | greedy char accuracy |",
        "|---|---|---|---|---|---|---|",
        *[f"| {n} | {arch(m)} | {m['params']:,} | {m['safetensors_mb']} | {L[n]} | "
          f"{g[n]['exact_match']:.3f} | {g[n]['char_accuracy']:.3f} |"
          for n, m in (("target", t), ("draft", d))],
        f"| draft before distillation | | | | {L['draft_before_distill']} | | |", "",
        f"Acceptance alpha at temperature 1 ({a['definition']}): before distillation "
        f"{a['before_distill']:.4f}, after {a['after_distill']:.4f}.", "",
        f"Distillation: {r['distill']['method']}; {r['distill']['steps']} steps of "
        f"{r['distill']['batch']}, lr {r['distill']['lr']}, pool of {r['distill']['pool']} samples.",
        f"Training: target {t['train']}; draft {d['train']}; AdamW (0.9, 0.98), warm-up then "
        "cosine to 10%, clip 1.", "",
        f"Batch-1 decoder step (1 thread): target {lat['target_1tok_ms']} ms (5 tokens "
        f"{lat['target_5tok_ms']} ms), draft {lat['draft_1tok_ms']} ms; c = {lat['c']} "
        f"({lat['note']}).", "",
        "Theory (1 - a^(k+1)) / ((1 - a)(k c + 1)) at the measured alpha and c:", "",
        "| k | " + " | ".join(map(str, ks)) + " |", "|---|" + "---|" * len(ks),
        "| speedup | " + " | ".join(f"{v:.2f}" for v in ks.values()) + " |", "",
        f"Wall time (s): {r['timing']}.", ""])


if __name__ == "__main__":
    main()
