"""Bad input gets a clear exception that names the problem and the fix, raised before any work.

"Before any work" is checked by counting the target's forward calls: a refused call runs none.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.models.kv_cache import check_model
from speculate.domains.text.models.probe import CHECKS
from transformers import GPT2Config, GPT2LMHeadModel


def _gpt2(n_positions=16, vocab=16, eos=None):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                     bos_token_id=None, eos_token_id=eos, initializer_range=0.3)
    return GPT2LMHeadModel(cfg)


class Forwards:
    """Counts the forward calls of a model (a hook), to show that a refused call did no work."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += 1


# ---------------------------------------------------------------- training mode (issue item 1)


def test_training_mode_is_refused_with_the_fix_and_eval_then_works():
    """Regression: a model left in training mode was refused by the cache check with a message
    blaming position_ids / 4-D masks (dropout made cached and uncached logits differ), and the
    verdict, stored per (type, dtype), kept refusing it after .eval()."""
    m = _gpt2()
    assert m.training  # built from a config: training mode, dropout 0.1
    with pytest.raises(ValueError, match=r"target \(GPT2LMHeadModel\) is in training mode.*dropout.*"
                                         r"call target\.eval\(\)") as err:
        SpeculativeGenerator(m, "ngram")
    assert "position_ids" not in str(err.value)
    m.eval()
    gen = SpeculativeGenerator(m, "ngram")  # no verdict remembered across modes
    out = gen.generate([[1, 2, 3]], max_new_tokens=5, eos_token_id=[], rng=0)
    assert len(out.new_tokens[0]) == 5
    # back in training mode after construction: refused at generate, before any forward
    m.train()
    calls = Forwards(m)
    with pytest.raises(ValueError, match=r"call target\.eval\(\)"):
        gen.generate([[1, 2, 3]], max_new_tokens=5)
    assert calls.n == 0
    m.eval()
    assert gen.generate([[1, 2, 3]], max_new_tokens=5, eos_token_id=[], rng=0).sequences == out.sequences


def test_training_mode_of_the_draft_is_refused(make_llama):
    target = make_llama()
    draft = make_llama(layers=1, rng=1).train()
    with pytest.raises(ValueError, match=r"draft \(LlamaForCausalLM\) is in training mode.*call draft\.eval\(\)"):
        SpeculativeGenerator(target, draft)
    gen = SpeculativeGenerator(target, draft.eval())
    draft.model.layers[0].train()  # one submodule is enough
    with pytest.raises(ValueError, match=r"draft .* training mode"):
        gen.generate([1, 2, 3], max_new_tokens=3)
    draft.eval()
    assert len(gen.generate([1, 2, 3], max_new_tokens=3, eos_token_id=[]).new_tokens[0]) == 3


def test_a_failed_cache_check_is_not_remembered_across_settings(make_llama):
    """The stored verdict is keyed by class, dtype, device and attention implementation; training
    mode is checked on every call and never stored."""
    m = make_llama()
    check_model(m)
    key = CHECKS[m]["cache"][0]
    assert torch.float32 in key and torch.device("cpu") in key and "sdpa" in key
    m.train()
    with pytest.raises(ValueError, match="training mode"):
        check_model(m)
    assert CHECKS[m]["cache"][0] == key  # nothing stored for the training mode
    check_model(m.eval())


def test_early_exit_of_an_eval_target_is_in_eval_mode(make_llama):
    from speculate.domains.text.drafts.model import early_exit_model

    ee = early_exit_model(make_llama(layers=3), 1)
    assert not any(m.training for m in ee.modules())


# ---------------------------------------------------------------- prompts (issue item 4)


@pytest.mark.parametrize("ids,err,msg", [
    (["hello"], TypeError, r"holds text.*tokenize it first.*tokenizer="),
    ("hello", TypeError, r"holds text.*tokenize it first.*tokenizer="),
    ([[1, 2], "hi"], TypeError, r"text.*tokenize it first"),
    ([[1.5, 2.0]], TypeError, r"integer token ids, got float64 in row 0"),
    ([1.0, 2.0], TypeError, r"integer token ids, got float64"),
    (torch.tensor([[1.0, 2.0]]), TypeError, r"integer token ids, got float32"),
    (torch.tensor([[True, False]]), TypeError, r"integer token ids, got bool"),
    ([[[1, 2], [3, 4]]], ValueError, r"row 0 .* flat list of token ids, got shape \(2, 2\)"),
    (np.int64(3), TypeError, r"LongTensor \[B, L\] or lists of token ids"),
    (torch.tensor(3), ValueError, r"\[B, L\] or \[L\]"),
    ([[1, 2], [3, 99]], ValueError, r"row 1 .* outside 0..11 \(e.g. 99\)"),
])
def test_bad_prompts_name_the_problem_and_the_fix(make_llama, ids, err, msg):
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram")
    calls = Forwards(target)
    with pytest.raises(err, match=msg):
        gen.generate(ids, max_new_tokens=3)
    assert calls.n == 0


def test_int32_and_numpy_prompts_are_token_ids(make_llama):
    gen = SpeculativeGenerator(make_llama(), "ngram")
    want = gen.generate([[1, 2, 3]], max_new_tokens=4, eos_token_id=[], rng=0).sequences
    for ids in (torch.tensor([[1, 2, 3]], dtype=torch.int32), np.array([[1, 2, 3]], np.uint8),
                [np.int32(1), np.int64(2), 3]):
        assert gen.generate(ids, max_new_tokens=4, eos_token_id=[], rng=0).sequences == want


def test_text_is_tokenized_when_the_generator_has_a_tokenizer(make_llama):
    from speculate.domains.text import ByteTokenizer

    tok = ByteTokenizer()
    target = make_llama(vocab=len(tok))
    gen = SpeculativeGenerator(target, "ngram", tokenizer=tok)
    out = gen.generate(["ab", "xyz"], max_new_tokens=3, eos_token_id=[], rng=0)
    want = gen.generate(tok(["ab", "xyz"]).input_ids, max_new_tokens=3, eos_token_id=[], rng=0)
    assert out.sequences == want.sequences and out.prompt_lengths == [len(r) for r in tok(["ab", "xyz"]).input_ids]
    with pytest.raises(ValueError, match="attention_mask goes with token ids"):
        gen.generate(["ab"], attention_mask=[[1, 1]], max_new_tokens=3)


@pytest.mark.parametrize("mask,msg", [
    ([[1, 0, 1, 1]], r"row 0 of attention_mask has padding inside the prompt \(a 0 at column 1.*left or right"),
    ([[1, 1, 1, 1], [0, 1, 0, 1]], r"row 1 .* column 2"),
    ([[2, 1, 1, 1]], r"only 0 \(padding\) and 1 \(token\), got \[2\]"),
    ([[0.5, 1, 1, 1]], r"only 0 .* got \[0.5\]"),
    ([[1, 1, 1]], r"does not match input_ids"),
])
def test_bad_attention_masks(make_llama, mask, msg):
    """Regression: a mask with holes silently dropped the masked tokens from the prompt."""
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram")
    ids = torch.tensor([[1, 2, 3, 4]] * len(mask))
    calls = Forwards(target)
    with pytest.raises(ValueError, match=msg):
        gen.generate(ids, attention_mask=torch.tensor(mask), max_new_tokens=3)
    assert calls.n == 0


def test_left_right_and_both_side_padding_stay_accepted(make_llama):
    gen = SpeculativeGenerator(make_llama(), "ngram")
    kw = dict(max_new_tokens=4, eos_token_id=[], temperature=0)
    want = gen.generate([[1, 2, 3]], **kw).sequences[0]
    for ids, mask in [([[0, 1, 2, 3]], [[0, 1, 1, 1]]), ([[1, 2, 3, 0]], [[1, 1, 1, 0]]),
                      ([[0, 1, 2, 3, 0]], [[0, 1, 1, 1, 0]]),
                      ([[1, 2, 3]], [[True, True, True]])]:
        assert gen.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), **kw).sequences[0] == want


# ---------------------------------------------------------------- EOS (issue item 4)


@pytest.mark.parametrize("eos,err,msg", [
    (12, ValueError, r"eos_token_id has id\(s\) \[12\] outside the target's vocabulary \(ids 0..11\)"
                     r".*\[\] to never stop"),
    ([3, -1], ValueError, r"\[-1\] outside"),
    (1.5, TypeError, r"eos_token_id must be an int, a list of ints"),
    ("2", TypeError, r"eos_token_id must be an int"),
    (True, TypeError, r"eos_token_id must be an int"),
])
def test_bad_eos_token_ids(make_llama, eos, err, msg):
    """Regression: an EOS id beyond the vocabulary was accepted silently (no row can ever stop)."""
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram")
    calls = Forwards(target)
    with pytest.raises(err, match=msg):
        gen.generate([1, 2, 3], max_new_tokens=3, eos_token_id=eos)
    assert calls.n == 0


def test_eos_from_the_generation_config_is_checked_too():
    m = _gpt2(eos=50256).eval()  # GPT2Config's default EOS, in a 16-token vocabulary
    with pytest.raises(ValueError, match=r"generation_config\.eos_token_id has id\(s\) \[50256\].*pass eos_token_id="):
        SpeculativeGenerator(m, "ngram").generate([1, 2], max_new_tokens=2)
    out = SpeculativeGenerator(m, "ngram").generate([1, 2], max_new_tokens=2, eos_token_id=[])
    assert len(out.new_tokens[0]) == 2


def test_eos_as_a_tensor_or_tuple(make_llama):
    gen = SpeculativeGenerator(make_llama(), "ngram")
    a = gen.generate([[1, 2, 3]] * 20, max_new_tokens=6, eos_token_id=torch.tensor([0, 4]), rng=1)
    b = gen.generate([[1, 2, 3]] * 20, max_new_tokens=6, eos_token_id=(4, 0), rng=1)
    assert a.sequences == b.sequences


# ---------------------------------------------------------------- lengths (issue items 2, 4)


def test_prompt_plus_new_tokens_beyond_learned_positions_is_refused():
    """Regression: GPT-2 with prompt + new tokens > n_positions raised IndexError from torch in
    the middle of a run. Now: a ValueError before any work, naming the limit and the fix."""
    m = _gpt2(n_positions=16).eval()
    gen = SpeculativeGenerator(m, "ngram", lookahead=4)
    calls = Forwards(m)
    with pytest.raises(ValueError, match=r"row 1: its prompt \(8 tokens\) plus max_new_tokens=9 makes 17 tokens.*"
                                         r"16 learned positions.*Lower max_new_tokens to 8"):
        gen.generate([[1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8]], max_new_tokens=9)
    with pytest.raises(ValueError, match=r"Shorten the prompt to at most 15 tokens"):
        gen.generate([list(range(16))], max_new_tokens=1)
    assert calls.n == 0
    out = gen.generate([list(range(12))], max_new_tokens=4, eos_token_id=[])  # exactly 16 fits
    assert len(out.new_tokens[0]) == 4
    assert len(gen.generate([[i % 16 for i in range(20)]], max_new_tokens=0).sequences[0]) == 20  # no work


def test_padded_columns_stay_inside_learned_positions():
    """Regression: with a row near the end of the position table and another far from it, the
    padded columns of the ragged scoring block had positions past the table (IndexError in round
    2 for seed 17) although every row fitted (12 + 4 = 16 = n_positions). Their position ids are
    now clamped (their outputs are never used)."""
    m = _gpt2(n_positions=16).eval()
    for draft in ("early-exit:1", "ngram", copy.deepcopy(m)):
        gen = SpeculativeGenerator(m, draft, lookahead=4)
        for seed in range(24):
            out = gen.generate([list(range(1, 13)), [1, 2]], max_new_tokens=4, eos_token_id=[], rng=seed)
            assert [len(t) for t in out.new_tokens] == [4, 4]


def test_models_without_a_position_table_have_no_length_limit(make_llama):
    """RoPE models (max_position_embeddings is a training length, not a table): no limit."""
    target = make_llama()
    assert target.config.max_position_embeddings == 512
    out = SpeculativeGenerator(target, "ngram").generate([list(range(12)) * 42], max_new_tokens=10,
                                                         eos_token_id=[])
    assert len(out.sequences[0]) == 514


@pytest.mark.parametrize("family", ["gpt_neo", "rwkv", "recurrent_gemma"])
def test_a_family_the_cache_cannot_serve_runs_on_the_fallback_with_the_reason(family):
    """A family the position-indexed cache cannot serve runs through transformers' own cache, with a
    warning naming the family, the reason and the installed transformers (tests/text/families.py)."""
    from families import family as row
    from families import tiny_model
    from speculate.domains.text.models.pick import FallbackWarning
    from speculate.domains.text.models.transformers_api import installed

    fam = row(family)
    target = tiny_model(fam)
    with pytest.warns(FallbackWarning, match=fam.refusal) as w:
        gen = SpeculativeGenerator(target, "ngram")
    assert installed() in str(w[0].message)
    out = gen.generate([[1, 2, 3]], max_new_tokens=4, temperature=0, eos_token_id=[])
    assert len(out.new_tokens[0]) == 4


# ---------------------------------------------------------------- other arguments


@pytest.mark.parametrize("kw,msg", [
    ({"max_lookahead": 0}, "max_lookahead must be an int >= 1"),
    ({"max_lookahead": 2.5}, "max_lookahead"),
    ({"lookahead": 2.0}, "lookahead must be an int"),
    ({"cost_ratio": "fast"}, "cost_ratio must be finite"),
    ({"cost_ratio": float("nan")}, "cost_ratio must be finite"),
    ({"verify": ["token"]}, "verify must be one of"),
])
def test_bad_generator_arguments(make_llama, kw, msg):
    with pytest.raises(ValueError, match=msg):
        SpeculativeGenerator(make_llama(), "ngram", **kw)


def test_ngram_size_zero(make_llama):
    with pytest.raises(ValueError, match=r"'ngram:0'.*must be >= 1"):
        SpeculativeGenerator(make_llama(), "ngram:0")


def test_numpy_scalars_are_accepted(make_llama):
    gen = SpeculativeGenerator(make_llama(), "ngram", lookahead=np.int64(3))
    a = gen.generate([1, 2, 3], max_new_tokens=np.int32(5), temperature=np.float32(0.5),
                     top_k=np.int64(4), top_p=np.float64(0.9), eos_token_id=[], rng=0)
    b = gen.generate([1, 2, 3], max_new_tokens=5, temperature=0.5, top_k=4, top_p=0.9,
                     eos_token_id=[], rng=0)
    assert a.sequences == b.sequences


def test_bad_rng_is_refused_before_any_work(make_llama):
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram")
    calls = Forwards(target)
    with pytest.raises(TypeError, match="rng must be"):
        gen.generate([1, 2, 3], max_new_tokens=3, rng="seed")
    assert calls.n == 0


# ---------------------------------------------------------------- non-finite logits


def test_nan_logits_of_the_target_are_refused_not_sampled(make_llama):
    """A model producing NaN: greedy argmax would pick the NaN silently, sampling would pass NaN
    on. Both raise a ValueError naming the model's logits; at construction the cache check says
    so too (it used to blame position_ids), and remembers nothing."""
    target = make_llama()
    gen = SpeculativeGenerator(target, "ngram")
    with torch.no_grad():
        w = target.model.layers[1].mlp.down_proj.weight
        saved = w[0, 0].item()
        w[0, 0] = float("nan")
    for t in (1.0, 0.0):
        with pytest.raises(ValueError, match="target's logits are not finite"):
            gen.generate([[1, 2, 3]] * 2, max_new_tokens=4, temperature=t)
    fresh = make_llama()
    with torch.no_grad():
        fresh.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"not finite.*fix the model") as err:
        SpeculativeGenerator(fresh, "ngram")
    assert "position_ids" not in str(err.value)
    with torch.no_grad():
        fresh.model.layers[1].mlp.down_proj.weight[0, 0] = saved
        w[0, 0] = saved
    SpeculativeGenerator(fresh, "ngram")  # no verdict was stored
    assert len(gen.generate([1, 2, 3], max_new_tokens=4, eos_token_id=[]).new_tokens[0]) == 4


def test_nan_logits_of_the_draft_are_refused(make_llama):
    draft = make_llama(layers=1, rng=1)
    gen = SpeculativeGenerator(make_llama(), draft)
    with torch.no_grad():
        draft.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="draft's logits are not finite"):
        gen.generate([[1, 2, 3]] * 2, max_new_tokens=4)
    # greedy drafts are argmaxes the target verifies: still exactly the target's tokens
    want = SpeculativeGenerator(gen.target, "ngram").generate([1, 2, 3], max_new_tokens=6, temperature=0,
                                                              eos_token_id=[])
    assert gen.generate([1, 2, 3], max_new_tokens=6, temperature=0, eos_token_id=[]).sequences == want.sequences


@pytest.mark.parametrize("t", [1e-30, 1e-40, 5e-324])
def test_tiny_temperatures_are_the_greedy_limit(make_llama, t):
    """Regression: temperature 1e-40 overflowed logits / T to inf, and softmax gave NaN (a
    'Categorical has a row with NaN' error in round 1). Now (x - max) / T: the argmax."""
    target = make_llama(dtype=torch.float64, init_std=0.3)
    gen = SpeculativeGenerator(target, make_llama(layers=1, rng=1, dtype=torch.float64), lookahead=3)
    greedy = gen.generate([[1, 2, 3], [4, 5]], max_new_tokens=8, temperature=0, eos_token_id=[])
    tiny = gen.generate([[1, 2, 3], [4, 5]], max_new_tokens=8, temperature=t, eos_token_id=[], rng=0)
    assert tiny.sequences == greedy.sequences


def test_a_generator_running_refuses_a_second_run_before_touching_its_caches(make_llama):
    """Regression: generate inside the generator's own stream loop (or threads sharing one) died with
    broadcast / index errors from overwritten caches. One clear RuntimeError; the first run is intact."""
    import threading

    gen = SpeculativeGenerator(make_llama(), "ngram", lookahead=2)
    solo = gen.generate([[1, 2, 3]], max_new_tokens=12, rng=5, eos_token_id=[]).sequences
    it = gen.stream([[1, 2, 3]], max_new_tokens=12, rng=5, eos_token_id=[])
    got = list(next(it).tokens[0])
    with pytest.raises(RuntimeError, match=r"already running.*one generator per thread"):
        gen.generate([[4, 5]], max_new_tokens=4, rng=0)
    for event in it:
        got += list(event.tokens[0])
    assert [1, 2, 3, *got] == solo[0]  # the stream was not disturbed
    gen.generate([[4, 5]], max_new_tokens=4, rng=0)  # free again once the stream ended

    results, errors = [], []

    def run():
        try:
            results.append(gen.generate([[1, 2, 3]], max_new_tokens=12, rng=5, eos_token_id=[]).sequences)
        except Exception as e:  # every failure is inspected below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) + len(errors) == 4 and results
    assert all(r == solo for r in results)
    assert all(isinstance(e, RuntimeError) and "already running" in str(e) for e in errors), errors


def test_padded_ids_without_a_mask_are_unpadded_as_transformers_does(make_llama):
    """Regression: left-padded ids without attention_mask were taken as prompt (pads in sequences,
    a different law); transformers infers the mask from pad_token_id (when it is not an EOS id)."""
    target = make_llama()
    target.generation_config.pad_token_id = 0
    gen = SpeculativeGenerator(target, "ngram", lookahead=2)
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    out = gen.generate(ids, max_new_tokens=4, rng=0, eos_token_id=[])
    ref = gen.generate([[5, 6], [7, 8, 9, 10]], max_new_tokens=4, rng=0, eos_token_id=[])
    assert out.sequences == ref.sequences and out.prompt_lengths == [2, 4]
    with pytest.raises(ValueError, match="pad_token_id 0 inside a row"):  # not padding
        gen.generate(torch.tensor([[5, 0, 6]]), max_new_tokens=2, rng=0)
    target.generation_config.eos_token_id = 0  # pad == EOS: transformers keeps every id, so do we
    same = gen.generate(ids, max_new_tokens=4, rng=0, eos_token_id=[])
    assert same.prompt_lengths == [4, 4]


def test_training_mode_without_dropout_says_what_is_wrong(make_llama):
    """Regression: a model with no dropout in training mode was told 'no dropout module ... its logits
    would be random': the message now says what is wrong (training mode; no dropout)."""
    m = make_llama().train()
    with pytest.raises(ValueError, match=r"training mode \(\d+ module\(s\) with training=True; none drops out") as e:
        SpeculativeGenerator(m, "ngram")
    assert "random" not in str(e.value) and "call target.eval()" in str(e.value)


def test_a_tokenizers_output_passed_whole_or_with_token_type_ids(make_llama):
    """Regression: generate(tok(...)) positionally said 'input_ids must be a LongTensor' (now: pass it as
    **batch); token_type_ids in **batch was an unexpected keyword (now ignored where the model's forward
    does not read them, refused where it does: GPT-2 adds their embeddings)."""
    from transformers import BatchEncoding

    gen = SpeculativeGenerator(make_llama(), "ngram")
    batch = BatchEncoding({"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
                           "token_type_ids": torch.zeros(1, 3, dtype=torch.long)})
    with pytest.raises(TypeError, match=r"pass it as keyword arguments, gen\.generate\(\*\*batch"):
        gen.generate(batch, max_new_tokens=2)
    out = gen.generate(**batch, max_new_tokens=3, rng=0, eos_token_id=[])
    assert out.sequences == gen.generate([[1, 2, 3]], max_new_tokens=3, rng=0, eos_token_id=[]).sequences
    with pytest.raises(ValueError, match="reads token_type_ids"):
        SpeculativeGenerator(_gpt2().eval(), "ngram").generate(**batch, max_new_tokens=2)


def test_a_model_on_the_meta_device_is_refused_with_the_fix(make_llama):
    """Regression: weights never loaded (the meta device) gave three probe failures about copying meta
    tensors; now one message saying what is wrong and how to load them, before any forward."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        m = LlamaForCausalLM(make_llama().config).eval()
    with pytest.raises(ValueError, match=r"target \(LlamaForCausalLM\) has weights on the meta device.*to_empty"):
        SpeculativeGenerator(m, "ngram")
    with pytest.raises(ValueError, match=r"the draft .* meta device"):
        SpeculativeGenerator(make_llama(), m)
