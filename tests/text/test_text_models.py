"""The embedded model pair and its corpus: files, sizes, loading, vocabulary, quality bounds.

The quality tests would catch a corrupted, truncated, swapped or untrained checkpoint: an
untrained byte model scores about ln(259) = 5.56 nats/byte, the trained target about
TARGET_NATS (recorded in benchmarks/results/text_train.json); the bounds leave a margin for a
different Python version's held-out files and for float differences across machines.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from speculate.domains.text.examples.corpus import EXCLUDED_DIRS, load_corpus, split_of, stdlib_files
from speculate.domains.text.examples.pair import DRAFT_DIR, TARGET_DIR, load_pair
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from speculate.domains.text.training.distill import acceptance_rate, cross_entropy
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

# Recorded by `python benchmarks/text/train_pair.py --size small` (see MODELS.md), on the
# 16 x 256-byte held-out windows used below.
TARGET_NATS = 1.034  # ln(259) = 5.56 for an untrained model
DRAFT_NATS = 1.384
ACCEPTANCE = 0.791  # alpha = E[sum_x min(p, q)] of the pair (an acceptance rate, not a test level)
MARGIN_NATS = 0.15
MARGIN_ACCEPTANCE = 0.05

# ------------------------------------------------------------------ corpus


def test_split_is_a_fixed_function_of_the_path():
    # pinned: changing the split would silently put training files in the held-out set
    pinned = {"os.py": "train", "json/decoder.py": "train", "typing.py": "train",
              "chunk.py": "heldout", "traceback.py": "heldout", "email/__init__.py": "heldout"}
    assert {p: split_of(p) for p in pinned} == pinned


def test_corpus_splits_partition_the_files():
    files = stdlib_files()
    train, held = load_corpus("train"), load_corpus("heldout")
    assert set(train.paths).isdisjoint(held.paths)
    assert sorted(train.paths + held.paths) == files
    assert 0.02 < len(held.paths) / len(files) < 0.10
    assert len(held.paths) >= 10 and held.n_bytes > 100_000
    assert not any(part in EXCLUDED_DIRS for p in files for part in p.split("/")[:-1])
    assert train.python_version == held.python_version
    assert load_corpus("heldout").digest() == held.digest()


def test_token_stream_format():
    held = load_corpus("heldout")
    s = held.token_stream()
    assert s.dtype == np.int64 and s.shape == (held.n_bytes + 2 * len(held.documents),)
    assert s[0] == BOS_ID and s[-1] == EOS_ID
    assert (s == BOS_ID).sum() == (s == EOS_ID).sum() == len(held.documents)
    assert (s == PAD_ID).sum() == 0
    first = held.documents[0]
    assert bytes(s[1:1 + len(first)].astype(np.uint8)) == first


def test_corpus_on_a_given_root(tmp_path):
    for rel in ("a.py", "pkg/b.py", "pkg/c.txt", "test/t.py", "site-packages/x/y.py",
                "idle_test/z.py", "pkg/tests/w.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert stdlib_files(tmp_path) == ["a.py", "pkg/b.py"]
    both = load_corpus("train", root=tmp_path).paths + load_corpus("heldout", root=tmp_path).paths
    assert sorted(both) == ["a.py", "pkg/b.py"]


def test_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_corpus("valid")
    with pytest.raises(FileNotFoundError, match=r"no \.py sources"):
        load_corpus("train", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus("train", root=tmp_path / "missing")
    with pytest.raises(ValueError, match="heldout_fraction"):
        load_corpus("train", heldout_fraction=1.5)


# ------------------------------------------------------------------ the embedded pair


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.fixture(scope="module")
def heldout_windows() -> torch.Tensor:
    s = torch.from_numpy(load_corpus("heldout").token_stream())
    starts = torch.linspace(0, s.numel() - 256, 16).long()
    return s[starts[:, None] + torch.arange(256)]  # [16, 256]


def test_files_and_sizes():
    for folder, limit in ((TARGET_DIR, 10_000_000), (DRAFT_DIR, 1_000_000)):
        for name in ("config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"):
            assert (folder / name).is_file(), folder / name
        size = (folder / "model.safetensors").stat().st_size
        assert size <= limit, f"{folder.name}: {size} bytes > {limit}"


def test_load_pair(pair):
    target, draft, tok = pair
    assert isinstance(target, LlamaForCausalLM) and isinstance(draft, LlamaForCausalLM)
    assert isinstance(tok, ByteTokenizer) and len(tok) == VOCAB_SIZE
    for m in (target, draft):
        assert not m.training
        assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
        assert m.config.vocab_size == VOCAB_SIZE
        assert m.get_output_embeddings().weight.shape[0] == VOCAB_SIZE
        assert (m.config.bos_token_id, m.config.eos_token_id, m.config.pad_token_id) == (
            BOS_ID, EOS_ID, PAD_ID)
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    assert n_d * 5 < n_t
    assert draft.config.num_hidden_layers * 4 <= target.config.num_hidden_layers


def test_plain_transformers_loading_gives_the_same_models(pair):
    target, draft, tok = pair
    ids = tok(["def main():\n", "import os"], padding=True, return_tensors="pt")
    for folder, model in ((TARGET_DIR, target), (DRAFT_DIR, draft)):
        plain = AutoModelForCausalLM.from_pretrained(folder)
        assert plain.dtype == torch.float32  # stored float16 where needed, loads as float32
        auto_tok = AutoTokenizer.from_pretrained(folder)
        again = auto_tok(["def main():\n", "import os"], padding=True, return_tensors="pt")
        assert torch.equal(again.input_ids, ids.input_ids)
        with torch.no_grad():
            a = plain(**ids).logits
            b = model(**ids).logits
        assert torch.equal(a, b)


def test_heldout_loss_below_recorded_bound(pair, heldout_windows):
    target, draft, _ = pair
    lt = cross_entropy(target, heldout_windows)
    ld = cross_entropy(draft, heldout_windows)
    assert lt < TARGET_NATS + MARGIN_NATS, lt
    assert ld < DRAFT_NATS + MARGIN_NATS, ld
    assert lt < ld < math.log(VOCAB_SIZE) - 2.0  # the target is the better model


def test_acceptance_above_recorded_bound(pair, heldout_windows):
    target, draft, _ = pair
    assert acceptance_rate(target, draft, heldout_windows) > ACCEPTANCE - MARGIN_ACCEPTANCE


def test_samples_look_like_python_source(pair):
    target, _, tok = pair
    torch.manual_seed(0)
    ids = tok(["def ", "class ", "import ", "    return "], padding=True,
              return_tensors="pt")
    with torch.no_grad():
        out = target.generate(**ids, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=64,
                              pad_token_id=PAD_ID)
    new = out[:, ids.input_ids.shape[1]:].reshape(-1)
    printable = ((new >= 32) & (new < 127)) | (new == 10) | (new == EOS_ID)
    assert float(printable.float().mean()) > 0.95


def test_load_pair_dtype_and_missing_folder(pair, tmp_path):
    t64, d64, _ = load_pair(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for m in (t64, d64) for p in m.parameters())
    ids = torch.tensor([[BOS_ID, *b"def f(x):"]])
    with torch.no_grad():
        a, b = t64(ids).logits, pair[0](ids).logits.double()
    assert torch.allclose(a, b, atol=1e-4)
    with pytest.raises(FileNotFoundError, match=r"train_pair\.py"):
        load_pair(path=tmp_path)


@pytest.mark.slow
def test_training_script_end_to_end(tmp_path):
    """The recipe script, scaled down to a few steps of each stage, writes a loadable pair and
    a complete record (catches a script that no longer runs; about a minute)."""
    import json
    import sys

    sys.path.insert(0, str(TARGET_DIR.parents[3]))
    from benchmarks.text.train_pair import main

    report = main(["--size", "small", "--scale", "0.005", "--eval-windows", "8",
                   "--out", str(tmp_path / "pair"), "--results", "smoke",
                   "--results-dir", str(tmp_path)])
    target, draft, tok = load_pair(path=tmp_path / "pair")
    assert len(tok) == VOCAB_SIZE
    assert target.config.num_hidden_layers == 12 and draft.config.num_hidden_layers == 1
    saved = json.loads((tmp_path / "smoke.json").read_text())
    assert saved["command"].endswith("--results-dir " + str(tmp_path))
    for key in ("target", "draft", "distill", "heldout_loss", "alpha", "latency_batch1",
                "theory", "corpus"):
        assert key in saved and key in report
    assert 0.0 < saved["alpha"]["after_distill"]["alpha_target_samples"] <= 1.0
    assert (tmp_path / "smoke.md").read_text().startswith("# Text model pair (small)")


def test_peft_and_compiled_models_run_as_the_user_built_them(make_llama):
    """Regression: a PeftModel or a torch.compile'd model was refused with a KV-cache size mismatch. A
    PeftModel runs as its base model with the adapters on (greedy equals its own generate); a compiled
    module runs uncompiled (the same function), with a warning; both on the position-indexed cache."""
    import peft
    import torch
    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.models.kv_cache import CachedModel

    cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    pm = peft.get_peft_model(make_llama(init_std=0.5), cfg).eval()
    draft = make_llama(layers=1, rng=1)
    gen = SpeculativeGenerator(pm, draft, lookahead=3)
    assert type(gen._target_lm) is CachedModel
    prompt = [1, 5, 2, 7]
    out = gen.generate([prompt], max_new_tokens=10, temperature=0, eos_token_id=[]).sequences[0]
    ref = pm.generate(input_ids=torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0].tolist()
    assert out == ref
    with pm.disable_adapter():  # the adapters matter: without them the tokens differ
        base = pm.generate(input_ids=torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0].tolist()
    assert base != ref
    with pytest.warns(UserWarning, match="torch.compile wrapper"):
        gen = SpeculativeGenerator(torch.compile(make_llama()), draft)
    assert type(gen._target_lm) is CachedModel
