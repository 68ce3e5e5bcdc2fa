"""Property tests (Hypothesis) of ``SpeculativeGenerator.generate`` over arbitrary input.

Arbitrary batch sizes (empty included), ragged, empty and out-of-range prompts, int32 / uint8 /
float / bool ids, text, nested lists, masks (left, right, with holes, of the wrong shape or
values), ``max_new_tokens`` 0, 1, large and past a model's positions, edge temperatures (0,
subnormal, huge), top-k (1 .. > V), top-p (1e-9 .. 1), lookahead 0..16 and "auto", EOS ids (none,
lists, out of range), every draft kind (model drafts with equal, smaller and larger
vocabularies, n-gram, early exit) on a RoPE Llama and on GPT-2 (learned positions).

Every call either raises ``ValueError`` / ``TypeError`` before any work (no forward pass of the
target) when the input is bad, or returns, for good input, a result that is exactly the target's:
every row keeps its prompt, has at most ``max_new_tokens`` new ids, all inside the vocabulary,
stops exactly at its first EOS, and every new token is in the support of the target's transformed
law given what precedes it (a full forward pass in float64); at temperature 0 each new token is
the argmax, so the output equals plain greedy decoding. (Whether the sampled tokens follow the
law with the right frequencies is the job of test_text_exactness.py.)

Examples: 200 good and 200 bad requests in the default run (about 10 s of CPU), 3000 of each
under the ``slow`` marker; ``--hypothesis-show-statistics`` prints the counts.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.request.sampling import SamplingConfig, probabilities

N_POSITIONS = 20  # the GPT-2 target's learned positions
WINDOW = 5  # the Mistral target's sliding window: most requests cross it
PAD = 12  # the targets' pad_token_id (outside their 12 ids): "left, no mask" prompts are padded with it


@functools.cache
def _models():
    from transformers import GPT2Config, GPT2LMHeadModel

    def gpt2(layers, seed):
        torch.manual_seed(seed)
        cfg = GPT2Config(vocab_size=12, n_embd=32, n_layer=layers, n_head=2, n_positions=N_POSITIONS,
                         bos_token_id=None, eos_token_id=None, initializer_range=0.3)
        return GPT2LMHeadModel(cfg).double().eval()

    small = dict(layers=1, hidden=16, heads=2, kv_heads=1, dtype=torch.float64, init_std=0.3)
    def mistral():
        from transformers import MistralConfig, MistralForCausalLM

        torch.manual_seed(2)
        cfg = MistralConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
                            max_position_embeddings=64, initializer_range=0.3, bos_token_id=None,
                            eos_token_id=None, pad_token_id=None)
        return MistralForCausalLM(cfg).double().eval()

    return {
        "mistral": mistral(),
        "llama": tiny_llama(dtype=torch.float64, init_std=0.3),
        "llama-draft": tiny_llama(rng=1, **small),
        "llama-draft-v10": tiny_llama(vocab=10, rng=2, **small),
        "llama-draft-v14": tiny_llama(vocab=14, rng=3, **small),
        "gpt2": gpt2(2, 0),
        "gpt2-draft": gpt2(1, 1),
    }


DRAFTS = {
    "llama": ["llama-draft", "llama-draft-v10", "llama-draft-v14", "ngram", "ngram:1", "early-exit:1"],
    "gpt2": ["gpt2-draft", "ngram", "early-exit:1"],
    "mistral": ["ngram", "early-exit:1"],
}
LIMITED = ("gpt2",)  # N_POSITIONS learned positions (a sliding window is no limit)
V = 12


class Forwards:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += 1


@st.composite
def requests(draw, bad: bool):
    """(target name, generator kwargs, generate kwargs, prompts as given, the unpadded prompts,
    list of what is wrong with the request)."""
    wrong = []
    target = draw(st.sampled_from(["llama", "gpt2", "mistral"]))
    draft = draw(st.sampled_from(DRAFTS[target]))
    lookahead = draw(st.one_of(st.integers(0, 16), st.just("auto")))
    verify = draw(st.sampled_from(["token", "block", "greedy"]))
    gen_kw = dict(draft=draft, lookahead=lookahead, verify=verify,
                  max_lookahead=draw(st.integers(1, 16)))
    B = draw(st.integers(1, 8))
    prompts = [draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=12)) for _ in range(B)]
    n_new = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 19, 40]))
    temperature = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(5e-324, 1e-20),
                                 st.floats(0.05, 5.0), st.just(1e30)))
    top_k = draw(st.one_of(st.none(), st.integers(1, 15)))
    top_p = draw(st.one_of(st.none(), st.just(1.0), st.floats(1e-9, 1.0, exclude_min=True)))
    eos = draw(st.one_of(st.none(), st.just([]), st.integers(0, V - 1),
                         st.lists(st.integers(0, V - 1), min_size=1, max_size=3)))
    layout = draw(st.sampled_from(["lists", "left", "right", "int32", "numpy-uint8", "flat", "left, no mask"]))
    if layout == "flat" and B > 1:
        layout = "lists"
    if target in LIMITED:  # keep the lengths inside the limit (unless made too long below)
        n_new = min(n_new, N_POSITIONS - max(len(p) for p in prompts))
    if verify == "greedy":  # the greedy rule is for temperature 0 (unless made wrong below)
        temperature = 0.0
    if bad:
        what = draw(st.sampled_from([
            "no rows", "empty prompt", "id too large", "negative id", "float ids", "bool ids", "text",
            "nested", "mask hole", "mask value", "mask shape", "eos too large", "eos float",
            "max_new_tokens negative", "max_new_tokens float", "temperature negative",
            "temperature nan", "temperature inf", "top_k 0", "top_p 0", "top_p > 1",
            "greedy rule, T > 0", "too long", "rng", "batch encoding"]))
        wrong.append(what)
        r = draw(st.integers(0, B - 1))
        if what == "no rows":
            prompts = []
        elif what == "empty prompt":
            prompts[r] = []
        elif what == "id too large":
            prompts[r][draw(st.integers(0, len(prompts[r]) - 1))] = draw(st.integers(PAD + 1, 10**6))  # PAD pads
        elif what == "negative id":
            prompts[r][draw(st.integers(0, len(prompts[r]) - 1))] = draw(st.integers(-10**6, -1))
        elif what in ("float ids", "bool ids", "text", "nested", "batch encoding"):
            layout = what
        elif what.startswith("mask"):
            layout = what
            prompts[r] = prompts[r] + [1, 2]  # room for a hole
        elif what == "eos too large":
            eos = [draw(st.integers(V, 10**6))]
        elif what == "eos float":
            eos = 1.5
        elif what == "max_new_tokens negative":
            n_new = -1
        elif what == "max_new_tokens float":
            n_new = 2.5
        elif what == "temperature negative":
            temperature = -0.5
        elif what == "temperature nan":
            temperature = float("nan")
        elif what == "temperature inf":
            temperature = float("inf")
        elif what == "top_k 0":
            top_k = 0
        elif what == "top_p 0":
            top_p = 0.0
        elif what == "top_p > 1":
            top_p = 1.5
        elif what == "greedy rule, T > 0":
            gen_kw["verify"], temperature = "greedy", draw(st.floats(0.1, 2.0))
        elif what == "too long":
            target = draw(st.sampled_from(LIMITED))
            gen_kw["draft"] = draw(st.sampled_from(DRAFTS[target]))
            n_new = N_POSITIONS - max(len(p) for p in prompts) + draw(st.integers(1, 5))
        if target in LIMITED and what != "too long" and prompts:  # one thing wrong at a time
            n_new = min(n_new, N_POSITIONS - max(len(p) for p in prompts))
    gk = dict(max_new_tokens=n_new, temperature=temperature, top_k=top_k, top_p=top_p,
              eos_token_id=eos, rng=draw(st.integers(0, 2**32)) if "rng" not in wrong else "seed")
    ids, mask = _layout(prompts, layout)
    gk["attention_mask"] = mask
    return target, gen_kw, gk, ids, prompts, wrong


def _layout(prompts, layout):
    """input_ids (and attention_mask) in the given format."""
    if layout == "flat" and len(prompts) == 1:
        return list(prompts[0]), None
    if layout in ("lists", "no rows") or not prompts or any(len(p) == 0 for p in prompts):
        return [list(p) for p in prompts], None
    L = max(len(p) for p in prompts)
    left = [[0] * (L - len(p)) + p for p in prompts]
    lmask = [[0] * (L - len(p)) + [1] * len(p) for p in prompts]
    if layout == "left":
        return torch.tensor(left), torch.tensor(lmask)
    if layout == "left, no mask":  # padded with PAD (the targets' pad_token_id): the mask is inferred
        return torch.tensor([[PAD] * (L - len(p)) + p for p in prompts]), None
    if layout == "batch encoding":  # a tokenizer's whole output passed as input_ids
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": torch.tensor(left), "attention_mask": torch.tensor(lmask)}), None
    if layout == "right":
        return (torch.tensor([p + [0] * (L - len(p)) for p in prompts]),
                torch.tensor([[1] * len(p) + [0] * (L - len(p)) for p in prompts]))
    if layout == "int32":
        return torch.tensor(left, dtype=torch.int32), torch.tensor(lmask)
    if layout == "numpy-uint8":
        small = all(0 <= t < 256 for p in prompts for t in p)
        return np.array(left, np.uint8 if small else np.int64), np.array(lmask)
    if layout == "float ids":
        return torch.tensor(left, dtype=torch.float32), torch.tensor(lmask)
    if layout == "bool ids":
        return torch.tensor(left) > 3, None
    if layout == "text":
        return ["".join(chr(97 + t) for t in p) for p in prompts], None
    if layout == "nested":
        return [[[t] for t in p] for p in prompts], None
    mask = torch.tensor(lmask)
    r = next(i for i, p in enumerate(prompts) if len(p) >= 3)
    if layout == "mask hole":
        mask[r, L - 2] = 0  # a 0 between two tokens of row r
    elif layout == "mask value":
        mask[r, -1] = 2
    elif layout == "mask shape":
        mask = mask[:, 1:]
    return torch.tensor(left), mask


def _generator(target_name, gen_kw):
    m = _models()
    m[target_name].generation_config.pad_token_id = PAD  # outside the vocabulary: never a prompt token
    kw = dict(gen_kw)
    draft = kw.pop("draft")
    return SpeculativeGenerator(m[target_name], m.get(draft, draft), **kw)


def _check_bad(req):
    target_name, gen_kw, gk, ids, _, wrong = req
    gen = _generator(target_name, gen_kw)
    calls = Forwards(_models()[target_name])
    try:
        with pytest.raises((ValueError, TypeError)) as err:
            gen.generate(ids, **gk)
    finally:
        calls.handle.remove()
    assert calls.n == 0, f"{wrong}: {calls.n} forward passes before the error"
    assert len(str(err.value)) > 20, f"{wrong}: unclear message {err.value!r}"


def _check_good(req):
    target_name, gen_kw, gk, ids, prompts, _ = req
    gen = _generator(target_name, gen_kw)
    out = gen.generate(ids, **gk)
    model = _models()[target_name]
    n_new, eos = gk["max_new_tokens"], gk["eos_token_id"]
    eos = set() if eos is None or eos == [] else ({eos} if isinstance(eos, int) else set(eos))
    cfg = SamplingConfig(gk["temperature"], gk["top_k"], gk["top_p"])
    assert len(out.sequences) == len(prompts) and out.prompt_lengths == [len(p) for p in prompts]
    for r, (p, seq, new) in enumerate(zip(prompts, out.sequences, out.new_tokens, strict=True)):
        assert seq[: len(p)] == p, f"row {r} lost its prompt"
        assert len(new) <= n_new and all(0 <= t < V for t in new), f"row {r}: {new}"
        stops = [i for i, t in enumerate(new) if t in eos]
        assert stops in ([], [len(new) - 1]), f"row {r} went past an EOS: {new}"
        assert len(new) == n_new or stops, f"row {r} stopped early without an EOS: {new}"
        if not new:
            continue
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([seq])).logits[0, len(p) - 1 : len(seq) - 1]  # [n, V]
        if cfg.greedy:
            assert new == logits.argmax(-1).tolist(), f"row {r}: not the greedy tokens"
        else:
            prob = probabilities(logits, cfg)  # float32, as the generator computes it
            support = prob[torch.arange(len(new)), torch.tensor(new)]
            assert bool((support > 0).all()), f"row {r}: a token outside the target's support: {new}"
    s = out.stats
    assert s.proposed >= s.accepted >= 0 and s.emitted == sum(len(t) for t in out.new_tokens)


@settings(max_examples=200)
@given(requests(bad=True))
def test_bad_requests_raise_a_clear_error_before_any_work(req):
    _check_bad(req)


@settings(max_examples=200)
@given(requests(bad=False))
def test_good_requests_give_the_targets_tokens(req):
    _check_good(req)


@pytest.mark.slow
@settings(max_examples=3000)
@given(requests(bad=True))
def test_bad_requests_raise_a_clear_error_before_any_work_slow(req):
    _check_bad(req)


@pytest.mark.slow
@settings(max_examples=3000)
@given(requests(bad=False))
def test_good_requests_give_the_targets_tokens_slow(req):
    _check_good(req)
