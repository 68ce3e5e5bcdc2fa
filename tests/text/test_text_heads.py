"""speculate.domains.text.training.heads and .feature_draft: drafts that live on a frozen target.

Tiny random Llamas (no downloads). The training tests use a repeating synthetic token stream;
with self-distillation the windows' second halves are the target's own samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.training.feature_draft import FeatureDraft, rope_theta, train_feature_draft
from speculate.domains.text.training.heads import MedusaHeads, target_features, train_heads

STREAM = [torch.tensor([(7 * i * i + 3 * i) % 64 for i in range(50)]).repeat(50)]  # period 50
LARGE = Path(__file__).resolve().parents[2] / "benchmarks" / "text" / "models" / "large"  # the larger pair
FAST = dict(steps=60, batch_size=8, seq_len=32, lr=1e-2, eval_batch=16)


def llama(**kw) -> torch.nn.Module:
    return tiny_llama(**{"vocab": 64, "hidden": 32, "layers": 2, **kw})


def scrambled(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> torch.nn.Module:
    """Random weights everywhere (fresh drafts have zero residual branches, hiding bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return module.eval()


# ------------------------------------------------------------------------------------ shapes


def test_shapes_and_features():
    target = llama()
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    feats, logits = target_features(target, ids)
    assert feats.shape == (3, 7, 32) and logits.shape == (3, 7, 64)
    assert torch.allclose(target.get_output_embeddings()(feats), logits)
    heads = MedusaHeads.for_target(target, n_heads=3, n_layers=2)
    assert heads(feats).shape == (3, 7, 3, 64)
    draft = FeatureDraft.for_target(target)
    hid, out = draft(feats[:, :-1], ids[:, 1:], torch.arange(6).expand(3, 6))
    assert hid.shape == (3, 6, 32) and out.shape == (3, 6, 64)
    # only the draft's own weights are saved: the target's embeddings are shared
    assert not any("embed" in k or "lm_head" in k for k in draft.state_dict())


def test_fresh_heads_are_the_target_head_one_step_late():
    target = llama()
    feats, logits = target_features(target, torch.tensor([[5, 9, 1, 3, 3]]))
    out = MedusaHeads.for_target(target, n_heads=4)(feats)  # [1, 5, 4, 64]
    for i in range(4):
        assert torch.allclose(out[:, :, i], logits, atol=1e-6)


def test_rope_theta_from_config():
    assert rope_theta(llama().config) == 10000.0
    from transformers import LlamaConfig

    assert rope_theta(LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 5e5})) == 5e5


# ----------------------------------------------------------------------------- save and load


@pytest.mark.parametrize("kind", [MedusaHeads, FeatureDraft])
def test_save_load_round_trip(kind, tmp_path):
    target = llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    feats, _ = target_features(target, ids)
    pos = torch.arange(8).expand(2, 8)
    model = scrambled(kind.for_target(target))

    def run(m):
        return m(feats) if kind is MedusaHeads else m(feats[:, :-1], ids[:, 1:], pos)[1]

    model.save_pretrained(tmp_path)
    loaded = kind.from_pretrained(tmp_path, target)
    assert torch.equal(run(model), run(loaded))
    assert not loaded.training


@pytest.mark.parametrize("kind", [MedusaHeads, FeatureDraft])
@pytest.mark.parametrize("other, numbers", [(dict(hidden=48), ("32", "48")), (dict(vocab=80), ("64", "80"))])
def test_from_pretrained_refuses_another_target(kind, other, numbers, tmp_path):
    kind.for_target(llama()).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        kind.from_pretrained(tmp_path, llama(**other))
    assert all(n in str(err.value) for n in numbers), str(err.value)
    assert "train" in str(err.value)


# ---------------------------------------------------------------------------------- training


def test_training_raises_acceptance():
    torch.set_num_threads(1)
    target = llama()
    res = train_heads(target, STREAM, n_heads=2, **FAST)
    assert len(res.alpha_after) == 2 and len(res.losses) == FAST["steps"]
    for before, after in zip(res.alpha_before, res.alpha_after, strict=True):
        assert after > before + 0.04, (res.alpha_before, res.alpha_after)  # observed about +0.09
    fd = train_feature_draft(target, STREAM, **FAST)
    assert fd.alpha_after > fd.alpha_before + 0.04, (fd.alpha_before, fd.alpha_after)  # about +0.10
    assert fd.alpha_rollout > fd.alpha_rollout_before + 0.04, (fd.alpha_rollout_before, fd.alpha_rollout)
    assert all(p.grad is None for p in target.parameters())  # the target stays frozen


def test_training_mode_target_is_refused():
    target = llama().train()
    for call in (lambda: train_heads(target, STREAM, **FAST), lambda: train_feature_draft(target, STREAM, **FAST),
                 lambda: target_features(target, torch.tensor([[1, 2]]))):
        with pytest.raises(ValueError, match="training mode"):
            call()


# ------------------------------------------------------------------------- the feature cache


def draft_case(seed: int = 0):  # not named setup: pytest < 8.1 calls a module-level setup() itself
    target = llama(dtype=torch.float64)
    draft = scrambled(FeatureDraft.for_target(target), seed)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(2, 8, 32, generator=g, dtype=torch.float64)  # [R, W, H]
    tokens = torch.randint(0, 64, (2, 8), generator=g)  # [R, W]
    pos = torch.arange(8).expand(2, 8)  # [R, W]
    return draft, feats, tokens, pos


FORMS = ["modules", "decoding"]  # with autograd the draft runs its modules; without, the folded decoding form


@pytest.mark.parametrize("form", FORMS)
def test_cache_column_by_column_equals_causal_forward(form):
    draft, feats, tokens, pos = draft_case()
    full, _ = draft(feats, tokens, pos)  # [2, 8, H]
    cache = draft.new_cache(batch=2, capacity=3)  # grows as columns arrive
    one = draft.new_cache(batch=1, capacity=3)  # row 1 alone, causal (visible=None)
    with torch.set_grad_enabled(form == "modules"):
        for j in range(8):
            visible = torch.ones(2, 1, j + 1, dtype=torch.bool)
            hid, _ = draft(feats[:, j:j + 1], tokens[:, j:j + 1], pos[:, j:j + 1], cache, pos[:, j:j + 1], visible)
            torch.testing.assert_close(hid[:, 0], full[:, j], atol=1e-10, rtol=0)
            s = np.array([[j]])
            hid, _ = draft(feats[1:, j:j + 1], tokens[1:, j:j + 1], s, one, s)
            torch.testing.assert_close(hid[0, 0], full[1, j], atol=1e-10, rtol=0)
    assert cache.form == one.form == form
    cache.select(torch.tensor([1]).numpy())  # keep row 1 only
    assert cache.keys.shape[0] == 1
    cache.release()
    assert cache.keys is None


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("keep", ["last, host", "mixed, host", "mixed, tensor"])
@pytest.mark.parametrize("slots", ["one run", "per row"])
def test_keep_returns_those_columns_of_the_full_block(keep, slots, form):
    """``keep``: each row's chosen column of what the whole block gives (only that column queries and
    runs the MLP and head), and every column's key and value still lands in the cache."""
    draft, feats, tokens, pos = draft_case(2)
    prefix = 3
    start = np.array([prefix, prefix]) if slots == "one run" else np.array([prefix, prefix + 2])
    W = 5
    keep_at = {"last, host": np.array([W - 1, W - 1]), "mixed, host": np.array([1, 3]),
               "mixed, tensor": torch.tensor([4, 0])}[keep]
    out = []
    for k in (None, keep_at):
        cache = draft.new_cache(batch=2, capacity=16)
        with torch.set_grad_enabled(form == "modules"):
            draft(feats[:, :prefix], tokens[:, :prefix], pos[:, :prefix], cache, pos[:, :prefix].numpy())
        s = start[:, None] + np.arange(W)[None, :]  # [2, W] slots = positions
        cols = s - start[:, None] + prefix  # the block's columns of feats
        f = torch.stack([feats[r, cols[r] % 8] for r in range(2)])
        t = torch.stack([tokens[r, cols[r] % 8] for r in range(2)])
        with torch.set_grad_enabled(form == "modules"):
            out.append((draft(f, t, torch.as_tensor(s), cache, s, keep=k), cache.keys.clone(), cache.values.clone()))
    (hid, logits), keys, values = out[0]
    (hid_k, logits_k), keys_k, values_k = out[1]
    idx = torch.as_tensor(keep_at)
    assert hid_k.shape == (2, 1, 32) and logits_k.shape == (2, 1, 64)
    torch.testing.assert_close(hid_k[:, 0], hid[torch.arange(2), idx], atol=1e-10, rtol=0)
    torch.testing.assert_close(logits_k[:, 0], logits[torch.arange(2), idx], atol=1e-10, rtol=0)
    assert torch.equal(keys_k, keys) and torch.equal(values_k, values)


@pytest.mark.parametrize("table", [True, False], ids=["token table", "no token table"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_drafting_form_equals_the_training_form(dtype, table, monkeypatch):
    """With a cache and without autograd the layer runs its decoding form (folded weights, complex
    RoPE, norms as ``x / hypot(|x|, sqrt(H eps))``); with autograd the modules. Both give the same
    numbers, with and without a cache."""
    from speculate.domains.text.training import feature_decode

    if not table:  # a vocabulary too large for the token table
        monkeypatch.setattr(feature_decode, "TOKEN_TABLE_MAX", 0)
    target = llama(dtype=dtype)
    draft = scrambled(FeatureDraft.for_target(target), 3)
    assert (draft.folded().table is not None) == table
    g = torch.Generator().manual_seed(3)
    feats = 2 * torch.randn(2, 6, 32, generator=g, dtype=dtype)
    tokens, pos = torch.randint(0, 64, (2, 6), generator=g), torch.arange(6).expand(2, 6)
    tol = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=0),
           torch.bfloat16: dict(atol=0.1, rtol=0.05)}[dtype]
    for cached in (False, True):
        out = []
        for grad in (True, False):
            cache = draft.new_cache(2, 8) if cached else None
            with torch.set_grad_enabled(grad):
                h, lg = draft(feats, tokens, pos, cache, pos.numpy() if cached else None)
            out.append((h.detach(), lg.detach()))
        torch.testing.assert_close(out[1][0], out[0][0], **tol)
        torch.testing.assert_close(out[1][1], out[0][1], **tol)


@torch.no_grad()
def test_decoding_form_follows_the_weights():
    """The folded weights are rebuilt after an in-place change of a parameter (the draft's, or the
    target's token embedding), ``load_state_dict`` and ``.to(dtype)``: the decoding form always
    agrees with the modules."""
    draft, feats, tokens, pos = draft_case(5)
    other = scrambled(FeatureDraft.for_target(llama(dtype=torch.float64)), 6)
    p = pos[:, :4].numpy()

    def check(d=draft, dtype=torch.float64):
        got = d(feats[:, :4].to(dtype), tokens[:, :4], p, d.new_cache(2, 4), p)[1]
        with torch.enable_grad():
            want = d(feats[:, :4].to(dtype), tokens[:, :4], p, d.new_cache(2, 4), p)[1]
        torch.testing.assert_close(got, want.detach(), atol=1e-10 if dtype == torch.float64 else 1e-4, rtol=0)
        return got

    before = check()
    draft.gate_up.weight_t.mul_(1.5)
    assert not torch.allclose(check(), before)
    draft.load_state_dict(other.state_dict())
    check()
    draft.attn_norm.weight.add_(0.25)
    check()
    draft._shared[0].weight.add_(0.5)  # the target's token embedding (the token table)
    check()
    check(draft.to(torch.float32), torch.float32)


def test_a_feature_cache_serves_one_form():
    """A cache written by one form is refused by the other (they order key entries differently)."""
    draft, feats, tokens, pos = draft_case(7)
    p = pos[:, :3].numpy()
    cache = draft.new_cache(2, 8)
    with torch.no_grad():
        draft(feats[:, :3], tokens[:, :3], p, cache, p)
    with pytest.raises(ValueError, match="decoding form"):
        draft(feats[:, 3:4], tokens[:, 3:4], p[:, :1] + 3, cache, p[:, :1] + 3)
    cache.reset(2, 8)
    draft(feats[:, :3], tokens[:, :3], p, cache, p)
    with torch.no_grad(), pytest.raises(ValueError, match="modules form"):
        draft(feats[:, 3:4], tokens[:, 3:4], p[:, :1] + 3, cache, p[:, :1] + 3)


def test_feature_draft_saved_with_linear_weights_loads(tmp_path):
    """A draft saved when its layers were ``torch.nn.Linear`` (``weight`` ``[out, in]``) loads into the
    ``[in, out]`` layout with the same outputs; ``weight`` still reads ``[out, in]``."""
    from safetensors.torch import save_file
    from speculate.domains.text.training.feature_draft import WEIGHTS_NAME

    target = llama()
    draft = scrambled(FeatureDraft.for_target(target), 4)
    assert draft.fc.weight.shape == (32, 64) and draft.fc.weight_t.shape == (64, 32)
    draft.save_pretrained(tmp_path)
    old = {k.replace("weight_t", "weight"): (v.T if k.endswith("weight_t") else v).contiguous()
           for k, v in draft.state_dict().items()}
    assert "qkv.weight" in old and old["qkv.weight"].shape == (96, 32)
    save_file({k: v.detach() for k, v in old.items()}, tmp_path / WEIGHTS_NAME)
    loaded = FeatureDraft.from_pretrained(tmp_path, target)
    feats = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(4))
    tokens, pos = torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(feats, tokens, pos)[1], draft(feats, tokens, pos)[1])


@pytest.mark.parametrize("form", FORMS)
def test_tree_siblings_and_move(form):
    with torch.set_grad_enabled(form == "modules"):
        _tree_siblings_and_move()


def _tree_siblings_and_move():
    draft, feats, tokens, pos = draft_case(1)
    P = 5
    cache = draft.new_cache(batch=2, capacity=P + 3)
    causal = torch.ones(P, P, dtype=torch.bool).tril().expand(2, P, P)
    draft(feats[:, :P], tokens[:, :P], pos[:, :P], cache, pos[:, :P], causal)
    # two siblings at position P (slots P and P + 1), each sees the prefix and itself
    f2, t2 = feats[:, P:P + 2], tokens[:, P:P + 2]  # sibling a = column P, b = column P + 1
    visible = torch.zeros(2, 2, P + 2, dtype=torch.bool)
    visible[:, :, :P] = True
    visible[:, 0, P] = visible[:, 1, P + 1] = True
    hid, _ = draft(f2, t2, torch.full((2, 2), P), cache, torch.tensor([[P, P + 1]] * 2), visible)
    for s in range(2):
        path, _ = draft(torch.cat([feats[:, :P], f2[:, s:s + 1]], 1), torch.cat([tokens[:, :P], t2[:, s:s + 1]], 1),
                        pos[:, :P + 1])
        torch.testing.assert_close(hid[:, s], path[:, -1], atol=1e-5, rtol=0)
    # accept sibling b in row 0 and sibling a in row 1: commit them to slot P, then decode position P + 1
    cache.move(torch.tensor([0]), torch.tensor([P + 1]), torch.tensor([P]))
    nxt_f, nxt_t = feats[:, P + 2:P + 3], tokens[:, P + 2:P + 3]
    hid, _ = draft(nxt_f, nxt_t, torch.full((2, 1), P + 1), cache, torch.full((2, 1), P + 1),
                   torch.ones(2, 1, P + 2, dtype=torch.bool))
    for row, s in ((0, 1), (1, 0)):
        path, _ = draft(torch.cat([feats[row:row + 1, :P], f2[row:row + 1, s:s + 1], nxt_f[row:row + 1]], 1),
                        torch.cat([tokens[row:row + 1, :P], t2[row:row + 1, s:s + 1], nxt_t[row:row + 1]], 1),
                        pos[:1, :P + 2])
        torch.testing.assert_close(hid[row, 0], path[0, -1], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- shipped weights


@pytest.mark.parametrize("pair", ["embedded", "large"])
def test_shipped_drafts_beat_fresh_ones_on_their_target(pair):
    """The drafts trained for each committed target load next to it (``load_self_drafts``) and accept
    more than fresh ones on held-out-style code (the other target's drafts are refused: see the
    hidden-size checks)."""
    from speculate.domains.text.examples.pair import load_pair, load_self_drafts
    from speculate.domains.text.training.feature_draft import feature_draft_acceptance
    from speculate.domains.text.training.heads import heads_acceptance

    path = None if pair == "embedded" else LARGE
    target, _, tok = load_pair(path=path)
    heads, draft = load_self_drafts(target, path)
    text = "def total(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n"
    ids = tok(text, return_tensors="pt").input_ids  # [1, L]
    fresh_heads = heads_acceptance(target, MedusaHeads.for_target(target, heads.n_heads), ids)
    assert all(a > b for a, b in zip(heads_acceptance(target, heads, ids), fresh_heads, strict=True))
    fresh = FeatureDraft.for_target(target, intermediate_size=draft.config["intermediate_size"])
    assert feature_draft_acceptance(target, draft, ids)[0] > feature_draft_acceptance(target, fresh, ids)[0]


def test_self_drafts_of_another_target_or_a_missing_folder_are_refused(tmp_path):
    from speculate.domains.text.examples.pair import load_pair, load_self_drafts

    target, _, _ = load_pair()  # width 128; the large pair's drafts read width 192
    with pytest.raises(ValueError, match="hidden size 192"):
        load_self_drafts(target, LARGE)
    with pytest.raises(FileNotFoundError, match=r"train_heads\.py --pair "):
        load_self_drafts(target, tmp_path)


@pytest.mark.slow
def test_train_heads_script_trains_each_kind_apart_and_merges_the_record(tmp_path):
    """``train_heads.py --only heads`` then ``--only draft`` (as two processes side by side would)
    write loadable drafts next to the pair and one record holding both (a few steps each)."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "text"))
    from speculate.domains.text.examples.pair import load_pair, load_self_drafts
    from train_heads import main

    common = ["--heads-steps", "2", "--draft-steps", "2", "--out", str(tmp_path / "drafts"),
              "--results", "smoke", "--results-dir", str(tmp_path)]
    main(["--only", "heads", *common])
    first = json.loads((tmp_path / "smoke.json").read_text())
    assert "heads" in first and "feature_draft" not in first
    main(["--only", "draft", *common])
    both = json.loads((tmp_path / "smoke.json").read_text())
    assert both["heads"] == first["heads"] and "feature_draft" in both
    assert {"Medusa heads (all)", "feature draft (one column)"} <= set(both["latency_ms"])
    assert "--only heads" in both["command"] and "--only draft" in both["command"]
    target, _, _ = load_pair()
    heads, draft = load_self_drafts(target, tmp_path / "drafts")
    assert heads.n_heads == 4 and draft.config["hidden_size"] == 128


def _per_head(heads: MedusaHeads, f: torch.Tensor) -> torch.Tensor:
    """The heads' definition, one head and one block at a time: ``[R, n_heads, V]``."""
    out = []
    for i in range(heads.n_heads):
        h = f
        for layer in range(heads.config["n_layers"]):
            h = h + torch.nn.functional.silu(h @ heads.weight[layer, i] + heads.bias[layer, i, 0])
        out.append(h @ heads.out[i])
    return torch.stack(out, dim=-2)


def test_stacked_heads_equal_one_head_at_a_time():
    """Every head's blocks and output layer, batched over heads, give each head's own logits, also
    after the weights change (drafting reads the live parameters: nothing derived is kept)."""
    target = tiny_llama(vocab=64, hidden=32, layers=2, dtype=torch.float64)
    heads = MedusaHeads.for_target(target, n_heads=3, n_layers=2).to(torch.float64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    f = torch.randn(5, 32, dtype=torch.float64, generator=g)
    torch.testing.assert_close(heads.draft_logits(f), _per_head(heads, f).detach())
    torch.testing.assert_close(heads(f.expand(2, 5, 32)), _per_head(heads, f).detach().expand(2, 5, 3, 64))
    with torch.no_grad():
        heads.weight[1, 2].add_(0.5)
    torch.testing.assert_close(heads.draft_logits(f), _per_head(heads, f).detach())
    heads.float()
    assert heads.draft_logits(f.float()).dtype == torch.float32
    torch.testing.assert_close(heads.draft_logits(f.float()), _per_head(heads, f.float()).detach())


def test_heads_saved_one_module_per_head_load(tmp_path):
    """Heads saved before the weights were stacked (a module per head: ``heads.{i}.{l}.linear.*``
    and ``heads.{i}.{n_layers}.weight``) load into the stacked layout with the same logits."""
    from safetensors.torch import save_file
    from speculate.domains.text.training.heads import CONFIG_NAME, WEIGHTS_NAME

    target = tiny_llama(vocab=64, hidden=32, layers=2)
    heads = MedusaHeads.for_target(target, n_heads=3, n_layers=2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    old = {}
    for i in range(3):
        for j in range(2):
            old[f"heads.{i}.{j}.linear.weight"] = heads.weight[j, i].T.contiguous()
            old[f"heads.{i}.{j}.linear.bias"] = heads.bias[j, i, 0].contiguous()
        old[f"heads.{i}.2.weight"] = heads.out[i].T.contiguous()
    heads.save_pretrained(tmp_path)
    save_file({k: v.detach() for k, v in old.items()}, tmp_path / WEIGHTS_NAME)
    assert (tmp_path / CONFIG_NAME).is_file()
    loaded = MedusaHeads.from_pretrained(tmp_path, target)
    f = torch.randn(4, 32, generator=g)
    torch.testing.assert_close(loaded.draft_logits(f), heads.draft_logits(f))
