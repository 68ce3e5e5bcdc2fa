"""The serving engine (domains/text/serving/engine.py): continuous batching keeps every request's law
and seed, rows join and leave between rounds on every runtime, and faults stay with their request.

Calibration and power of the law test: one chi-square test over every (settings group, prompt,
continuation) cell, level ALPHA = 1e-6 (the suite's); its rows are sized by ``chi2_sample_size`` to
catch a joint deviation of total variation ``TV`` = 0.03 with probability 0.99 (the argument of
tests/text/test_text_exactness.py, the prompt-and-group pair uniform). Planted while writing it: the
penalties applied to the target but not the draft (p < 1e-300), a row's settings read from its
neighbour after a join (p < 1e-300).
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
import torch
from scipy import stats
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.request.processors import Transforms
from speculate.domains.text.request.sampling import SamplingConfig, probabilities
from speculate.domains.text.request.tokens import TokenBuffer
from speculate.domains.text.serving import Busy, Engine, Refused, Sampling
from speculate.domains.text.serving.rows import RowSettings, RowStreams
from transformers import LlamaForCausalLM

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import chi2_gof, chi2_sample_size

POWER, TV = 0.99, 0.03
PROMPTS = [[1, 5, 7], [3, 3, 9, 4]]


class Penalties:
    """OpenAI's presence and frequency penalties as a transformers-style processor: an oracle written
    apart from RowSettings (the counts are of the tokens after the prompt)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.L, self.p, self.f = prompt_len, presence, frequency

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for i in range(ids.shape[0]):
            c = torch.bincount(ids[i, self.L :], minlength=scores.shape[-1])[: scores.shape[-1]].to(scores.dtype)
            out[i] -= self.f * c + self.p * (c > 0).to(scores.dtype)
        return out


GROUPS = [  # (Sampling, the oracle's SamplingConfig, penalties (presence, frequency), stop ids)
    (dict(temperature=0.8, top_k=3, stop_token_ids=(0,)), SamplingConfig(0.8, top_k=3), None, [0]),
    (dict(temperature=1.2, top_k=4, top_p=0.9, presence_penalty=0.7, frequency_penalty=0.4),
     SamplingConfig(1.2, top_k=4, top_p=0.9), (0.7, 0.4), []),
]


def _law(target, prompt, cfg, pen, eos, n_new):
    tr = None if pen is None else Transforms(cfg, user=[Penalties(len(prompt), *pen)])
    return continuation_law(target, prompt, n_new, cfg, eos, transforms=tr)


def test_served_law_is_the_targets():
    """Sampled requests of two settings groups and two prompts, submitted together into one running
    batch (rows join as others finish, every few rounds): the first 3 tokens of each follow the
    target's exact law for its own settings."""
    torch.manual_seed(0)
    target = tiny_llama(eos=None)
    draft = tiny_llama(layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    n_new = 3
    laws = [_law(target, p, cfg, pen, eos, n_new) for _, cfg, pen, eos in GROUPS for p in PROMPTS]
    cells = sum(sum(1 for w in law.values() if w > 0) for law in laws)
    per = -(-chi2_sample_size(TV, cells, alpha=ALPHA, power=POWER) // len(laws))
    per = -(-per // 16) * 16
    eng = Engine(SpeculativeGenerator(target, draft, lookahead=2), max_batch=48, max_queue=100_000).start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        jobs = []
        for j in range(per // 16):
            for g, (kw, *_rest) in enumerate(GROUPS):
                for pi, p in enumerate(PROMPTS):
                    s = Sampling(max_tokens=n_new, seed=j * 7 + g * 2 + pi, **kw)
                    jobs.append((g * len(PROMPTS) + pi, eng.submit(p, s, n=16)))
        got: list[list[tuple[int, ...]]] = [[] for _ in laws]
        for cell, job in jobs:
            rows: dict[int, list[int]] = {}
            ends: dict[int, str] = {}
            for ev in job:
                rows.setdefault(ev.index, []).extend(ev.token_ids)
                if ev.finish_reason:
                    ends[ev.index] = ev.finish_reason
            for i in range(16):
                assert ends[i] in ("stop", "length"), ends[i]
                seq = rows.get(i, [])
                if ends[i] == "stop":  # a stop id ends the row; the law's sequences include it
                    seq = [*seq, 0]
                got[cell].append(tuple(seq))
    finally:
        torch.set_num_threads(threads)
        eng.shutdown()
    assert eng.stats.rounds > per * len(laws) / 48  # the batch ran full: rows joined between rounds
    stat, df = 0.0, 0
    for law, samples in zip(laws, got, strict=True):
        r = chi2_gof(samples, law)
        assert np.isfinite(r.statistic), r.detail
        stat, df = stat + r.statistic, df + r.df
    assert chi2_sample_size(TV, df + 1, alpha=ALPHA, power=POWER) <= per * len(laws)
    p = stats.chi2.sf(stat, df)
    assert p > ALPHA, f"chi2={stat:.1f} df={df} p={p:.2e}"


def _tokens(job) -> list[int]:
    return [t for ev in job for t in ev.token_ids]


def test_seed_gives_the_same_tokens_alone_or_beside_31_others():
    target = tiny_llama(vocab=32, eos=None)
    draft = tiny_llama(vocab=32, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    eng = Engine(SpeculativeGenerator(target, draft, lookahead=3), max_batch=32).start()
    try:
        s = Sampling(max_tokens=20, temperature=1.0, top_p=0.95, seed=1234)
        alone = _tokens(eng.submit(PROMPTS[0], s))
        others = [eng.submit(PROMPTS[i % 2], Sampling(max_tokens=5 + i, temperature=0.9, seed=i)) for i in range(31)]
        time.sleep(0.01)
        beside = _tokens(eng.submit(PROMPTS[0], s))
        for o in others:
            _tokens(o)
        assert beside == alone and len(alone) == 20
        other_seed = _tokens(eng.submit(PROMPTS[0], Sampling(max_tokens=20, temperature=1.0, top_p=0.95, seed=99)))
        assert other_seed != alone
    finally:
        eng.shutdown()


class _GPT2Lm:
    """A non-Llama family (the general position-indexed cache, CachedModel.absorb)."""

    @staticmethod
    def make():
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(3)
        return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                          bos_token_id=1, eos_token_id=39)).eval()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_rows_joining_between_rounds_decode_as_alone(family, draft):
    """Greedy requests arriving while others run (each joins the running caches) give exactly what
    the generator gives each alone: the joined caches hold every row's own prefix."""
    if family == "llama":
        target = tiny_llama(vocab=40, eos=None)
        d = tiny_llama(vocab=40, layers=1, hidden=16, heads=2, kv_heads=1, rng=1) if draft == "model" else "ngram"
    else:
        target = _GPT2Lm.make()
        d = "early-exit:1" if draft == "model" else "ngram"
    gen = SpeculativeGenerator(target, d, lookahead=3)
    eng = Engine(gen, max_batch=8).start()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 40, int(rng.integers(2, 9))).tolist() for _ in range(12)]
    try:
        jobs = []
        for i, p in enumerate(prompts):
            jobs.append(eng.submit(p, Sampling(max_tokens=6 + 3 * i, temperature=0, ignore_eos=True)))
            time.sleep(0.003)
        outs = [_tokens(j) for j in jobs]
        assert eng.metrics()["joins"]
    finally:
        eng.shutdown()
    for p, out, i in zip(prompts, outs, range(12), strict=True):
        ref = gen.generate([p], max_new_tokens=6 + 3 * i, temperature=0, eos_token_id=[]).new_tokens[0]
        assert out == ref, (family, draft, i)


class Poisoned(LlamaForCausalLM):
    """A target that raises when it is fed token POISON (a model bug triggered by one request). It
    never emits POISON itself (its logit is -1e4), so no other row is ever fed it, not even as a draft."""

    POISON = 20
    armed = False  # off while the runtime's probe feeds random tokens

    @functools.wraps(LlamaForCausalLM.forward)
    def forward(self, input_ids=None, *args, **kw):
        if self.armed and input_ids is not None and bool((input_ids == self.POISON).any()):
            raise RuntimeError("poisoned token")
        out = super().forward(input_ids, *args, **kw)
        out.logits[..., self.POISON] = -1e4  # never the argmax, never drafted
        return out


def _poisoned():
    base = tiny_llama(vocab=21, eos=None)
    m = Poisoned(base.config).eval()
    m.load_state_dict(base.state_dict())
    return m


@pytest.mark.parametrize("bad_prompt", [[1, Poisoned.POISON, 2], [1, 2, 3, 4, 5, Poisoned.POISON]],
                         ids=["in-prefill", "in-round"])
def test_a_request_that_raises_inside_the_model_ends_alone(bad_prompt):
    """A poisoned token in a prompt makes the model raise: in the prefill of the requests admitted
    with it, or (the longest prompt's last token, which the prefill skips) in the first round of the
    batch they join. The engine reruns each request (each row of the round) alone: the poisoned
    request ends with an error, the others finish with exactly their tokens alone."""
    target = _poisoned()
    gen = SpeculativeGenerator(target, "ngram", lookahead=2)
    target.armed = True
    eng = Engine(gen, max_batch=8).start()
    good = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    try:
        # running when the others come
        first = eng.submit([2, 3], Sampling(max_tokens=40, temperature=0, ignore_eos=True))
        time.sleep(0.01)
        jobs = [eng.submit(p, Sampling(max_tokens=8, temperature=0, ignore_eos=True)) for p in good[:2]]
        bad = eng.submit(bad_prompt, Sampling(max_tokens=8, temperature=0))
        jobs.append(eng.submit(good[2], Sampling(max_tokens=8, temperature=0, ignore_eos=True)))
        bad_events = list(bad)
        assert bad_events[-1].finish_reason == "error" and "poisoned" in bad_events[-1].error
        outs = [_tokens(j) for j in [first, *jobs]]
        assert eng.metrics()["errors_total"] >= 1
    finally:
        eng.shutdown()
    target.armed = False
    for p, out, n in zip([[2, 3], *good], outs, [40, 8, 8, 8], strict=True):
        ref = gen.generate([p], max_new_tokens=n, temperature=0, eos_token_id=[]).new_tokens[0]
        assert out == ref


def test_a_burst_of_200_against_a_queue_of_16_is_answered_or_refused():
    eng = Engine(SpeculativeGenerator(tiny_llama(vocab=16, eos=None), "ngram", lookahead=2), max_batch=4,
                 max_queue=16).start()
    jobs, refused = [], 0
    try:
        for i in range(200):
            try:
                jobs.append(eng.submit([1 + i % 7, 2], Sampling(max_tokens=30, temperature=1.0, seed=i)))
            except Busy as err:
                assert "queue is full" in str(err)
                refused += 1
        ends = [[ev.finish_reason for ev in j if ev.finish_reason] for j in jobs]
    finally:
        eng.shutdown()
    assert refused > 0 and len(jobs) + refused == 200
    assert all(e == ["length"] for e in ends)
    m = eng.metrics()
    assert m["requests_finished"] == len(jobs) and m["requests_refused"] == refused


def test_shutdown_with_requests_in_flight_answers_every_one():
    eng = Engine(SpeculativeGenerator(tiny_llama(vocab=16, eos=None), "ngram", lookahead=2), max_batch=2).start()
    jobs = [eng.submit([1, 2], Sampling(max_tokens=5000, temperature=1.0, seed=i)) for i in range(6)]
    time.sleep(0.05)
    ends: list[str | None] = []
    t = threading.Thread(target=lambda: ends.extend(ev.finish_reason for j in jobs for ev in j if ev.finish_reason))
    t.start()
    eng.shutdown(timeout=0.2)
    t.join(60)
    assert len(ends) == 6 and set(ends) <= {"length", "error"} and "error" in ends
    with pytest.raises(Busy, match="shutting down"):
        eng.submit([1], Sampling())


def test_cancel_frees_the_row_at_once():
    eng = Engine(SpeculativeGenerator(tiny_llama(vocab=16, eos=None), "ngram", lookahead=2), max_batch=4).start()
    try:
        job = eng.submit([1, 2], Sampling(max_tokens=100_000, temperature=1.0, seed=0))
        for ev in job:
            if ev.token_ids:
                break
        job.cancel()
        rest = list(job)
        assert rest[-1].finish_reason == "cancelled"
        deadline = time.time() + 10
        while eng.metrics()["batch_size"] and time.time() < deadline:
            time.sleep(0.01)
        assert eng.metrics()["batch_size"] == 0 and job.completion_tokens < 100_000
    finally:
        eng.shutdown()


@pytest.mark.parametrize(("field", "kw"), [
    ("temperature", dict(temperature=-1)), ("temperature", dict(temperature=float("nan"))),
    ("top_p", dict(top_p=0.0)), ("top_p", dict(top_p=1.5)), ("top_k", dict(top_k=0)), ("min_p", dict(min_p=2)),
    ("presence_penalty", dict(presence_penalty=3)), ("frequency_penalty", dict(frequency_penalty=-2.5)),
    ("max_tokens", dict(max_tokens=0)), ("seed", dict(seed=-1)), ("stop", dict(stop=("x",))),
    ("max_tokens", dict(max_tokens=10_000)),
])
def test_bad_settings_are_refused_before_any_work(field, kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    target = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                        bos_token_id=1, eos_token_id=39)).eval()
    eng = Engine(SpeculativeGenerator(target, "ngram", lookahead=2))  # no tokenizer: stop strings refused
    with pytest.raises(Refused) as err:
        eng.submit([1, 2], Sampling(**kw))
    assert err.value.param == field
    assert eng._thread is None  # nothing started


@pytest.mark.parametrize(("prompt", "what"), [([], "empty"), ([1, 99], "outside the vocabulary"),
                                             ("abc", "list of token ids")])
def test_bad_prompts_are_refused(prompt, what):
    eng = Engine(SpeculativeGenerator(tiny_llama(vocab=16), "ngram"))
    with pytest.raises(Refused, match=what):
        eng.submit(prompt, Sampling())


def test_row_settings_equal_the_warpers_row_by_row():
    """Each row's law under RowSettings is SamplingConfig's (temperature, top-k, top-p, min-p) on its own,
    and the penalties are OpenAI's formula over the generated tokens and the drafts before the position."""
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 12) * 3  # [R, J, V]
    cfgs = [SamplingConfig(0.7, top_k=5), SamplingConfig(1.3, top_p=0.8), SamplingConfig(1.0, min_p=0.1),
            SamplingConfig(0.0)]
    rs = RowSettings()
    rs.add(np.arange(4), temperature=[c.temperature for c in cfgs], top_k=[c.top_k for c in cfgs],
           top_p=[c.top_p for c in cfgs], min_p=[c.min_p for c in cfgs], presence=[0.0] * 4, frequency=[0.0] * 4)
    buf = TokenBuffer.from_prompts([[1]] * 4, extra=4)
    got = rs.probs(logits, buf, np.arange(4), np.zeros((4, 2), np.int64))
    for i, c in enumerate(cfgs):
        torch.testing.assert_close(got[i], probabilities(logits[i], c), rtol=1e-5, atol=1e-6)
    # penalties: row 0 generated [2, 2, 5]; drafts [5, 7] before positions 1 and 2
    rs = RowSettings()
    rs.add(np.array([0]), temperature=[1.0], top_k=[None], top_p=[None], min_p=[None], presence=[0.5],
           frequency=[0.25])
    buf = TokenBuffer.from_prompts([[9, 2, 2, 5]], extra=4)
    buf.prompt_len[:] = 1
    x = rs.scores(logits[:1], buf, np.array([0]), np.array([[5, 7]]))
    counts = [np.bincount(c, minlength=12) for c in ([2, 2, 5], [2, 2, 5, 5], [2, 2, 5, 5, 7])]
    for j, c in enumerate(counts):
        want = logits[0, j] - 0.25 * torch.tensor(c, dtype=torch.float32) - 0.5 * torch.tensor(c > 0).float()
        torch.testing.assert_close(x[0, j], want)


def test_row_streams_give_each_row_its_own_draws_and_refuse_other_shapes():
    rs = RowStreams()
    rs.streams = {3: np.random.default_rng(1), 8: np.random.default_rng(2)}
    rs.rows = [3, 8]
    u = rs.random((2, 4))
    assert np.array_equal(u[0], np.random.default_rng(1).random(4))
    assert np.array_equal(u[1], np.random.default_rng(2).random(4))
    flat = rs.random(4)  # [R * m], row-major: row 3's next 2 draws, then row 8's
    assert np.array_equal(flat[:2], np.random.default_rng(1).random(6)[4:])
    with pytest.raises(ValueError, match="row-major"):
        rs.random(3)
    with pytest.raises(AttributeError, match="uniforms only"):
        rs.standard_normal(2)
