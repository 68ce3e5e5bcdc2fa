"""The embedded digits pair, the image demo and its PNG.

- the shipped weights: both files together <= 10 MB, the JSON next to them records the recipe,
  the seed and the final losses; the target costs >= 10x the draft per call in multiply-adds per
  sample (the wall-clock ratio, 10-30x on one CPU thread depending on the batch, is measured by
  benchmarks/diffusion/train_digits.py and bench_diffusion.py, not asserted: timings are noisy);
- the pair samples digits speculatively with far fewer sequential target calls (one small run);
- ``speculate demo image`` writes a valid PNG of both grids and prints calls, acceptance by time
  step and the speedup next to theory; the zlib PNG writer alone gives a valid PNG.
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from speculate.domains.diffusion import speculative_sample
from speculate.domains.diffusion.demo import acceptance_bands, grid, write_png
from speculate.domains.diffusion.digits import MODELS, NULL_LABEL, load_digits_pair, to_images

from speculate.cli import main


@pytest.fixture(scope="module")
def pair():
    return load_digits_pair()


def _macs(net) -> int:
    """Multiply-adds of one sample through the network's linear layers (what dominates its cost)."""
    return sum(m.in_features * m.out_features for m in net.modules() if isinstance(m, torch.nn.Linear))


def test_the_shipped_weights_fit_the_budget_and_record_their_recipe(pair):
    files = sorted(MODELS.glob("*.safetensors"))
    assert [f.name for f in files] == ["digits_draft.safetensors", "digits_target.safetensors"]
    assert sum(f.stat().st_size for f in files) <= 10_000_000
    cfg = json.loads((MODELS / "digits.json").read_text())
    rec = cfg["training"]
    assert rec["script"] == "benchmarks/diffusion/train_digits.py" and isinstance(rec["seed"], int)
    for name in ("target", "draft"):
        assert 0 < rec["final_train_loss"][name] < 0.2
        assert 0 < rec["held_out_loss"][f"{name}_saved"]["conditional"] < 0.2
    sched, target, draft = pair
    assert sched.timesteps == 1000 and target.null_label == draft.null_label == NULL_LABEL
    assert _macs(target) >= 10 * _macs(draft)
    assert not target.training and not draft.training


def test_the_pair_samples_digits_with_fewer_target_calls(pair):
    sched, target, draft = pair
    res = speculative_sample(sched, target, draft, (2, 1, 8, 8), lookahead=8, labels=[0, 7], rng=0)
    s = res.stats
    assert res.x.shape == (2, 1, 8, 8) and np.isfinite(res.x).all()
    assert s.calls_per_step <= 0.5 and s.alpha > 0.5
    assert to_images(res.x).shape == (2, 8, 8) and np.abs(res.x).max() < 3  # near the data's [-1, 1]
    bands = acceptance_bands(s)
    assert bands[0][0] == "1000-801" and bands[-1][0] == "10-1"
    assert sum(b[3] for b in bands) == s.proposed  # every drafted step falls in one band
    assert bands[0][1] > bands[-1][1]  # acceptance drops over the last, nearly noise-free steps


def _read_png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    W, H, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 0) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = np.frombuffer(raw, np.uint8).reshape(H, W + 1)
    assert (rows[:, 0] == 0).all()  # filter type 0
    return rows[:, 1:]


def test_the_zlib_png_writer(tmp_path):
    x = np.linspace(-1, 1, 3 * 64).reshape(3, 1, 8, 8)
    img = grid(x, cols=2, scale=2, pad=1)
    assert img.dtype == np.uint8 and img.shape == (2 * 17 + 1, 2 * 17 + 1)
    write_png(tmp_path / "g.png", img)
    np.testing.assert_array_equal(_read_png((tmp_path / "g.png").read_bytes()), img)


def test_the_image_demo_writes_both_grids(tmp_path, capsys):
    out = tmp_path / "digits.png"
    assert main(["demo", "image", "--quick", "--samples", "3", "--single", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sequential target calls: plain 1000" in text and "theory" in text and "acceptance by time step" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
