"""The byte tokenizer: exact round trips, specials, left padding, save/load via AutoTokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def tok() -> ByteTokenizer:
    return ByteTokenizer()


def test_vocabulary_and_special_ids(tok):
    assert len(tok) == VOCAB_SIZE == 259
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert (BOS_ID, EOS_ID, PAD_ID) == (256, 257, 258)
    assert tok.padding_side == "left"
    assert tok.convert_ids_to_tokens([BOS_ID, EOS_ID, PAD_ID]) == ["<|bos|>", "<|eos|>",
                                                                    "<|pad|>"]


def test_all_256_bytes_round_trip(tok):
    data = bytes(range(256))
    ids = tok.encode_bytes(data)
    assert ids == list(range(256))
    assert tok.decode_bytes(ids) == data
    assert tok.encode_bytes(data, add_bos=True) == [BOS_ID, *range(256)]
    assert tok.decode_bytes([BOS_ID, *ids, EOS_ID, PAD_ID]) == data
    # every code point U+0000..U+00FF through the text interface (UTF-8 underneath)
    text = "".join(chr(i) for i in range(256))
    ids = tok(text).input_ids
    assert ids == [BOS_ID, *text.encode("utf-8")]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert bytes(tok(text, return_tensors="pt").input_ids[0, 1:].tolist()) == text.encode()


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.text(max_size=64))
def test_any_text_round_trips(text):
    tok = _shared()
    ids = tok(text).input_ids
    assert ids == [BOS_ID, *text.encode("utf-8")]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok(text, add_special_tokens=False).input_ids == list(text.encode("utf-8"))


_TOK: list[ByteTokenizer] = []


def _shared() -> ByteTokenizer:
    if not _TOK:
        _TOK.append(ByteTokenizer())
    return _TOK[0]


def test_empty_string(tok):
    assert tok("").input_ids == [BOS_ID]
    assert tok("", add_special_tokens=False).input_ids == []
    assert tok.decode([]) == ""
    assert tok.decode_bytes([]) == b""
    assert tok.encode_bytes(b"") == []


def test_special_strings_inside_text_are_plain_bytes(tok):
    for s in ("<|eos|>", "<|bos|><|pad|>", "x<|eos|>y"):
        assert tok(s).input_ids == [BOS_ID, *s.encode()]
    assert tok.decode([BOS_ID, 104, EOS_ID], skip_special_tokens=False) == "<|bos|>h<|eos|>"


def test_invalid_utf8_decodes_with_replacement(tok):
    assert tok.decode([0xFF, 104]) == "\ufffdh"
    assert tok.decode_bytes([0xFF, 104]) == b"\xffh"


def test_batch_left_padding_and_mask(tok):
    texts = ["a", "abcd", "", "日本"]
    batch = tok(texts, padding=True, return_tensors="pt")
    ids, mask = batch.input_ids, batch.attention_mask
    lengths = [1 + len(t.encode()) for t in texts]
    assert ids.shape == (4, max(lengths)) and ids.dtype == torch.int64
    for row, (t, n) in enumerate(zip(texts, lengths, strict=True)):
        pad = ids.shape[1] - n
        assert ids[row, :pad].tolist() == [PAD_ID] * pad
        assert ids[row, pad:].tolist() == [BOS_ID, *t.encode()]
        assert mask[row].tolist() == [0] * pad + [1] * n
    assert tok.batch_decode(ids, skip_special_tokens=True) == texts


def test_save_load_auto_tokenizer(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    auto = AutoTokenizer.from_pretrained(tmp_path)  # no remote code involved
    mine = ByteTokenizer.from_pretrained(tmp_path)
    assert isinstance(mine, ByteTokenizer)
    texts = ["def f(x):\n    return x", "<|eos|>", "é", ""]
    ref = tok(texts, padding=True)
    for other in (auto, mine):
        assert len(other) == VOCAB_SIZE
        assert other.padding_side == "left"
        got = other(texts, padding=True)
        assert got.input_ids == ref.input_ids
        assert got.attention_mask == ref.attention_mask
        assert other.decode(ref.input_ids[0], skip_special_tokens=True) == texts[0]


def test_from_pretrained_rejects_other_tokenizers(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        ByteTokenizer.from_pretrained(tmp_path)
    other = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, "[UNK]")))
    other.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a ByteTokenizer vocabulary"):
        ByteTokenizer.from_pretrained(tmp_path)


def test_bad_input_is_rejected(tok):
    with pytest.raises(TypeError, match="bytes"):
        tok.encode_bytes("text")
    with pytest.raises(ValueError, match="id 300"):
        tok.decode_bytes([1, 300])
    with pytest.raises(ValueError, match="id -1"):
        tok.decode_bytes([-1])
    with pytest.raises(ValueError, match="specials are not skipped"):
        tok.decode_bytes([BOS_ID, 65], skip_special_tokens=False)
    with pytest.raises(ValueError, match="batch"):
        tok.decode_bytes([[1, 2]])
    assert tok.decode_bytes(torch.tensor([65, EOS_ID])) == b"A"
