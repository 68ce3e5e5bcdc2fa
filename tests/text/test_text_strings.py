"""Strings in, strings out: text, lists of text and chat messages through the tokenizer; out.texts."""

from __future__ import annotations

import pytest
from speculate.domains.text import ByteTokenizer, SpeculativeGenerator

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture
def gen(make_llama):
    tok = ByteTokenizer()
    return SpeculativeGenerator(make_llama(vocab=len(tok)), "ngram", tokenizer=tok)


def test_text_and_ids_agree(gen):
    tok = gen.tokenizer
    kw = dict(max_new_tokens=6, temperature=0, eos_token_id=[])
    by_text = gen.generate(["hello", "a longer prompt"], **kw)
    by_ids = gen.generate([tok("hello").input_ids, tok("a longer prompt").input_ids], **kw)
    assert by_text.sequences == by_ids.sequences
    assert by_text.texts == [tok.decode(t, skip_special_tokens=True) for t in by_ids.new_tokens]
    one = gen.generate("hello", **kw)
    assert one.texts == by_text.texts[:1]


def test_chat_messages(gen):
    tok = gen.tokenizer
    conv = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="no chat template"):
        gen.generate(conv, max_new_tokens=2)
    tok.chat_template = TEMPLATE
    kw = dict(max_new_tokens=5, temperature=0, eos_token_id=[])
    out = gen.generate(conv, **kw)
    ids = tok("user: hi\nassistant:", add_special_tokens=False).input_ids
    assert out.sequences[0][: out.prompt_lengths[0]] == ids
    two = gen.generate([conv, [{"role": "user", "content": "yo"}]], **kw)
    assert two.sequences[0] == out.sequences[0] and len(two.texts) == 2


def test_texts_need_a_tokenizer(make_llama):
    out = SpeculativeGenerator(make_llama(vocab=12), "ngram").generate([[1, 2]], max_new_tokens=2)
    with pytest.raises(ValueError, match="tokenizer"):
        _ = out.texts


def test_stop_strings(gen):
    stops = [*"abcdefghijklmnopqrstuvwxyz0123456789", "€"]  # frequent enough to stop every row
    out = gen.generate(["x = 1\n", "def f():\n", "z"], max_new_tokens=60, stop_strings=stops, rng=0,
                       eos_token_id=[])
    for text, toks in zip(out.texts, out.new_tokens, strict=True):
        assert len(toks) < 60
        assert text[-1] in stops and not any(s in text[:-1] for s in stops)  # ends at its first stop
