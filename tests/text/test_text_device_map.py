"""Models loaded with a ``device_map``: layers spread over devices, weights offloaded to disk.

accelerate's hooks bring each offloaded layer's weights in for its forward (between calls they sit
on the ``meta`` device) and move inputs to where each layer executes. On a machine with one device
the map spreads a model over the CPU and the disk, which takes the same code path as CPU and GPU
(``tests/text/test_text_gpu.py`` has the CUDA + CPU split). A spread target or draft must give
the same tokens as the same model on one device, greedy and sampled with the same ``rng``: float64
models run the same arithmetic either way, so any difference is a bug (a lean loop reading meta
weights, an early-exit copy running the whole model, a cache on the wrong device).
"""

from __future__ import annotations

import copy

import pytest
import torch
from families import family, perturbed, tiny_seq2seq
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.drafts.model import early_exit_model
from speculate.domains.text.models.encoder_decoder import CachedSeq2Seq
from speculate.domains.text.models.facts import execution_device
from speculate.domains.text.models.kv_cache import CachedModel
from speculate.domains.text.models.lean_llama import supports
from speculate.domains.text.models.memory import cache_bytes_by_device
from speculate.domains.text.training.feature_draft import FeatureDraft
from speculate.domains.text.training.heads import MedusaHeads, output_weight

from tests.text.test_text_tree_drafts import _perturbed

pytest.importorskip("accelerate")

PROMPTS = [[1, 5, 7, 2], [2, 3], [9, 4, 4]]


def spread(model: torch.nn.Module, tmp_path, layers: str, every_other: bool = True,
           others: str = "cpu") -> torch.nn.Module:
    """``model`` saved and reloaded with a ``device_map``: every other layer of the ModuleList at
    ``layers`` (or its second half) on disk, the modules beside the path to it on ``others``."""
    parts = layers.split(".")
    dmap: dict[str, str] = {}
    owner, prefix = model, ""
    for name in parts:
        for child, _ in owner.named_children():
            if child != name:
                dmap[prefix + child] = others
        for tensor, _ in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            dmap[prefix + tensor] = "cpu"  # BART's final_logits_bias
        owner, prefix = getattr(owner, name), prefix + name + "."
    n = len(owner)
    for j in range(n):
        dmap[f"{prefix}{j}"] = "disk" if (j % 2 == 0 if every_other else j >= n // 2) else "cpu"
    model.save_pretrained(tmp_path / "full")
    dtype = next(model.parameters()).dtype
    out = type(model).from_pretrained(tmp_path / "full", device_map=dmap, dtype=dtype,
                                      offload_folder=str(tmp_path / "offload")).eval()
    assert "meta" in {p.device.type for p in out.parameters()}  # something really is offloaded
    return out


def run(gen: SpeculativeGenerator, **inputs) -> tuple:
    greedy = gen.generate(**inputs, max_new_tokens=12, temperature=0, eos_token_id=[])
    sampled = gen.generate(**inputs, max_new_tokens=12, temperature=1.0, top_k=6, rng=0, eos_token_id=[])
    return greedy.sequences, sampled.sequences, greedy.stats.accepted, sampled.stats.accepted


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A float64 Llama target and the same target with its embedding, head, final norm and every
    other layer on disk (its first parameter is on ``meta``)."""
    target = tiny_llama(dtype=torch.float64, init_std=0.3, layers=4, eos=None)
    return target, spread(target, tmp_path_factory.mktemp("llama"), "model.layers", others="disk")


DRAFTS = {
    "model": lambda t: perturbed(t, scale=0.2),
    "early-exit": lambda t: "early-exit:2",
    "ngram": lambda t: "ngram",
    "medusa-tree": lambda t: _perturbed(MedusaHeads.for_target(t, n_heads=3), seed=3),
    "feature-dynamic": lambda t: _perturbed(FeatureDraft.for_target(t), seed=4),
}
TREES = {"medusa-tree": [2, 2], "feature-dynamic": "dynamic"}


@pytest.mark.parametrize("kind", list(DRAFTS))
def test_spread_target_gives_the_single_device_tokens(pair, kind):
    target, spread_target = pair
    assert execution_device(spread_target) == torch.device("cpu")
    torch.manual_seed(0)
    draft = DRAFTS[kind](target)  # one draft object for both runs (heads read the same weights)
    got = [run(SpeculativeGenerator(t, draft, lookahead=3, tree=TREES.get(kind)), input_ids=PROMPTS)
           for t in (target, spread_target)]
    assert got[1] == got[0]  # tokens and accepted counts
    if kind != "ngram":
        assert got[0][2] >= 4  # drafts were kept, so the draft's law mattered


def test_heads_built_on_the_spread_target_read_its_offloaded_head(pair):
    target, spread_target = pair
    assert spread_target.lm_head.weight.device.type == "meta"
    assert torch.equal(output_weight(spread_target), target.lm_head.weight)
    heads = MedusaHeads.for_target(spread_target, n_heads=2)
    assert all(torch.equal(out.T, target.lm_head.weight) for out in heads.out)
    assert FeatureDraft.for_target(spread_target).fc.weight.device == torch.device("cpu")


def test_early_exit_of_a_hooked_model_runs_only_its_first_layers(pair):
    """The shallow copy of a hooked module must call its own forward, not the original's
    (which would run every layer, and fill a 2-layer cache from 4)."""
    target, spread_target = pair
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    want = early_exit_model(target, 2)(input_ids=ids).logits
    got = early_exit_model(spread_target, 2)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not torch.allclose(want, target(input_ids=ids).logits)  # 2 layers differ from 4


def test_lean_loops_and_memory_accounting_use_the_execution_device(pair):
    target, spread_target = pair
    assert not supports(spread_target)  # the lean loop would read meta weights
    assert supports(target) and not supports(copy.deepcopy(target).to("meta"))  # meta without hooks too
    gen = SpeculativeGenerator(spread_target, "early-exit:1")
    assert type(gen.draft.lm) is CachedModel
    assert set(cache_bytes_by_device(spread_target, batch=2, capacity=8)) == {torch.device("cpu")}


def test_spread_draft_gives_the_single_device_tokens(tmp_path):
    target = tiny_llama(dtype=torch.float64, init_std=0.3, layers=2, eos=None)
    draft = perturbed(target, scale=0.2)
    spread_draft = spread(draft, tmp_path, "model.layers", every_other=False)
    got = [run(SpeculativeGenerator(target, d, lookahead=3), input_ids=PROMPTS) for d in (draft, spread_draft)]
    assert got[1] == got[0] and got[0][2] >= 4


@pytest.mark.parametrize("name", ["BART", "Whisper"])
@pytest.mark.parametrize("draft_kind", ["seq2seq", "early-exit"])
def test_spread_encoder_decoder_gives_the_single_device_tokens(tmp_path, name, draft_kind):
    target = tiny_seq2seq(family(name))
    spread_target = spread(target, tmp_path, "model.decoder.layers", every_other=False)
    draft = perturbed(target, scale=0.2) if draft_kind == "seq2seq" else "early-exit:1"
    g = torch.Generator().manual_seed(0)
    if name == "Whisper":
        cfg = target.config
        inputs = {"input_features": torch.randn(3, cfg.num_mel_bins, 2 * cfg.max_source_positions,
                                                generator=g, dtype=torch.float64)}
    else:
        inputs = {"input_ids": [[4, 5, 6, 7, 8], [9, 3, 3], [10, 11, 12, 13]]}
    gens = [SpeculativeGenerator(t, draft, lookahead=3) for t in (target, spread_target)]
    assert type(gens[1]._target_lm) is CachedSeq2Seq  # not the lean loop, which reads weights
    got = [run(g, **inputs) for g in gens]
    assert got[1] == got[0]
    assert got[0][2] + got[0][3] >= 2, got[0][2:]
