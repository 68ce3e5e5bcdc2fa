"""Train the embedded speech pair: a small Whisper target from scratch and a distilled draft.

    python benchmarks/speech/make_corpus.py       # espeak-ng corpus -> scratch/speech (once)
    python benchmarks/speech/train_whisper.py     # -> domains/text/examples/weights/speech-{target,draft,heldout}

Stages: (1) train a ``WhisperForConditionalGeneration`` target (byte vocabulary of
``ByteTokenizer``; log-mel features of ``speculate.domains.text.examples.speech``: 80 bins, 3 s chunks) on the
synthesized corpus: next-byte cross-entropy with teacher forcing plus an auxiliary CTC loss on the
encoder output (a linear head used in training only, which makes the decoder's alignment come
sooner), SpecAugment-style time and frequency masks; (2) the draft: a ``WhisperForCausalLM`` with
the target's embeddings, head and 1 or 2 of its decoder layers (first, or first and last), reading
the target's encoder output (distil-whisper style; the encoder is not copied), distilled toward the
target (forward KL at temperature 1 on teacher-forced transcripts, the target frozen); every
``--draft-layers`` choice is tried and the one with the best theoretical speedup at the measured
acceptance and cost ratio is kept; (3) save both (float16 where the size budget needs it) and the
held-out set, reload what was saved and measure it: greedy word error rate of the target and of
the draft on its own, acceptance alpha = E[sum min(p, q)] at temperature 1, batch-1 decoder step
latencies and their ratio c. Results: benchmarks/results/speech_train.{json,md}. One CPU thread
(``--threads``), seeded.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # report.py
sys.path.insert(0, str(ROOT / "benchmarks" / "speech"))  # make_corpus.py

from make_corpus import CHARSET  # noqa: E402
from make_corpus import load as load_corpus  # noqa: E402
from report import RESULTS, describe, machine, write  # noqa: E402
from speculate.domains.text.examples import speech  # noqa: E402
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer  # noqa: E402
from speculate.domains.text.models.transformers_api import cache_kwarg, output_cache  # noqa: E402

CHARS = sorted(CHARSET)  # CTC classes: 0 = blank, then these


@dataclass
class ModelSpec:
    d_model: int = 144
    encoder_layers: int = 3
    decoder_layers: int = 8
    heads: int = 4
    ffn: int = 576
    max_target_positions: int = 40


@dataclass
class TrainSpec:
    steps: int = 1800
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.05
    ctc_weight: float = 0.5
    freq_masks: int = 1
    freq_width: int = 8
    time_masks: int = 1
    time_width: int = 15


@dataclass
class DistillSpec:
    steps: int = 300
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 30


def whisper_config(spec: ModelSpec, decoder_layers: int | None = None):
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=VOCAB_SIZE, num_mel_bins=speech.N_MELS, d_model=spec.d_model,
        encoder_layers=spec.encoder_layers, decoder_layers=decoder_layers or spec.decoder_layers,
        encoder_attention_heads=spec.heads, decoder_attention_heads=spec.heads,
        encoder_ffn_dim=spec.ffn, decoder_ffn_dim=spec.ffn,
        max_source_positions=speech.MAX_SAMPLES // speech.HOP_LENGTH // 2,
        max_target_positions=spec.max_target_positions, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID, begin_suppress_tokens=None,
        suppress_tokens=None, forced_decoder_ids=None, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, tie_word_embeddings=True, use_cache=True)


def generation_config():
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                            pad_token_id=PAD_ID, max_length=40)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def text_batch(texts: list[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoder inputs BOS + bytes, padded with PAD; labels bytes + EOS, padded with -100)."""
    ids = [list(t.encode()) for t in texts]
    T = max(len(i) for i in ids) + 1
    if T > max_len:
        raise ValueError(f"a text of {T - 1} bytes does not fit {max_len} positions")
    inp = torch.full((len(ids), T), PAD_ID, dtype=torch.long)
    lab = torch.full((len(ids), T), -100, dtype=torch.long)
    for r, i in enumerate(ids):
        inp[r, :len(i) + 1] = torch.tensor([BOS_ID, *i])
        lab[r, :len(i) + 1] = torch.tensor([*i, EOS_ID])
    return inp, lab


def spec_augment(x: torch.Tensor, spec: TrainSpec, gen: torch.Generator) -> torch.Tensor:
    x = x.clone()
    B, M, T = x.shape
    fill = x.mean()
    for b in range(B):
        for _ in range(spec.freq_masks):
            w = int(torch.randint(0, spec.freq_width + 1, (1,), generator=gen))
            f0 = int(torch.randint(0, M - w + 1, (1,), generator=gen))
            x[b, f0:f0 + w, :] = fill
        for _ in range(spec.time_masks):
            w = int(torch.randint(0, spec.time_width + 1, (1,), generator=gen))
            t0 = int(torch.randint(0, T - w + 1, (1,), generator=gen))
            x[b, :, t0:t0 + w] = fill
    return x


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def optimizer(params, lr: float, weight_decay: float):
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))


def train_target(model, feats: torch.Tensor, texts: list[str], spec: TrainSpec, seed: int, log,
                 evaluate=None, eval_every: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    d = model.config.d_model
    ctc_head = torch.nn.Linear(d, len(CHARS) + 1)
    opt = optimizer([*model.parameters(), *ctc_head.parameters()], spec.lr, spec.weight_decay)
    char_id = {c: i + 1 for i, c in enumerate(CHARS)}
    curve, evals, t0, acc = [], [], time.perf_counter(), np.zeros(2)
    model.train()
    for step in range(spec.steps):
        lr = lr_at(step, spec.lr, spec.warmup, spec.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, feats.shape[0], (spec.batch,), generator=gen)
        x = spec_augment(feats[idx].float(), spec, gen)
        batch_texts = [texts[i] for i in idx.tolist()]
        inp, lab = text_batch(batch_texts, model.config.max_target_positions)
        out = model(input_features=x, decoder_input_ids=inp, use_cache=False)
        ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), lab.reshape(-1), ignore_index=-100)
        enc = out.encoder_last_hidden_state  # [B, S, d]
        logp = F.log_softmax(ctc_head(enc), dim=-1).transpose(0, 1)  # [S, B, C]
        tgt = [torch.tensor([char_id[c] for c in t]) for t in batch_texts]
        ctc = F.ctc_loss(logp, torch.cat(tgt), torch.full((len(tgt),), enc.shape[1], dtype=torch.long),
                         torch.tensor([len(t) for t in tgt]), blank=0, zero_infinity=True)
        loss = ce + spec.ctc_weight * ctc
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += [ce.item(), ctc.item()]
        if (step + 1) % 25 == 0 or step + 1 == spec.steps:
            n = 25 if (step + 1) % 25 == 0 else (step + 1) % 25
            curve.append((step + 1, round(acc[0] / n, 4), round(acc[1] / n, 4)))
            el = time.perf_counter() - t0
            log(f"  step {step + 1}/{spec.steps} ce {curve[-1][1]:.4f} ctc {curve[-1][2]:.3f} "
                f"lr {lr:.2e} {el:.0f}s ({el / (step + 1):.2f}s/step)")
            acc[:] = 0
        if evaluate is not None and eval_every and (step + 1) % eval_every == 0 and step + 1 < spec.steps:
            model.eval()
            wer = evaluate(model)
            evals.append((step + 1, round(wer, 4)))
            log(f"  step {step + 1}: held-out WER {wer:.4f}")
            model.train()
    model.eval()
    return {"curve": curve, "heldout_wer_during_training": evals}


@torch.inference_mode()
def encoder_states(model, feats: torch.Tensor, batch: int = 64) -> torch.Tensor:
    out = []
    for i in range(0, feats.shape[0], batch):
        out.append(model.model.encoder(feats[i:i + batch].float()).last_hidden_state)
    return torch.cat(out)


@torch.inference_mode()
def teacher_logits(model, enc: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    return model.proj_out(model.model.decoder(input_ids=inp, encoder_hidden_states=enc).last_hidden_state)


def make_draft(target, spec: ModelSpec, layers: tuple[int, ...]):
    """A ``WhisperForCausalLM`` with the target's embeddings, final norm, head and ``layers``."""
    from transformers import WhisperForCausalLM

    draft = WhisperForCausalLM(whisper_config(spec, decoder_layers=len(layers)))
    src = target.model.decoder
    dst = draft.model.decoder
    dst.embed_tokens.load_state_dict(src.embed_tokens.state_dict())
    dst.embed_positions.load_state_dict(src.embed_positions.state_dict())
    dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
    for i, j in enumerate(layers):
        dst.layers[i].load_state_dict(src.layers[j].state_dict())
    draft.tie_weights()
    assert draft.proj_out.weight is dst.embed_tokens.weight
    return draft


def distill(target, draft, enc: torch.Tensor, texts: list[str], spec: DistillSpec, seed: int, log) -> list:
    """Forward KL(target || draft) at temperature 1 on teacher-forced transcripts."""
    gen = torch.Generator().manual_seed(seed)
    opt = optimizer(draft.parameters(), spec.lr, 0.0)
    curve, acc, t0 = [], 0.0, time.perf_counter()
    draft.train()
    for step in range(spec.steps):
        lr = lr_at(step, spec.lr, spec.warmup, spec.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, enc.shape[0], (spec.batch,), generator=gen)
        inp, lab = text_batch([texts[i] for i in idx.tolist()], draft.config.max_target_positions)
        e = enc[idx].float()
        p_log = F.log_softmax(teacher_logits(target, e, inp), dim=-1)
        q_log = F.log_softmax(draft(input_ids=inp, encoder_outputs=(e,), use_cache=False).logits, dim=-1)
        mask = (lab != -100).float()
        kl = ((p_log.exp() * (p_log - q_log)).sum(-1) * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        acc += kl.item()
        if (step + 1) % 50 == 0 or step + 1 == spec.steps:
            n = 50 if (step + 1) % 50 == 0 else (step + 1) % 50
            curve.append((step + 1, round(acc / n, 5)))
            el = time.perf_counter() - t0
            log(f"  distill step {step + 1}/{spec.steps} kl {curve[-1][1]:.5f} {el:.0f}s")
            acc = 0.0
    draft.eval()
    return curve


@torch.inference_mode()
def alpha(target, draft, enc: torch.Tensor, texts: list[str]) -> float:
    """E[sum_x min(p, q)] over the teacher-forced positions of ``texts`` (temperature 1)."""
    inp, lab = text_batch(texts, target.config.max_target_positions)
    p = F.softmax(teacher_logits(target, enc, inp), dim=-1)
    q = F.softmax(draft(input_ids=inp, encoder_outputs=(enc,)).logits, dim=-1)
    mask = lab != -100
    return float(torch.minimum(p, q).sum(-1)[mask].mean())


@torch.inference_mode()
def greedy_target(target, feats: torch.Tensor, max_new: int = 38) -> list[str]:
    ids = target.generate(input_features=feats.float(), max_new_tokens=max_new, do_sample=False)
    return decode(ids.tolist())


@torch.inference_mode()
def greedy_draft(draft, enc: torch.Tensor, max_new: int = 38) -> list[str]:
    """The draft's own greedy transcripts (full forwards, no cache: short sequences)."""
    ids = torch.full((enc.shape[0], 1), BOS_ID, dtype=torch.long)
    done = torch.zeros(enc.shape[0], dtype=torch.bool)
    for _ in range(max_new):
        nxt = draft(input_ids=ids, encoder_outputs=(enc,)).logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD_ID), nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == EOS_ID
        if done.all():
            break
    return decode(ids[:, 1:].tolist())


def decode(rows: list[list[int]]) -> list[str]:
    out = []
    for row in rows:
        b = bytearray()
        for t in row:
            if t == EOS_ID:
                break
            if t < 256:
                b.append(t)
        out.append(b.decode("utf-8", errors="replace"))
    return out


@torch.inference_mode()
def step_latency_ms(model, enc: torch.Tensor, is_draft: bool, n: int = 24, reps: int = 30) -> float:
    """Median ms of one batch-1 cached decoder step (cross-attention keys cached), tokens 8..n."""
    from transformers import DynamicCache, EncoderDecoderCache

    ts = []
    for _ in range(reps):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        ids = torch.tensor([[BOS_ID]])
        for t in range(n):
            t0 = time.perf_counter()
            if is_draft:
                out = model(input_ids=ids, encoder_outputs=(enc,), use_cache=True, **{cache_kwarg(model): cache})
            else:
                out = model(encoder_outputs=(enc,), decoder_input_ids=ids, **{cache_kwarg(model): cache},
                            use_cache=True)
            if t >= 8:
                ts.append(time.perf_counter() - t0)
            cache = output_cache(out)
            ids = torch.tensor([[97 + t % 26]])
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def save_model(model, folder: Path, max_mb: float, extra=None) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    dtype = torch.float32 if 4 * n_params(model) / 1e6 <= max_mb * 0.995 else torch.float16
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    copy.generation_config = generation_config()
    copy.to(dtype).save_pretrained(folder)
    cfg_file = folder / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["dtype"] = "float32"
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    ByteTokenizer().save_pretrained(folder)
    if extra is not None:
        extra(folder)
    mb = (folder / "model.safetensors").stat().st_size / 1e6
    if mb > max_mb:
        raise RuntimeError(f"{folder} weighs {mb:.2f} MB > {max_mb} MB")
    return {"stored_dtype": str(dtype).removeprefix("torch."), "safetensors_mb": round(mb, 3),
            "folder_mb": round(sum(f.stat().st_size for f in folder.iterdir()) / 1e6, 3)}


def save_heldout(folder: Path, waves: list[np.ndarray], texts: list[str], meta: dict) -> dict:
    from safetensors.numpy import save_file

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    offsets = np.zeros(len(waves) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(w) for w in waves])
    audio = np.concatenate([np.round(w * 32767).astype(np.int16) for w in waves])
    save_file({"audio": audio, "offsets": offsets}, str(folder / "audio.safetensors"))
    (folder / "texts.json").write_text(json.dumps({"texts": texts, "sampling_rate": speech.SAMPLING_RATE,
                                                   "corpus": meta}, indent=1) + "\n")
    return {"n": len(texts), "folder_mb": round(sum(f.stat().st_size for f in folder.iterdir()) / 1e6, 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "scratch" / "speech")
    ap.add_argument("--out", type=Path, default=ROOT / "domains" / "text" / "examples" / "weights")
    ap.add_argument("--results", default="speech_train")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="target training steps")
    ap.add_argument("--distill-steps", type=int, default=None)
    ap.add_argument("--decoder-layers", type=int, default=None, help="target decoder layers (default 8)")
    ap.add_argument("--draft-layers", default="1,2", help="draft sizes to try (decoder layers)")
    ap.add_argument("--max-train", type=int, default=None, help="use the first N training utterances")
    ap.add_argument("--eval-every", type=int, default=400)
    ap.add_argument("--max-mb", type=float, default=20.0, help="budget of target + draft + held-out")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/speech/train_whisper.py", *argv])
    from transformers import WhisperForCausalLM, WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    env = machine()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    log(f"command: {command}")
    mspec, tspec, dspec = ModelSpec(), TrainSpec(), DistillSpec()
    if args.decoder_layers:
        mspec.decoder_layers = args.decoder_layers
    if args.steps:
        tspec.steps = args.steps
        tspec.warmup = min(tspec.warmup, max(1, args.steps // 4))
    if args.distill_steps:
        dspec.steps = args.distill_steps
        dspec.warmup = min(dspec.warmup, max(1, args.distill_steps // 4))
    tr_w, tr_t, tr_meta = load_corpus(args.corpus / "train.npz")
    he_w, he_t, he_meta = load_corpus(args.corpus / "heldout.npz")
    if args.max_train:
        tr_w, tr_t = tr_w[:args.max_train], tr_t[:args.max_train]
    t0 = time.perf_counter()
    tr_x = torch.cat([speech.features(tr_w[i:i + 256]) for i in range(0, len(tr_w), 256)])
    he_x = speech.features(he_w)
    log(f"corpus: train {len(tr_t)} utterances ({sum(map(len, tr_w)) / 16000 / 60:.1f} min), "
        f"held-out {len(he_t)}; features {tuple(tr_x.shape)} in {time.perf_counter() - t0:.0f}s")
    timing = {}

    def heldout_wer(m) -> float:
        return speech.word_error_rate(he_t, greedy_target(m, he_x))

    # (1) target
    torch.manual_seed(args.seed)
    target = WhisperForConditionalGeneration(whisper_config(mspec))
    with torch.no_grad():  # He init of the convolutions: their output on the scale of the positions
        for conv in (target.model.encoder.conv1, target.model.encoder.conv2):
            torch.nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            conv.bias.zero_()
    target.generation_config = generation_config()
    log(f"target: {mspec} {n_params(target) / 1e6:.3f} M params; training {tspec}")
    t0, c0 = time.perf_counter(), time.process_time()
    tr = train_target(target, tr_x, tr_t, tspec, args.seed, log, heldout_wer, args.eval_every)
    timing["target_train_s"] = time.perf_counter() - t0
    timing["target_train_cpu_s"] = time.process_time() - c0
    for p in target.parameters():
        p.requires_grad_(False)
    budget_t = args.max_mb - 8.0  # room for the draft and the held-out audio
    info_t = save_model(target, args.out / "speech-target", budget_t,
                        extra=lambda f: speech.feature_extractor().save_pretrained(f))
    target = WhisperForConditionalGeneration.from_pretrained(args.out / "speech-target",
                                                             dtype=torch.float32).eval()
    wer_t = heldout_wer(target)
    log(f"target saved ({info_t}); held-out WER {wer_t:.4f}")

    # (2) drafts
    t0 = time.perf_counter()
    enc_tr = encoder_states(target, tr_x)
    enc_he = encoder_states(target, he_x)
    timing["encoder_states_s"] = time.perf_counter() - t0
    lat_t = step_latency_ms(target, enc_he[:1], is_draft=False)
    from speculate.theory import optimal_lookahead, speedup

    trials, best = {}, None
    for n_layers in (int(x) for x in args.draft_layers.split(",")):
        layers = (0,) if n_layers == 1 else (0, mspec.decoder_layers - 1)
        torch.manual_seed(args.seed + 1)
        draft = make_draft(target, mspec, layers)
        a0 = alpha(target, draft, enc_he, he_t)
        log(f"draft {layers}: {n_params(draft) / 1e6:.3f} M params, alpha before distillation {a0:.4f}")
        t0 = time.perf_counter()
        curve = distill(target, draft, enc_tr, tr_t, dspec, args.seed + 2, log)
        el = time.perf_counter() - t0
        a1 = alpha(target, draft, enc_he, he_t)
        lat_d = step_latency_ms(draft, enc_he[:1], is_draft=True)
        c = lat_d / lat_t
        k = optimal_lookahead(a1, c)
        s = speedup(a1, k, c)
        wer_d = speech.word_error_rate(he_t, greedy_draft(draft, enc_he))
        log(f"draft {layers}: {el:.0f}s alpha {a1:.4f} c {c:.3f} -> k {k} speedup {s:.3f}; "
            f"own greedy WER {wer_d:.4f}")
        trials[str(n_layers)] = {"layers_from_target": list(layers), "params": n_params(draft), "seconds": round(el, 1),
                            "alpha_before": round(a0, 4), "alpha": round(a1, 4), "c": round(c, 4),
                            "optimal_lookahead": k, "theory_speedup": round(s, 3),
                            "draft_greedy_wer": round(wer_d, 4), "curve": curve}
        if best is None or s > trials[str(best[0])]["theory_speedup"]:
            best = (n_layers, {k_: v.clone() for k_, v in draft.state_dict().items()}, draft.config, el)
    timing["distill_s"] = sum(t["seconds"] for t in trials.values())
    draft = WhisperForCausalLM(best[2])
    draft.load_state_dict(best[1])
    draft.tie_weights()
    log(f"keeping the {best[0]}-layer draft")

    # (3) save, reload, measure
    info_h = save_heldout(args.out / "speech-heldout", he_w, he_t, {k: v for k, v in he_meta.items()
                                                                     if k != "params"})
    info_d = save_model(draft, args.out / "speech-draft", args.max_mb - info_t["folder_mb"] - info_h["folder_mb"])
    target, draft, _ = speech.load_speech_pair(path=args.out)
    waves, texts = speech.load_heldout(args.out / "speech-heldout")
    he_x2 = speech.features(waves)
    enc_he = encoder_states(target, he_x2)
    hyp_t = greedy_target(target, he_x2)
    hyp_d = greedy_draft(draft, enc_he)
    wer_t, wer_d = speech.word_error_rate(texts, hyp_t), speech.word_error_rate(texts, hyp_d)
    cer_t = speech.word_error_rate([" ".join(t) for t in texts], [" ".join(h) for h in hyp_t])
    a = alpha(target, draft, enc_he, texts)
    lat_t = step_latency_ms(target, enc_he[:1], is_draft=False)
    lat_d = step_latency_ms(draft, enc_he[:1], is_draft=True)
    c = lat_d / lat_t
    tr_sub = torch.arange(0, len(tr_t), max(1, len(tr_t) // 48))[:48]
    wer_train = speech.word_error_rate([tr_t[i] for i in tr_sub.tolist()], greedy_target(target, tr_x[tr_sub]))
    k = optimal_lookahead(a, c)
    log(f"saved pair: target WER {wer_t:.4f} (CER {cer_t:.4f}, train subset WER {wer_train:.4f}), "
        f"draft WER {wer_d:.4f}, alpha {a:.4f}, c {c:.3f}")
    total_mb = info_t["folder_mb"] + info_d["folder_mb"] + info_h["folder_mb"]
    report = {
        "command": command,
        "seed": args.seed,
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__, "threads": args.threads},
        "machine": env,
        "corpus": {"train": {k: v for k, v in tr_meta.items() if k != "params"} | {"used": len(tr_t)},
                   "heldout": {k: v for k, v in he_meta.items() if k != "params"}},
        "features": {"n_mels": speech.N_MELS, "chunk_seconds": speech.CHUNK_SECONDS, "n_fft": speech.N_FFT,
                     "hop_length": speech.HOP_LENGTH, "frames": int(tr_x.shape[-1])},
        "target": {"config": asdict(mspec), "params": n_params(target), "train": asdict(tspec), **info_t,
                   **tr},
        "draft": {"kept_layers": best[0], "params": n_params(draft), "distill": asdict(dspec),
                  "trials": trials, **info_d},
        "heldout": {**info_h, "total_mb": round(total_mb, 3)},
        "wer": {"target_greedy": round(wer_t, 4), "target_cer": round(cer_t, 4),
                "target_train_subset": round(wer_train, 4), "draft_greedy": round(wer_d, 4)},
        "examples": [{"reference": r, "target": h, "draft": d} for r, h, d in
                     list(zip(texts, hyp_t, hyp_d, strict=True))[:12]],
        "alpha": round(a, 4),
        "latency_batch1": {"target_step_ms": round(lat_t, 4), "draft_step_ms": round(lat_d, 4),
                           "c": round(c, 4)},
        "theory": {"optimal_lookahead": k, "speedup_by_lookahead": {
            str(j): round(speedup(a, j, c), 3) for j in range(1, 9)}},
        "timing": {k_: round(v, 1) for k_, v in timing.items()},
    }
    write(args.results, report, markdown(report), folder=args.results_dir)
    log(f"wrote {args.results_dir / args.results}.json/.md")
    return report


def markdown(r: dict) -> str:
    t, d, w, lat = r["target"], r["draft"], r["wer"], r["latency_batch1"]
    ct, ch = r["corpus"]["train"], r["corpus"]["heldout"]
    c = t["config"]
    rows = [
        "# Speech pair (Whisper architecture): training record",
        "",
        f"Command: `{r['command']}` (seed {r['seed']}, {r['environment']['threads']} thread, "
        f"Python {r['environment']['python']}, torch {r['environment']['torch']}, "
        f"transformers {r['environment']['transformers']}).",
        "",
        f"Machine: {describe(r['machine'])}.",
        "",
        f"Corpus (`{ct['command']}`): espeak-ng {ct['espeak_ng']}, Python {ct['python']} docstrings; "
        f"train {ct['used']} utterances ({ct['seconds'] / 60:.1f} min), held-out {ch['n']} "
        f"({ch['seconds'] / 60:.1f} min), 16 kHz, at most {ct['max_seconds']} s, texts of at most "
        f"{ct['max_chars']} characters over {ct['vocab_size']} docstring words and number words; "
        f"held-out texts never occur in training. Features: {r['features']['n_mels']} mel bins x "
        f"{r['features']['frames']} frames ({r['features']['chunk_seconds']} s chunk).",
        "",
        "| model | architecture | params | stored | file MB |",
        "|---|---|---|---|---|",
        f"| target | `WhisperForConditionalGeneration`: d {c['d_model']}, {c['encoder_layers']} encoder + "
        f"{c['decoder_layers']} decoder layers, {c['heads']} heads, ffn {c['ffn']} | {t['params']:,} | "
        f"{t['stored_dtype']} | {t['safetensors_mb']} |",
        f"| draft | `WhisperForCausalLM`: {d['kept_layers']} decoder layer(s) from the target's "
        f"{d['trials'][str(d['kept_layers'])]['layers_from_target']}, reads the target's encoder | "
        f"{d['params']:,} | {d['stored_dtype']} | {d['safetensors_mb']} |",
        "",
        f"Target + draft + held-out set: {r['heldout']['total_mb']} MB on disk.",
        "",
        "Held-out greedy decoding (the draft alone on the target's encoder output):",
        "",
        "| | word error rate |",
        "|---|---|",
        f"| target | {w['target_greedy']:.4f} (character error rate {w['target_cer']:.4f}; "
        f"{w['target_train_subset']:.4f} on 48 training utterances) |",
        f"| draft alone | {w['draft_greedy']:.4f} |",
        "",
        f"Acceptance alpha = E[sum_x min(p, q)] at temperature 1 on the held-out transcripts "
        f"(teacher forced): {r['alpha']}. Batch-1 cached decoder step (1 thread): target "
        f"{lat['target_step_ms']} ms, draft {lat['draft_step_ms']} ms, c = {lat['c']}.",
        "",
        "Drafts tried:",
        "",
        "| decoder layers | from target layers | alpha before -> after distillation | c | k* | theory speedup |"
        " own WER | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, tr in d["trials"].items():
        rows.append(f"| {n} | {tr['layers_from_target']} | {tr['alpha_before']} -> {tr['alpha']} | {tr['c']} | "
                    f"{tr['optimal_lookahead']} | {tr['theory_speedup']} | {tr['draft_greedy_wer']} | "
                    f"{tr['seconds']} |")
    th = r["theory"]["speedup_by_lookahead"]
    rows += [
        "",
        "Theory (token rule, i.i.d. alpha) for the kept draft: " + ", ".join(
            f"k={k_}: {v}" for k_, v in th.items()) + f"; optimal k = {r['theory']['optimal_lookahead']}.",
        "",
        "Recipe:",
        "",
        f"- target: {t['train']}; AdamW (0.9, 0.98), linear warm-up then cosine to 10%, gradient clip 1; "
        "loss = cross-entropy of the next byte (teacher forcing) + ctc_weight x CTC of a linear head on "
        "the encoder output (training only); SpecAugment-style masks",
        f"- draft: distillation {d['distill']}: forward KL(target || draft) at temperature 1 on "
        "teacher-forced training transcripts, target frozen",
        f"- held-out WER during training: {t['heldout_wer_during_training']}",
        "",
        f"Wall time: {r['timing']}.",
        "",
        "Examples (reference / target / draft alone):",
        "",
    ]
    for e in r["examples"]:
        rows.append(f"- `{e['reference']}` / `{e['target']}` / `{e['draft']}`")
    rows.append("")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
