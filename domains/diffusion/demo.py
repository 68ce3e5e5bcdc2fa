"""``speculate demo image``: handwritten digits sampled plainly and speculatively, side by side.

The embedded digits pair (``digits.load_digits_pair``: a class-conditional 4.3M-parameter MLP
denoiser and its distilled 64k-parameter draft, DDPM with T = 1000 on scikit-learn's 8x8 digits)
samples one grid of digits with plain ancestral sampling (one target call per step) and one
with ``speculative_sample`` (the same law, fewer sequential target calls), writes both grids side
by side to a PNG, and prints:
  1. the grid run: sequential target calls per sample (plain: T = 1000), acceptance by time step
     (it drops over the last, nearly noise-free steps) and wall clock next to theory;
  2. one digit at a time (batch 1, where a CPU gains most: scoring 9 states costs little more
     than one): wall clock plain vs speculative with the trained draft and with ``"frozen"``.
The two grids are different samples of the same law (the seeds differ), not the same images.
``python benchmarks/diffusion/bench_diffusion.py`` measures all of this properly.

Example:
    >>> from speculate.domains.diffusion.demo import demo
    >>> demo(["--quick", "--out", "digits.png"])           # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import itertools
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from speculate import theory

from .api import Sampling, sample, speculative_sample

BANDS = (1000, 800, 600, 400, 200, 100, 50, 20, 10, 1)  #: the time ranges acceptance is printed for


def grid(x: np.ndarray, cols: int = 10, scale: int = 4, pad: int = 1) -> np.ndarray:
    """Samples [B, 1, 8, 8] in [-1, 1] as one uint8 image (white digits on black, ``cols`` per row,
    each pixel ``scale`` x ``scale``, ``pad`` pixels between digits)."""
    from .digits import to_images

    img = to_images(x) / 16.0  # [B, 8, 8] in 0..1
    B = img.shape[0]
    rows = -(-B // cols)
    cell = 8 * scale + pad
    out = np.zeros((rows * cell + pad, cols * cell + pad))
    for i in range(B):
        r, c = divmod(i, cols)
        block = np.kron(img[i], np.ones((scale, scale)))
        out[pad + r * cell: pad + r * cell + 8 * scale, pad + c * cell: pad + c * cell + 8 * scale] = block
    return np.round(255 * out).astype(np.uint8)


def write_png(path: str | Path, image: np.ndarray) -> None:
    """A greyscale uint8 image [H, W] as an 8-bit PNG (zlib only: no imaging library needed)."""
    H, W = image.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(row) for row in np.ascontiguousarray(image, np.uint8))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    Path(path).write_bytes(png)


def save_side_by_side(path: str | Path, left: np.ndarray, right: np.ndarray, titles: tuple[str, str]) -> str:
    """Both grids in one PNG: with matplotlib (titles) when it is installed, else the plain zlib
    writer (grids only, a grey bar between them). Returns how it was written."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        bar = np.full((left.shape[0], 8), 128, np.uint8)
        write_png(path, np.hstack([left, bar, right]))
        return "zlib PNG writer (matplotlib not installed: no titles)"
    h, w = left.shape
    fig = Figure(figsize=(2 * w / 60 + 0.4, h / 60 + 0.7))
    for i, (img, title) in enumerate(zip((left, right), titles, strict=True)):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.imshow(img, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return "matplotlib"


def acceptance_bands(stats: Any, bands: tuple[int, ...] = BANDS) -> list[tuple[str, float, float, int]]:
    """(time range, acceptance, mean lookahead, drafted steps verified) over ranges of the model
    time t: kept / (kept + rejected) drafted steps whose time lies in the range (the per-draft
    acceptance, as ``DiffusionStats.acceptance_by_step``), the mean k of the rounds starting there."""
    t = stats.step_times
    out = []
    for hi, lo in itertools.pairwise(bands):
        at = (t <= hi) & (t > lo) if lo > bands[-1] else (t <= hi) & (t >= lo)
        p, a = int(stats.proposed_by_step[at].sum()), int(stats.accepted_by_step[at].sum())
        tested = a + int(stats.rejected_by_step[at].sum())
        rounds = stats.rounds_by_step[at].sum()
        k = stats.lookahead_by_step[at].sum() / rounds if rounds else float("nan")
        out.append((f"{hi}-{lo if lo == bands[-1] else lo + 1}", a / tested if tested else float("nan"), k, p))
    return out


def _timed(fn: Any) -> tuple[Sampling, float]:
    t = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t


def _theory(spec: Any, plain_call: float) -> tuple[float, float]:
    """(textbook, with batch cost): expected_tokens(alpha, k) / (k c + 1) with the measured alpha,
    mean k and c; and the same with the measured cost r of a speculative target call relative
    to a plain one in the denominator, k c + r."""
    s = spec.stats
    k = max(1, round(sum(k * n for k, n in s.lookahead_counts.items()) / max(1, s.rounds)))
    alpha = min(max(s.alpha, 0.0), 1.0) if s.rejections + s.accepted else 0.0
    c = (s.draft_time / s.draft_calls) / plain_call if s.draft_calls else 0.0
    r = (s.target_time / s.target_calls) / plain_call
    e = theory.expected_tokens(alpha, k)
    return e / (k * c + 1.0), e / (k * c + r)


def _lookahead(v: str) -> int | str:
    return v if v == "auto" else int(v)


def _one_thread(torch: Any) -> None:
    """One torch thread, set after numba's threading layer has started (starting it resets the
    OpenMP thread count that torch shares: a parallel kernel launched later would undo the setting)."""
    import numba

    numba.get_num_threads()
    torch.set_num_threads(1)


def demo(argv: list[str] | None = None) -> int:
    """Run the image demo; returns 0 (the exit status)."""
    ap = argparse.ArgumentParser(prog="speculate demo image", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 digits and one single-digit timing")
    ap.add_argument("--samples", type=int, default=None, help="digits in the grid (default 20, quick 10)")
    ap.add_argument("--lookahead", default=None,
                    help="an int or 'auto' (default: 4 for the grid, where one CPU thread pays for every state "
                         "scored, 8 one digit at a time)")
    ap.add_argument("--guidance", type=float, default=None, help="classifier-free guidance scale (default: none)")
    ap.add_argument("--single", type=int, default=None, help="single-digit runs timed (default 3, quick 1)")
    ap.add_argument("--out", default="speculate_digits.png",
                    help="the PNG to write (default: speculate_digits.png in the working directory; its full path is "
                         "printed)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    B = args.samples or (10 if args.quick else 20)
    single = args.single if args.single is not None else (1 if args.quick else 3)
    k: int | str = 4 if args.lookahead is None else _lookahead(args.lookahead)
    k1: int | str = 8 if args.lookahead is None else _lookahead(args.lookahead)

    import torch

    from .digits import NULL_LABEL, load_digits_pair

    threads = torch.get_num_threads()
    _one_thread(torch)
    try:
        t_start = time.perf_counter()
        sched, target, draft = load_digits_pair()
        T = sched.timesteps
        labels = np.arange(B) % 10
        guide = dict(labels=labels)
        if args.guidance is not None:
            guide.update(guidance=args.guidance, null_label=NULL_LABEL)
        shape = (B, 1, 8, 8)
        print(f"speculate demo image: DDPM (T = {T}) on 8x8 digits, a class-conditional MLP target "
              f"({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M parameters) and a distilled draft "
              f"({sum(p.numel() for p in draft.parameters()) / 1e3:.0f}k), CPU, 1 torch thread")
        speculative_sample(sched, target, draft, (2, 1, 8, 8), lookahead=4, labels=[0, 1], rng=0)  # warm up
        plain, tp = _timed(lambda: sample(sched, target, shape, rng=args.seed, **guide))
        spec, ts = _timed(lambda: speculative_sample(sched, target, draft, shape, lookahead=k,
                                                     rng=args.seed + 1, **guide))
        s = spec.stats
        per_sample = s.row_rounds / B
        textbook, refined = _theory(spec, plain.stats.target_time / plain.stats.target_calls)
        guided = "" if args.guidance is None else f", guidance {args.guidance:g}"
        print(f"1) a grid of {B} digits (labels 0-9{guided}), "
              f"draft = the distilled MLP, lookahead {k}:")
        print(f"   sequential target calls: plain {T}, speculative {s.target_calls} ({s.calls_per_step:.3f} T; "
              f"{per_sample:.0f} per sample), alpha {s.alpha:.3f}, {s.tokens_per_call:.2f} steps per call")
        print(f"   wall clock: plain {tp:.2f} s, speculative {ts:.2f} s: {tp / ts:.2f}x (theory "
              f"{textbook:.2f}x if a call on {B} x (k+1) states cost one on {B}; {refined:.2f}x with its "
              "measured cost)")
        print("   acceptance by time step (drafted steps kept / tested; mean lookahead of rounds starting there):")
        bands = acceptance_bands(s)
        print("     t      " + " ".join(f"{b[0]:>9s}" for b in bands))
        print("     kept   " + " ".join(f"{b[1]:9.3f}" for b in bands))
        print("     k      " + " ".join(f"{b[2]:9.1f}" for b in bands))
        how = save_side_by_side(args.out, grid(plain.x), grid(spec.x),
                                (f"plain: {T} target calls", f"speculative: {s.target_calls} target calls"))
        print(f"   wrote {Path(args.out).resolve()} (plain left, speculative right; {how})")

        if single:
            one = dict(labels=[3], **{k_: v for k_, v in guide.items() if k_ != "labels"})
            times = {"plain": 0.0, "draft": 0.0, "frozen": 0.0}
            calls = {"draft": 0, "frozen": 0}
            for i in range(single):
                for name in times:
                    if name == "plain":
                        _, dt = _timed(lambda i=i: sample(sched, target, (1, 1, 8, 8), rng=100 + i, **one))
                    else:
                        d = draft if name == "draft" else "frozen"
                        r, dt = _timed(lambda i=i, d=d: speculative_sample(sched, target, d, (1, 1, 8, 8),
                                                                           lookahead=k1, rng=200 + i, **one))
                        calls[name] += r.stats.target_calls
                    times[name] += dt
            print(f"2) one digit at a time ({single} run{'s' if single > 1 else ''} each, lookahead {k1}): plain "
                  f"{1e3 * times['plain'] / single / T:.2f} ms per step")
            for name in ("draft", "frozen"):
                print(f"   {name:6s}: {calls[name] / single:.0f} target calls per sample "
                      f"({calls[name] / single / T:.3f} T), {1e3 * times[name] / single / T:.2f} ms per step: "
                      f"{times['plain'] / times[name]:.2f}x plain")
        print(f"done in {time.perf_counter() - t_start:.1f} s (same law as plain sampling: tests/diffusion; "
              "full measurements: benchmarks/diffusion/bench_diffusion.py)")
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(demo())
