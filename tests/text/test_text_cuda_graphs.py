"""Static decode steps (``cuda_graphs.py``, ``LeanLlama.use_static``) and ``cuda_graphs=True``.

On the CPU the static step runs eagerly through the same padding and bucketing as on a GPU (where
it is recorded as CUDA graphs: the ``gpu`` tests at the end). Float64 models: the static step
attends over every slot through a mask instead of a slice, which changes nothing but rounding, so
the tokens, greedy and sampled with the same ``rng``, must be the dynamic loop's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import family as fam
from families import perturbed, tiny_model
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.models.cuda_graphs import StepGraphs, bucket
from speculate.domains.text.models.kv_cache import CachedModel
from speculate.domains.text.models.lean_llama import STATIC_SLOTS, LeanLlama, static_target

PROMPTS = [[1, 5, 7, 2], [2, 3], [9, 4, 4], [3], [5, 5, 5, 5, 5, 1]]


def llama(layers: int = 3):
    return tiny_llama(dtype=torch.float64, init_std=0.3, layers=layers, eos=None)


def test_bucket_pads_to_powers_of_two_within_the_rows_allocated():
    assert [bucket(r, 64) for r in (1, 2, 3, 4, 5, 17, 33, 64)] == [1, 2, 4, 4, 8, 32, 64, 64]
    assert bucket(5, 6) == 6
    for bad in ((0, 4), (5, 4)):
        with pytest.raises(ValueError, match="rows"):
            bucket(*bad)


def test_static_steps_give_the_dynamic_loops_logits_through_rollbacks_and_dropped_rows():
    """Ragged starts, a rollback (stale slots left behind), rows dropped so that the live rows
    are padded to a bucket with a dead row, and a second generation on the kept buffers."""
    model = llama()
    dyn, st = LeanLlama(model), LeanLlama(model)
    st.use_static(capture=False)
    g = torch.Generator().manual_seed(0)
    for lm in (dyn, st):
        lm.reset(5, 20)
    assert st.capacity == STATIC_SLOTS and st.k[0].shape[0] == 5

    def both(tokens, start):
        a, b = dyn.forward(tokens, start), st.forward(tokens, start)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
        return a

    both(torch.randint(0, 12, (5, 4), generator=g), np.zeros(5, np.int64))
    for lm in (dyn, st):
        lm.keep(np.array([4, 2, 3, 1, 4]))
    both(torch.randint(0, 12, (5, 3), generator=g), np.array([4, 2, 3, 1, 4]))
    for lm in (dyn, st):
        lm.keep(np.array([1, 3, 0, 2, 3]))  # rejected drafts stay in the slots after these
        lm.select(np.array([0, 1, 4]))  # 3 live rows: a bucket of 4, with one dead row
    assert st.k[0].shape[0] == 5 and len(st.length) == 3
    for _ in range(3):
        start = dyn.length.copy()
        both(torch.randint(0, 12, (3, 2), generator=g), start)
        for lm in (dyn, st):
            lm.keep(np.array([2, 1, 2]))
    both(torch.randint(0, 12, (3, 20), generator=g), dyn.length.copy())  # wider than a static step:
    # the dynamic forward, on buffers that hold more rows than are live
    for lm in (dyn, st):
        lm.keep(np.array([20, 20, 20]))
    both(torch.randint(0, 12, (3, 2), generator=g), dyn.length.copy())
    buffers, key = st.k[0].data_ptr(), st.graphs.key
    for lm in (dyn, st):  # the next generation: same shape, the same buffers (recorded graphs stay valid)
        lm.reset(5, 30)
    both(torch.randint(0, 12, (5, 3), generator=g), np.zeros(5, np.int64))
    assert st.k[0].data_ptr() == buffers and st.graphs.key == key
    for lm in (dyn, st):  # another batch: new buffers, so graphs recorded on the old ones are dropped
        lm.reset(3, 30)
    both(torch.randint(0, 12, (3, 3), generator=g), np.zeros(3, np.int64))
    assert st.graphs.key != key


@pytest.mark.parametrize("kind", ["model", "early-exit:1", "ngram"])
def test_generator_with_static_steps_gives_the_same_tokens(kind):
    target = llama()
    draft = perturbed(target, scale=0.2) if kind == "model" else kind
    got = []
    for graphs in (False, True):
        gen = SpeculativeGenerator(target, draft, lookahead=3, cuda_graphs=graphs)
        greedy = gen.generate(PROMPTS, max_new_tokens=16, temperature=0, eos_token_id=[])
        sampled = gen.generate(PROMPTS, max_new_tokens=16, temperature=1.0, rng=0, eos_token_id=[0, 1])
        got.append((greedy.sequences, sampled.sequences, greedy.stats.accepted, sampled.stats.accepted))
    assert got[1] == got[0]
    lengths = {len(s) - len(p) for s, p in zip(got[0][1], PROMPTS, strict=True)}
    assert len(lengths) > 1  # rows finished at different rounds: dropped rows, padded buckets
    assert gen.static_models == (("target",) if kind == "ngram" else ("target", "draft"))
    assert isinstance(gen._target_lm, LeanLlama) and gen._target_lm.graphs is not None
    if kind != "ngram":
        assert got[0][2] >= 4


def test_targets_the_static_step_cannot_serve_keep_the_general_cache():
    """Not a plain Llama (Qwen2 here), or drafts that read the target's features: no static target."""
    qwen = tiny_model(fam("qwen2"))
    assert static_target(qwen) is None
    gen = SpeculativeGenerator(qwen, "ngram", cuda_graphs=True)
    assert gen.static_models == () and type(gen._target_lm) is CachedModel
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        SpeculativeGenerator(llama(), "ngram", cuda_graphs=None)


def test_a_target_whose_static_step_is_wrong_is_refused_by_the_check(monkeypatch):
    """The cache check runs the static step on ragged rows and a rollback: a step that loses the
    rotary position of every row but the first is caught, and the target keeps the general cache."""
    real = LeanLlama._step

    def wrong(self, tokens, pos):
        return real(self, tokens, pos[:1].expand_as(pos))

    monkeypatch.setattr(LeanLlama, "_step", wrong)
    target = llama()
    assert static_target(target) is None
    assert SpeculativeGenerator(target, "ngram", cuda_graphs=True).static_models == ()


def test_static_buffers_and_graphs_are_renewed_when_the_weights_move():
    """A next generation keeps the buffers (and the graphs recorded on them) only while every weight
    keeps its storage: after a cast and back (new storage, same dtype and device) the buffers are
    allocated again (a new epoch: recorded graphs are dropped), and the logits follow the weights."""
    model = llama()
    st, dyn = LeanLlama(model), LeanLlama(model)
    st.use_static(capture=False)
    st.reset(2, 8)
    epoch = st._epoch
    st.reset(2, 8)
    assert st._epoch == epoch  # nothing moved: the same buffers
    model.to(torch.float32).to(torch.float64)  # new storage for every weight
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    st.reset(2, 8)
    assert st._epoch == epoch + 1
    dyn.reset(2, 8)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    torch.testing.assert_close(st.forward(tokens, np.zeros(2, np.int64)), dyn.forward(tokens, np.zeros(2, np.int64)),
                               rtol=0, atol=1e-10)


def test_capture_needs_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        StepGraphs(lambda t, p: t, torch.device("cpu"), capture=True)


# ---------------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["model", "early-exit:1"])
def test_recorded_graphs_give_the_eager_tokens_on_cuda(kind, dtype):
    target = tiny_llama(dtype=dtype, init_std=0.3, layers=3, eos=None).cuda()
    draft = perturbed(target, scale=0.2) if kind == "model" else kind
    gens = [SpeculativeGenerator(target, draft, lookahead=3, cuda_graphs=g) for g in (False, True)]
    outs = [g.generate(PROMPTS, max_new_tokens=24, temperature=0, eos_token_id=[]) for g in gens]
    assert outs[1].sequences == outs[0].sequences
    graphs = gens[1]._target_lm.graphs
    assert graphs.capture and graphs.captures > 0
    before = graphs.captures
    gens[1].generate(PROMPTS, max_new_tokens=24, temperature=0, eos_token_id=[])
    assert graphs.captures == before  # a steady loop replays what it recorded
