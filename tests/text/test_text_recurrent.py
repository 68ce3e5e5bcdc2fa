"""Recurrent layers in the position-indexed cache: a rollback restores the exact state.

For every recurrent family of ``tests/text/families.py`` (tiny random models, float64): rows of
different prompt lengths are prefilled together, fed a block of k+1 tokens, and row r keeps r of
them (rejection at every position of the block, all kept, none kept); each row's convolution
window and recurrent state must then equal those of a fresh run on its kept prefix alone, and its
next logits those of a full forward pass. The same with the block fed as a draft feeds it (the
pending tokens, then one token per forward). A planted rollback bug is refused by the model check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import FAMILIES, tiny_model
from speculate.domains.text.models import recurrent
from speculate.domains.text.models.kv_cache import CachedModel, check_model
from speculate.domains.text.models.probe import CHECKS
from speculate.domains.text.models.recurrent import Feed, RowState
from speculate.domains.text.models.recurrent_mixers import MIXERS, find_mixers, unknown_recurrent

RECURRENT_TYPES = ("mamba", "falcon_mamba", "mamba2", "jamba", "bamba", "falcon_h1", "zamba2", "nemotron_h",
                   "granitemoehybrid", "lfm2", "qwen3_next")
RECURRENT = [f for f in FAMILIES if f.model_type in RECURRENT_TYPES]
K = 4  # drafts per block: rows keep 0 .. K+1 of the K+1 fed tokens
PROMPTS = [[1, 5, 7, 2, 9], [3, 3], [8, 2, 6, 1, 0, 4, 11], [4, 6, 10], [2, 7, 7, 1], [9, 1, 3, 3, 12, 5]]


def _states(lm: CachedModel, row: int) -> list[torch.Tensor]:
    out = []
    for st in lm.recurrent.states:
        out.append(st.conv[row])
        if st.state is not None:
            out.append(st.state[row])
    return out


def _fresh(model, seq: list[int]) -> CachedModel:
    lm = CachedModel(model)
    lm.reset(batch=1, capacity=len(seq) + 4)
    lm.forward(torch.tensor([seq]), np.array([0]))
    lm.keep(np.array([len(seq)]))
    return lm


def _check_rows(model, lm: CachedModel, seqs: list[list[int]]) -> None:
    """Each row's states equal a fresh run's on its sequence, and its next two logits a full forward's
    (to float32 rounding: Mamba2 and gated delta nets scan in float32, as transformers does, whose
    own chunked scan rounds differently)."""
    nxt = torch.tensor([[5, 11]] * len(seqs))
    got = lm.forward(nxt, lm.length.copy())
    for r, seq in enumerate(seqs):
        fresh = _fresh(model, seq)
        for a, b in zip(_states(lm, r), _states(fresh, 0), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        full = model(input_ids=torch.tensor([[*seq, 5, 11]])).logits[0, -2:]
        torch.testing.assert_close(got[r], full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["gather", "replay"])
@pytest.mark.parametrize("as_draft", [False, True], ids=["one block", "draft steps"])
@pytest.mark.parametrize("fam", RECURRENT, ids=lambda f: f.name)
def test_rejection_at_every_position_restores_the_exact_state(fam, as_draft, path, monkeypatch):
    """Both rollbacks: the logged state after the kept slot (small states) and the replay of the
    kept slots' step inputs (states over ``STATE_LOG_LIMIT`` elements per row)."""
    if path == "replay":
        monkeypatch.setattr(recurrent, "STATE_LOG_LIMIT", 0)
    model = tiny_model(fam)
    R = K + 2
    prompts = PROMPTS[:R]
    g = torch.Generator().manual_seed(7)
    block = torch.randint(0, 16, (R, K + 1), generator=g)  # row r keeps r of these
    lm = CachedModel(model)
    lm.reset(batch=R, capacity=16)
    lens = np.array([len(p) for p in prompts])
    L = int(lens.max())
    ids = torch.tensor([p + [0] * (L - len(p)) for p in prompts])  # right-padded: ragged valid columns
    lm.forward(ids, np.zeros(R, np.int64), valid=lens)
    lm.keep(lens)
    start = lm.length.copy()
    if as_draft:  # the first token with the block's opening, then one per forward, as ModelDraft feeds
        lm.forward(block[:, :1], start)
        for j in range(1, K + 1):
            lm.forward(block[:, j : j + 1], start + j)
    else:
        lm.forward(block, start)
    logged = [st.log_state is not None for st in lm.recurrent.states if st.state is not None]
    assert all(logged) if path == "gather" else not any(logged)  # the path under test runs
    keep = np.arange(R)
    lm.keep(keep)
    _check_rows(model, lm, [p + block[r, : keep[r]].tolist() for r, p in enumerate(prompts)])


@pytest.mark.parametrize("path", ["gather", "replay"])
def test_rollback_through_drops_and_ragged_blocks(path, monkeypatch):
    """Rows leave the batch between rounds, blocks are ragged (``valid``), and rows roll back by
    different amounts over several rounds: states stay those of the kept sequences."""
    if path == "replay":
        monkeypatch.setattr(recurrent, "STATE_LOG_LIMIT", 0)
    fam = next(f for f in RECURRENT if f.model_type == "jamba")  # Mamba and attention layers
    model = tiny_model(fam)
    rng = np.random.default_rng(3)
    seqs = [list(p) for p in PROMPTS]
    lm = CachedModel(model)
    lm.reset(batch=len(seqs), capacity=40)
    lens = np.array([len(s) for s in seqs])
    ids = torch.tensor([s + [0] * (lens.max() - len(s)) for s in seqs])
    lm.forward(ids, np.zeros(len(seqs), np.int64), valid=lens)
    lm.keep(lens)
    live = list(range(len(seqs)))
    for step in range(5):
        W = 4
        valid = rng.integers(1, W + 1, len(live))
        block = torch.from_numpy(rng.integers(0, 16, (len(live), W)))
        lm.forward(block, lm.length.copy(), valid=valid)
        kept = rng.integers(0, valid + 1)
        for i, r in enumerate(live):
            seqs[r] += block[i, : kept[i]].tolist()
        lm.keep(kept)
        if step == 1:  # drop rows 1 and 4
            keep = np.array([i for i, r in enumerate(live) if r not in (1, 4)])
            lm.select(keep)
            live = [live[i] for i in keep]
    _check_rows(model, lm, [seqs[r] for r in live])


def test_row_state_refuses_slots_it_did_not_log():
    st = RowState(kernel=2, step=lambda h, x: h + x[0])
    st.init(torch.zeros(1, 1, 1), torch.zeros(1, 1))
    feed = Feed.of(np.array([0]), np.array([2]), 3, torch.device("cpu"))
    conv, _ = st.at(feed.offset)
    xs = torch.ones(1, 3, 1)
    st.end(feed, xs, (xs,), torch.full((1, 1), 2.0), conv)
    with pytest.raises(RuntimeError, match="past the logged slots"):
        st.keep(np.array([3]))  # only 2 of the 3 columns were valid
    st.keep(np.array([1]))
    assert st.state.tolist() == [[1.0]]


def test_a_planted_rollback_bug_is_refused(monkeypatch):
    """The model check rolls a row back past two fed tokens: keeping the cursor instead of the kept
    prefix's state makes it refuse the model."""
    model = tiny_model(next(f for f in RECURRENT if f.model_type == "mamba"))
    check_model(model)
    CHECKS.pop(model)

    def keep_cursor(self, n):
        self.conv, self.state = self.cur_conv, self.cur_state

    monkeypatch.setattr(RowState, "keep", keep_cursor)
    with pytest.raises(ValueError, match="different logits"):
        check_model(model)


def test_every_supported_family_with_recurrent_layers_is_tested_here():
    have = {f.model_type for f in FAMILIES if f.status != "refused" and find_mixers(tiny_model(f))}
    assert have == set(RECURRENT_TYPES)


def test_mixer_registry_names_transformers_classes():
    import importlib

    found = set()
    for t in RECURRENT_TYPES:
        mod = importlib.import_module(f"transformers.models.{t}.modeling_{t}")
        found |= {name for name in dir(mod) if name in MIXERS}
    assert found == set(MIXERS), f"renamed or removed in transformers: {set(MIXERS) - found}"


def test_unknown_recurrent_layers_are_found():
    class Scan(torch.nn.Module):  # a state-space layer no implementation rolls back
        def __init__(self):
            super().__init__()
            self.A_log = torch.nn.Parameter(torch.zeros(4))

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), Scan())
    assert unknown_recurrent(net) == ["Scan"]
    assert unknown_recurrent(tiny_model(next(f for f in RECURRENT if f.model_type == "mamba"))) == []
