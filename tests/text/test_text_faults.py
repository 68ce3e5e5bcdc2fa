"""Faults: a model that raises in the middle of a run, an interrupt, a batch too large for memory.

An exception raised by the target or the draft in round r of many propagates unchanged with the
round loop's note (phase, round, rows); both caches are released; the next call on the same
generator gives exactly what a fresh generator gives. A batch whose KV caches cannot fit in the
available memory is refused before anything is allocated, with the numbers.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.models import limits as text_limits
from speculate.domains.text.models.kv_cache import CachedModel
from speculate.domains.text.models.lean_llama import LeanLlama
from speculate.domains.text.models.memory import CacheMemoryError, cache_bytes
from speculate.domains.text.request import tokens as text_tokens

PROMPTS = [[1, 5, 7], [3, 3, 9, 4, 3, 3], [8, 2]]
KW = dict(max_new_tokens=24, eos_token_id=[], top_k=6, rng=5)


class Boom(Exception):
    pass


def _fail_on(n, exc):
    """A function raising ``exc`` on its n-th call (counting from 1)."""
    calls = [0]

    def hit():
        calls[0] += 1
        if calls[0] == n:
            raise exc

    return hit


def _draft(kind, make_llama):
    return make_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=1) if kind == "model" else kind


def _released(gen):
    lm = gen._target_lm
    assert lm.cache is None and len(lm.length) == 0, "the target's cache was not released"
    d = getattr(gen.draft, "lm", None)
    if isinstance(d, LeanLlama):
        assert d.k == [] and len(d.length) == 0, "the lean draft's cache was not released"
    elif isinstance(d, CachedModel):
        assert d.cache is None and len(d.length) == 0, "the draft's cache was not released"


def _same_as_fresh(gen, target, kind, make_llama, verify):
    again = gen.generate(PROMPTS, **KW)
    fresh = SpeculativeGenerator(target, _draft(kind, make_llama), lookahead=3, verify=verify).generate(PROMPTS, **KW)
    assert again.sequences == fresh.sequences
    assert (again.stats.rounds, again.stats.proposed, again.stats.accepted) == \
        (fresh.stats.rounds, fresh.stats.proposed, fresh.stats.accepted)


@pytest.mark.parametrize("exc", [Boom("target failed"), KeyboardInterrupt()], ids=["Boom", "KeyboardInterrupt"])
@pytest.mark.parametrize("kind,verify", [("model", "block"), ("ngram", "token"), ("early-exit:1", "block")])
def test_target_fails_in_round_3(make_llama, kind, verify, exc):
    """The target's 4th forward (1: prefill, then one per round) raises: round 3, all rows live."""
    target = make_llama()
    gen = SpeculativeGenerator(target, _draft(kind, make_llama), lookahead=3, verify=verify)
    hit = _fail_on(4, exc)
    handle = target.register_forward_hook(lambda *a: hit())
    try:
        with pytest.raises(type(exc)) as err:
            gen.generate(PROMPTS, **KW)
    finally:
        handle.remove()
    assert err.value is exc  # unchanged, with a note saying where
    assert "speculate.rounds.run: raised in score of round 3 (rows 0, 1, 2)" in err.value.__notes__
    _released(gen)
    _same_as_fresh(gen, target, kind, make_llama, verify)


@pytest.mark.parametrize("exc", [Boom("draft failed"), KeyboardInterrupt()], ids=["Boom", "KeyboardInterrupt"])
@pytest.mark.parametrize("kind", ["model", "early-exit:1"])
def test_draft_model_fails_mid_run(make_llama, kind, exc):
    """The draft's 9th forward raises (1: prefill, then up to 3 per round): a later round's propose."""
    target = make_llama()
    gen = SpeculativeGenerator(target, _draft(kind, make_llama), lookahead=3, verify="block")
    lm = gen.draft.lm
    hit = _fail_on(9, exc)
    forward = lm.forward

    def failing(*args, **kwargs):
        hit()
        return forward(*args, **kwargs)

    lm.forward = failing
    try:
        with pytest.raises(type(exc)) as err:
            gen.generate(PROMPTS, **KW)
    finally:
        del lm.forward
    assert err.value is exc
    note = [n for n in err.value.__notes__ if n.startswith("speculate.rounds.run")]
    m = re.fullmatch(r"speculate\.rounds\.run: raised in propose of round (\d+) \(rows [\d, ]+\)", note[0])
    assert m and int(m.group(1)) >= 3, note
    _released(gen)
    _same_as_fresh(gen, target, kind, make_llama, "block")


@pytest.mark.parametrize("phase", ["propose", "commit"])
def test_ngram_draft_fails_mid_run(make_llama, phase):
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram", lookahead=3, verify="token")
    method = "propose" if phase == "propose" else "advance"
    hit = _fail_on(5, Boom(phase))
    original = getattr(gen.draft, method)

    def failing(*args, **kwargs):
        hit()
        return original(*args, **kwargs)

    setattr(gen.draft, method, failing)
    try:
        with pytest.raises(Boom) as err:
            gen.generate(PROMPTS, **KW)
    finally:
        delattr(gen.draft, method)
    assert f"speculate.rounds.run: raised in {phase} of round 5 (rows 0, 1, 2)" in err.value.__notes__
    _released(gen)
    _same_as_fresh(gen, target, "ngram", make_llama, "token")


def test_a_failure_during_prefill_releases_the_caches(make_llama):
    target = make_llama()
    gen = SpeculativeGenerator(target, _draft("model", make_llama), lookahead=3)
    hit = _fail_on(1, Boom("prefill"))
    handle = target.register_forward_hook(lambda *a: hit())
    try:
        with pytest.raises(Boom):
            gen.generate(PROMPTS, **KW)
    finally:
        handle.remove()
    _released(gen)
    _same_as_fresh(gen, target, "model", make_llama, "block")


# ---------------------------------------------------------------- memory


def test_a_batch_too_large_for_memory_fails_at_once(make_llama, monkeypatch):
    """4 rows of 10^12 tokens: petabytes of cache. The error comes before anything is allocated
    (the token buffer, the first allocation, is never built; no forward runs), with the numbers."""
    target = make_llama()
    gen = SpeculativeGenerator(target, _draft("model", make_llama), lookahead=3)

    def no_allocation(*args, **kwargs):
        raise AssertionError("generate allocated its token buffer for a batch that cannot fit")

    monkeypatch.setattr(text_tokens.TokenBuffer, "from_prompts", no_allocation)
    forwards = []
    handle = target.register_forward_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(CacheMemoryError) as err:
            gen.generate([[1, 2, 3]] * 4, max_new_tokens=10**12)
    finally:
        handle.remove()
    assert isinstance(err.value, MemoryError) and isinstance(err.value, ValueError)
    msg = str(err.value)
    assert re.search(r"4 rows of up to 1000000000003 tokens need [\d.e+]+ GiB \(target KV cache .* GiB, "
                     r"draft KV cache .* GiB, token buffer .* GiB\) but [\d.]+ GiB is available", msg), msg
    assert "Not even one row fits: lower max_new_tokens" in msg
    assert forwards == []


def test_the_memory_check_compares_the_estimate_with_what_is_available(make_llama, monkeypatch):
    """At the boundary: the estimate (both caches and the token buffer) one byte over what is
    available fails, equal to it runs; the message says how many rows would fit."""
    target, draft = make_llama(), _draft("model", make_llama)
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    B, L, n = 40, 6, 10
    cap, spare = L + n, min(3, n) + 2
    total = cache_bytes(target, B, cap + spare) + cache_bytes(draft, B, cap + spare) + B * cap * 8
    monkeypatch.setattr(text_limits, "available_memory", lambda dev: (total - 1, "a test"))
    with pytest.raises(CacheMemoryError, match=r"Pass batch_size=39 .* about 39 rows per call"):
        gen.generate([[1, 2, 3, 4, 5, 6]] * B, max_new_tokens=n)
    # the fix it names works: the same call in chunks of 39 rows
    assert len(gen.generate([[1, 2, 3, 4, 5, 6]] * B, max_new_tokens=n, batch_size=39).sequences) == B
    monkeypatch.setattr(text_limits, "available_memory", lambda dev: (total, "a test"))
    assert len(gen.generate([[1, 2, 3, 4, 5, 6]] * B, max_new_tokens=n).sequences) == B
    monkeypatch.setattr(text_limits, "available_memory", lambda dev: None)  # unknown: no check
    assert len(gen.generate([[1, 2, 3]], max_new_tokens=2).sequences) == 1


@pytest.mark.parametrize("arch", ["llama-lean", "llama-general", "gpt2"])
def test_the_cache_estimate_is_what_the_caches_allocate(make_llama, arch):
    from transformers import GPT2Config, GPT2LMHeadModel

    if arch == "gpt2":
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=32, n_layer=3, n_head=4)).eval()
    else:
        model = make_llama(kv_heads=2, heads=4, dtype=torch.float64)
    lm = LeanLlama(model) if arch == "llama-lean" else CachedModel(model)
    lm.reset(batch=5, capacity=9, spare=3)
    lm.forward(torch.zeros(5, 4, dtype=torch.long), np.zeros(5, np.int64))
    if isinstance(lm, LeanLlama):
        got = sum(t.nbytes for t in lm.k + lm.v)
    else:
        got = sum(layer.keys.nbytes + layer.values.nbytes for layer in lm.cache.layers)
    assert got == cache_bytes(model, 5, 12)


def test_a_draft_on_the_target_copy_counts_its_own_cache(make_llama, monkeypatch):
    """The draft's cache is counted with the target's (a copy of the target: twice the bytes)."""
    target = make_llama()
    gen = SpeculativeGenerator(target, copy.deepcopy(target), lookahead=2)
    seen = {}

    def fake(dev):
        seen["dev"] = dev
        return (0, "a test")

    monkeypatch.setattr(text_limits, "available_memory", fake)
    with pytest.raises(CacheMemoryError) as err:
        gen.generate([[1, 2]], max_new_tokens=3)
    per = cache_bytes(target, 1, 5 + 4) / 2**30  # capacity 2 + 3 tokens, spare min(2, 3) + 2 slots
    assert f"target KV cache {per:.3g} GiB, draft KV cache {per:.3g} GiB" in str(err.value)
    assert seen["dev"] == torch.device("cpu")
