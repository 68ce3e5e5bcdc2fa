"""speculate.domains.text.training.distill: divergences, acceptance, on-policy sampling, training, vocabulary checks.

Tiny random Llama pairs built from configs (no downloads). The initialiser scale 0.2 (10x the
usual) makes the next-byte laws peaked and context dependent, so a random draft starts far from
the target (alpha about 0.5) and distillation has something to gain.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from speculate.domains.text.examples.tokenizer import ByteTokenizer
from speculate.domains.text.training.distill import (
    DIVERGENCES,
    acceptance_rate,
    check_vocab,
    distill,
    divergence_loss,
    sample_continuations,
    token_stream,
)
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from speculate.testing import DEFAULT_ALPHA as ALPHA

# the module itself: its source is the training text
distill_module = importlib.import_module("speculate.domains.text.training.distill")
TEXT = (Path(distill_module.__file__).read_bytes())[:4000]


def tiny(vocab: int = 259, hidden: int = 32, layers: int = 2, seed: int = 0,
         std: float = 0.2, bos: int | None = 256, eos: int | None = 257) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, initializer_range=std, bos_token_id=bos,
                      eos_token_id=eos, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def pair(target_vocab: int = 259, draft_vocab: int = 259):
    return tiny(target_vocab, 32, 2, seed=0), tiny(draft_vocab, 16, 1, seed=1)


SMALL = dict(steps=40, batch_size=8, prefix_len=8, continuation_len=8, lr=1e-2, rng=0,
             eval_batch=32)


# ------------------------------------------------------------------ divergences and acceptance


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(("vt", "vd"), [(7, 7), (7, 5), (5, 7)])
def test_divergences_match_float64_formulas(vt, vd):
    g = np.random.default_rng(0)
    lt, ld = g.normal(0, 2, (3, vt)), g.normal(0, 2, (3, vd))
    v, w = max(vt, vd), min(vt, vd)
    p = np.zeros((3, v))
    q = np.zeros((3, v))
    p[:, :vt], q[:, :vd] = _np_softmax(lt), _np_softmax(ld)
    want = {
        "tv": 0.5 * np.abs(p - q).sum(-1),
        "fkl": (p[:, :w] * np.log(p[:, :w] / q[:, :w])).sum(-1),
        "rkl": (q[:, :w] * np.log(q[:, :w] / p[:, :w])).sum(-1),
    }
    m = 0.5 * (p[:, :w] + q[:, :w])
    want["jsd"] = 0.5 * ((p[:, :w] * np.log(p[:, :w] / m)).sum(-1)
                         + (q[:, :w] * np.log(q[:, :w] / m)).sum(-1))
    for kind in DIVERGENCES:
        got = divergence_loss(torch.tensor(lt), torch.tensor(ld), kind).double().numpy()
        np.testing.assert_allclose(got, want[kind], rtol=1e-5, atol=1e-6, err_msg=kind)
    # temperature divides the logits of both models
    got = divergence_loss(torch.tensor(lt), torch.tensor(ld), "tv", temperature=0.5).numpy()
    pt, qt = np.zeros((3, v)), np.zeros((3, v))
    pt[:, :vt], qt[:, :vd] = _np_softmax(lt / 0.5), _np_softmax(ld / 0.5)
    np.testing.assert_allclose(got, 0.5 * np.abs(pt - qt).sum(-1), rtol=1e-5, atol=1e-6)


def test_tv_is_one_minus_acceptance_exactly():
    """1 - TV(p, q) = sum min(p, q), checked in rational arithmetic on the float64 laws."""
    from speculate.testing.exact import acceptance, to_fractions

    g = np.random.default_rng(1)
    lt, ld = g.normal(0, 1, 9), g.normal(0, 1, 9)
    p = to_fractions(_np_softmax(lt), normalize=True)
    q = to_fractions(_np_softmax(ld), normalize=True)
    exact = float(acceptance(p, q))
    tv = float(divergence_loss(torch.tensor(lt), torch.tensor(ld), "tv"))
    assert abs((1.0 - tv) - exact) < 1e-6


def test_acceptance_rate_is_mean_overlap_of_the_two_models():
    target, draft = pair()
    ids = torch.tensor(list(TEXT[:96])).reshape(4, 24)  # [4, 24]
    with torch.no_grad():
        p = target(ids).logits.double().softmax(-1)[:, 5:]  # [4, 19, V]
        q = draft(ids).logits.double().softmax(-1)[:, 5:]
    want = float(torch.minimum(p, q).sum(-1).mean())
    assert acceptance_rate(target, draft, ids, start=5) == pytest.approx(want, abs=1e-6)
    assert acceptance_rate(target, target, ids) == pytest.approx(1.0, abs=1e-6)
    # padded prefix vocabulary: the draft's missing ids count as q = 0
    small = tiny(250, 16, 1, seed=1)
    with torch.no_grad():
        q = small(ids).logits.double().softmax(-1)
        p = target(ids).logits.double().softmax(-1)
    want = float(torch.minimum(p[..., :250], q).sum(-1).mean())
    assert acceptance_rate(target, small, ids) == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        acceptance_rate(target, draft, ids[0])


def test_acceptance_rate_runs_both_models_without_autograd():
    """An evaluation: no graph is kept for either model's forward, even with gradients enabled."""
    target, draft = pair()
    seen = []
    hooks = [m.register_forward_hook(lambda m, a, out: seen.append(out.logits.requires_grad)) for m in (target, draft)]
    try:
        with torch.enable_grad():
            acceptance_rate(target, draft, torch.tensor(list(TEXT[:48])).reshape(2, 24))
    finally:
        for h in hooks:
            h.remove()
    assert seen == [False, False]


# ------------------------------------------------------------------ on-policy sampling


def test_sample_continuations_follows_the_model_law():
    """Two tokens sampled with the KV cache: the law of the SECOND token (which goes through the
    cache) equals sum_x1 p(x1) p(x2 | x1), computed exactly from the model.

    Chi-square on V = 12 cells, n = 40000, two checks (the first and the second token) at ALPHA / 2
    each. A deviation of total variation d gives noncentrality >= n (2 d)^2 (Cauchy-Schwarz);
    d = 0.03 is caught with probability >= 99% (checked below with the noncentral chi-square).
    """
    model = tiny(12, 32, 2, seed=3, std=0.3, bos=None, eos=None)
    prefix = torch.tensor([[1, 5, 2, 7]])  # [1, 4]
    n, v = 40000, 12
    crit = stats.chi2.isf(ALPHA / 2, v - 1)
    assert stats.ncx2.sf(crit, v - 1, n * (2 * 0.03) ** 2) >= 0.99
    with torch.no_grad():
        p1 = model(prefix).logits[0, -1].double().softmax(-1)  # [V]
        both = torch.cat([prefix.repeat(v, 1), torch.arange(v)[:, None]], 1)  # [V, 5]
        p2 = model(both).logits[:, -1].double().softmax(-1)  # [V, V]
    law2 = (p1[:, None] * p2).sum(0).numpy()
    out = sample_continuations(model, prefix.repeat(n, 1), 2, 1.0,
                               torch.Generator().manual_seed(0))  # [n, 6]
    assert out.shape == (n, 6) and torch.equal(out[:, :4], prefix.repeat(n, 1))
    for col, law in ((4, p1.numpy()), (5, law2)):
        counts = np.bincount(out[:, col].numpy(), minlength=v)
        chi = float(((counts - n * law) ** 2 / (n * law)).sum())
        assert chi < crit, (col, chi, crit)


def test_sample_continuations_respects_width_and_seed():
    model = tiny(259, 16, 1, seed=2)
    prefix = torch.tensor([list(TEXT[:8])] * 16)  # [16, 8]
    a = sample_continuations(model, prefix, 10, 1.0, torch.Generator().manual_seed(5), width=40)
    b = sample_continuations(model, prefix, 10, 1.0, torch.Generator().manual_seed(5), width=40)
    assert torch.equal(a, b)
    assert int(a[:, 8:].max()) < 40


def test_sample_continuations_on_a_state_space_model():
    """Mamba returns and takes its cache as ``cache_params``, not ``past_key_values``: the cached
    sampler draws exactly what sampling from full forward passes with the same generator draws."""
    from families import family, tiny_model

    model = tiny_model(family("Mamba"))  # float64, prefix-sensitive
    prefix = torch.tensor([[1, 5, 2, 7], [3, 3, 9, 4]])  # [2, 4]
    got = sample_continuations(model, prefix, 6, 1.0, torch.Generator().manual_seed(4))
    g, ids = torch.Generator().manual_seed(4), prefix
    with torch.no_grad():
        for _ in range(6):
            p = model(input_ids=ids).logits[:, -1].float().softmax(-1)
            ids = torch.cat([ids, torch.multinomial(p, 1, generator=g)], 1)
    assert torch.equal(got, ids)


# ------------------------------------------------------------------ distillation


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_distill_raises_acceptance(divergence):
    """Deterministic (seeded) runs; before ~0.48, after ~0.60 for every divergence. The margin
    0.05 is far above float noise and far below the gain, and a no-op or a wrong-signed update
    fails it."""
    target, draft = pair()
    t_state = {k: v.clone() for k, v in target.state_dict().items()}
    res = distill(target, draft, [list(TEXT)], divergence=divergence, **SMALL)
    assert res.alpha_after >= res.alpha_before + 0.05, (res.alpha_before, res.alpha_after)
    assert res.steps == len(res.losses) == SMALL["steps"]
    assert res.divergence == divergence and res.eval_on == "target"
    assert res.history[0] == (0, res.alpha_before) and res.history[-1][1] == res.alpha_after
    assert all(math.isfinite(x) for x in res.losses)
    assert np.mean(res.losses[-10:]) < np.mean(res.losses[:10])
    # the target is untouched, the draft's mode restored
    assert all(torch.equal(t_state[k], v) for k, v in target.state_dict().items())
    assert not target.training and not draft.training


def test_distill_is_deterministic_and_measures_the_trained_draft():
    runs = []
    for _ in range(2):
        target, draft = pair()
        res = distill(target, draft, [list(TEXT)], **{**SMALL, "steps": 10}, eval_on="data",
                      on_policy=0.5)
        runs.append(res)
        ids = token_stream([list(TEXT)])
    assert runs[0].losses == runs[1].losses
    assert runs[0].alpha_after == runs[1].alpha_after
    assert runs[0].eval_on == "data"
    # alpha_after is the acceptance of the draft as it is now, on the evaluation states
    assert 0.0 < runs[0].alpha_after <= 1.0 and ids.numel() == len(TEXT)
    # rng= also takes a numpy Generator (SPEC 7): equal generators, equal runs
    again = [distill(*pair(), [list(TEXT)], **{**SMALL, "steps": 5, "rng": np.random.default_rng(5)})
             for _ in range(2)]
    assert again[0].losses == again[1].losses


def test_distill_strings_need_and_use_a_tokenizer():
    target, draft = pair()
    texts = [TEXT.decode("utf-8", errors="replace")]
    with pytest.raises(ValueError, match="tokenizer"):
        distill(target, draft, texts, **SMALL)
    res = distill(target, draft, texts, tokenizer=ByteTokenizer(), **{**SMALL, "steps": 20})
    assert res.alpha_after > res.alpha_before


def test_distill_padded_prefix_vocabulary():
    """Target with 264 logits (259 ids padded to a multiple of 8), draft with 259."""
    target, draft = pair(264, 259)
    tok = ByteTokenizer()
    res = distill(target, draft, [list(TEXT)], tokenizer=tok, draft_tokenizer=tok, **SMALL)
    assert res.alpha_after >= res.alpha_before + 0.05
    # and the other way round (draft padded beyond the target)
    target, draft = pair(259, 264)
    res = distill(target, draft, [list(TEXT)], tokenizer=tok, **SMALL)
    assert res.alpha_after >= res.alpha_before + 0.05


def test_distill_mixed_dtypes():
    target, draft = pair()
    target = target.double()
    res = distill(target, draft, [list(TEXT)], **{**SMALL, "steps": 20})
    assert res.alpha_after > res.alpha_before
    assert next(draft.parameters()).dtype == torch.float32


# ------------------------------------------------------------------ refusals


def _word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(words)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, words[0])))


def test_mismatched_vocabularies_are_refused():
    """The library's one rule (speculate.domains.text.check_vocabularies) plus distill's own requirement
    that the training ids exist in both models."""
    target = tiny(259, 16, 1)
    with pytest.raises(ValueError, match="differ by more than padding"):
        distill(target, tiny(600, 16, 1), [list(TEXT)], **SMALL)
    other = tiny(100, 16, 1, bos=None, eos=None)  # within padding range: sizes alone pass
    with pytest.raises(ValueError, match=r"token ids outside \[0, 100\)"):
        distill(target, other, [list(TEXT)], **SMALL)
    with pytest.raises(ValueError, match="tokenizer has 259 ids but the draft has only 100"):
        distill(target, other, [list(TEXT)], tokenizer=ByteTokenizer(), **SMALL)
    a = _word_tokenizer(["<unk>", "a", "b", "c"])
    b = _word_tokenizer(["<unk>", "a", "c", "b"])
    small_t, small_d = tiny(4, 16, 1, bos=None, eos=None), tiny(4, 16, 1, 1, bos=None, eos=None)
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_vocab(small_t, small_d, a, b)
    with pytest.raises(ValueError, match="tokenizers differ"):
        distill(small_t, small_d, [[1, 2, 3] * 20], tokenizer=a, draft_tokenizer=b, **SMALL)
    assert check_vocab(small_t, small_d, a, a) == 4
    with pytest.raises(ValueError, match="eos_token_id"):
        check_vocab(tiny(259, 16, 1), tiny(259, 16, 1, eos=2))


def test_bad_arguments_are_refused():
    target, draft = pair()
    data = [list(TEXT)]
    cases = [
        (dict(divergence="kl"), "divergence must be one of"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(on_policy=1.5), "on_policy"),
        (dict(batch_size=0), "batch_size"),
        (dict(prefix_len=0), "prefix_len"),
        (dict(lr=0.0), "lr must be"),
        (dict(eval_on="draft"), "eval_on"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(ValueError, match=msg):
            distill(target, draft, data, **{**SMALL, **kwargs})
    with pytest.raises(ValueError, match="fewer than one window"):
        distill(target, draft, [[1, 2, 3]], **SMALL)
    with pytest.raises(ValueError, match="outside"):
        distill(target, draft, [[300] * 64], **SMALL)
    with pytest.raises(TypeError, match="not one string"):
        distill(target, draft, "some text", tokenizer=ByteTokenizer(), **SMALL)
    with pytest.raises(ValueError, match="empty"):
        distill(target, draft, [], **SMALL)
    for p in draft.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        distill(target, draft, data, **SMALL)


def test_divergences_with_masked_logits_stay_finite():
    """A target that masks ids (-inf logits) has p = 0 there: 0 log 0 = 0, no NaN in value or
    gradient."""
    lt = torch.tensor([[0.0, -math.inf, 1.0, -math.inf]])
    for ld0, kinds in (([0.5, 0.2, -0.3, 0.1], ("tv", "fkl", "jsd")),  # target masks ids
                       ([0.5, -math.inf, -0.3, 0.1], ("tv", "fkl", "jsd")),  # both mask id 1
                       ([0.5, -math.inf, -0.3, -math.inf], DIVERGENCES)):  # same support
        ld = torch.tensor([ld0], requires_grad=True)
        for kind in kinds:
            loss = divergence_loss(lt, ld, kind).sum()
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(ld.grad).all(), (ld0, kind)
            ld.grad = None
