"""Streaming: gen.stream() yields each round's committed tokens; its text pieces add up to
out.texts; stopping early releases the caches; transformers streamers get the same tokens."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator, StreamEvent, load_pair


@pytest.fixture(scope="module")
def pair():
    return load_pair()


def _no_cache(gen: SpeculativeGenerator) -> bool:
    lm = gen.draft.lm if hasattr(gen.draft, "lm") else None
    draft_free = lm is None or (getattr(lm, "cache", None) is None and not getattr(lm, "k", []))
    return gen._target_lm.cache is None and draft_free


def test_stream_pieces_add_up_to_texts(pair):
    target, draft, tok = pair
    gen = SpeculativeGenerator(target, draft, tokenizer=tok, lookahead=4)
    prompts = ["def fib(n):", "# é – ü\nimport"]  # multi-byte characters: split across byte tokens
    kw = dict(max_new_tokens=24, temperature=1.0, rng=3, eos_token_id=[])
    out = gen.generate(prompts, **kw)
    texts, tokens = ["", ""], [[], []]
    for ev in gen.stream(prompts, **kw):
        assert isinstance(ev, StreamEvent)
        for r in range(2):
            texts[r] += ev.texts[r]
            tokens[r] += ev.tokens[r]
            assert "\ufffd" not in ev.texts[r] or "\ufffd" in out.texts[r]
    assert tokens == out.new_tokens
    assert texts == out.texts
    assert _no_cache(gen)


def test_stream_without_tokenizer_and_early_stop(make_llama):
    gen = SpeculativeGenerator(make_llama(vocab=16), make_llama(vocab=16, layers=1, rng=1), lookahead=3)
    prompts = [[1, 2, 3], [4, 5]]
    out = gen.generate(prompts, max_new_tokens=12, rng=0, eos_token_id=[])
    got = [[], []]
    for ev in gen.stream(prompts, max_new_tokens=12, rng=0, eos_token_id=[]):
        assert ev.texts is None
        for r in range(2):
            got[r] += ev.tokens[r]
    assert got == out.new_tokens
    stream = gen.stream(prompts, max_new_tokens=12, rng=0)
    for _ in stream:
        assert not _no_cache(gen)  # the caches are live during the stream
        break
    del stream
    gc.collect()
    assert _no_cache(gen)  # a consumer that stopped early left nothing behind
    stream = gen.stream(prompts, max_new_tokens=12, rng=0)
    next(stream)
    stream.close()
    assert _no_cache(gen)
    assert gen.generate(prompts, max_new_tokens=12, rng=0, eos_token_id=[]).new_tokens == out.new_tokens


def test_stream_checks_arguments_at_call(make_llama):
    gen = SpeculativeGenerator(make_llama(vocab=16), "ngram")
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.stream([[1, 2]], max_new_tokens=-1)


def test_transformers_streamers(pair):
    from transformers import TextIteratorStreamer

    target, draft, tok = pair
    gen = SpeculativeGenerator(target, draft, tokenizer=tok)
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    out = gen.generate("def add(a, b):", max_new_tokens=16, rng=1, streamer=streamer)
    assert "".join(streamer) == out.texts[0]

    class Recorder:
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(torch.as_tensor(value).reshape(-1).tolist())

        def end(self):
            self.ended = True

    rec = Recorder()
    out = gen.generate("import re", max_new_tokens=16, rng=2, streamer=rec)
    assert rec.ended and rec.puts[0] == out.sequences[0][: out.prompt_lengths[0]]
    assert [t for p in rec.puts[1:] for t in p] == out.new_tokens[0]
    with pytest.raises(ValueError, match="batch size 1"):
        gen.generate(["a", "b"], max_new_tokens=4, streamer=Recorder())
    with pytest.raises(ValueError, match="batch size 1"):
        gen.generate("a", max_new_tokens=4, num_return_sequences=2, streamer=Recorder())


def test_batch_size_chunks(make_llama):
    gen = SpeculativeGenerator(make_llama(vocab=16), "ngram")
    prompts = [[1 + i % 7, 2, 3] for i in range(7)]
    out = gen.generate(prompts, max_new_tokens=5, rng=np.random.default_rng(0), batch_size=3, progress=False)
    assert len(out.sequences) == 7 and all(len(t) == 5 for t in out.new_tokens)
    greedy = gen.generate(prompts, max_new_tokens=5, temperature=0, batch_size=2, progress=False)
    assert greedy.new_tokens == gen.generate(prompts, max_new_tokens=5, temperature=0).new_tokens
