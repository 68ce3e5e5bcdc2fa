"""A byte-level tokenizer: ids 0..255 are the bytes themselves, then BOS, EOS and PAD.

``ByteTokenizer`` is a real Hugging Face fast tokenizer (a ``PreTrainedTokenizerFast`` built on a
``tokenizers`` byte-level BPE with no merges), so everything a transformers user expects works:
``tok(texts, padding=True)`` with left padding and attention masks, ``decode``, ``batch_decode``,
``save_pretrained``. A saved folder loads with plain ``AutoTokenizer.from_pretrained(path)``,
no remote code (it then comes back as a ``PreTrainedTokenizerFast`` with the same behaviour),
or with ``ByteTokenizer.from_pretrained(path)``.

Text is encoded as its UTF-8 bytes; special-token strings inside the text are NOT special
(``"<|eos|>"`` in a prompt is 7 bytes), so every string round-trips. ``encode_bytes`` and
``decode_bytes`` work on raw bytes (any of the 256 values, valid UTF-8 or not). ``ByteTokenizer()`` has
no chat template; ``from_pretrained`` takes a folder's (the embedded pair's is ChatML-style:
``<|im_start|>role\\ncontent<|im_end|>\\n``, plain bytes like all text).

>>> tok = ByteTokenizer()
>>> len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
(259, 256, 257, 258)
>>> tok("hé").input_ids                      # BOS, then the UTF-8 bytes
[256, 104, 195, 169]
>>> batch = tok(["a", "abc"], padding=True)  # left padding
>>> batch.input_ids, batch.attention_mask
([[258, 258, 256, 97], [256, 97, 98, 99]], [[0, 0, 1, 1], [1, 1, 1, 1]])
>>> tok.decode([256, 104, 195, 169], skip_special_tokens=True)
'hé'
>>> tok.decode_bytes(tok.encode_bytes(bytes(range(256)))) == bytes(range(256))
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

N_BYTES = 256
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 259
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def _byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable-character map used by ``tokenizers``' ByteLevel pre-tokenizer."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(N_BYTES):
        if b not in bs:
            bs.append(b)
            cs.append(N_BYTES + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def build_backend() -> Tokenizer:
    """The ``tokenizers`` object: byte b -> id b, specials 256..258, BOS prepended on encode."""
    b2u = _byte_to_unicode()
    vocab = {b2u[b]: b for b in range(N_BYTES)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in (BOS, EOS, PAD)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)])
    assert tok.get_vocab_size() == VOCAB_SIZE and tok.token_to_id(PAD) == PAD_ID
    return tok


class ByteTokenizer(PreTrainedTokenizerFast):
    """Byte-level tokenizer with BOS/EOS/PAD specials (vocabulary of 259), left padding."""

    # Ignore whatever a saved folder holds except the tokenizer.json we check (and a chat template,
    # read by from_pretrained): the tokenizer is fully determined by its definition.
    def __init__(self, **kwargs):
        for key in ("tokenizer_object", "tokenizer_file", "vocab", "merges", "post_processor",
                    "bos_token", "eos_token", "pad_token", "unk_token", "tokenizer_class",
                    "padding_side", "split_special_tokens"):
            kwargs.pop(key, None)
        kwargs.setdefault("model_max_length", 1 << 30)
        super().__init__(tokenizer_object=build_backend(), bos_token=BOS, eos_token=EOS,
                         pad_token=PAD, padding_side="left", split_special_tokens=True,
                         **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], *args, **kwargs) -> ByteTokenizer:
        """Load from a folder written by ``save_pretrained`` (checks it is a byte tokenizer).

        >>> import tempfile
        >>> d = tempfile.mkdtemp(); _ = ByteTokenizer().save_pretrained(d)
        >>> ByteTokenizer.from_pretrained(d)("x").input_ids
        [256, 120]
        """
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"{str(path)!r} has no tokenizer.json")
        saved = Tokenizer.from_file(file)
        if saved.get_vocab() != build_backend().get_vocab():
            raise ValueError(f"{file} is not a ByteTokenizer vocabulary "
                             f"({saved.get_vocab_size()} ids, expected {VOCAB_SIZE})")
        template = _saved_chat_template(path)  # the one setting a folder may add (the embedded pair's)
        if template is not None:
            kwargs.setdefault("chat_template", template)
        return cls(**kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike[str], *args, **kwargs):
        """Save ``tokenizer.json`` + ``tokenizer_config.json``, loadable by ``AutoTokenizer``."""
        files = super().save_pretrained(save_directory, *args, **kwargs)
        cfg_file = os.path.join(save_directory, "tokenizer_config.json")
        with open(cfg_file, encoding="utf-8") as f:
            cfg = json.load(f)
        # A class name AutoTokenizer resolves without remote code; same tokenizer.json.
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        with open(cfg_file, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")
        return files

    def encode_bytes(self, data: bytes | bytearray, add_bos: bool = False) -> list[int]:
        """Raw bytes -> ids (id == byte value), optionally with a leading BOS."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"encode_bytes takes bytes, got {type(data).__name__}")
        return ([BOS_ID] if add_bos else []) + list(data)

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = True) -> bytes:
        """Ids -> raw bytes. Specials are dropped (``skip_special_tokens``) or rejected."""
        out = bytearray()
        for i in _as_int_list(ids):
            if 0 <= i < N_BYTES:
                out.append(i)
            elif N_BYTES <= i < VOCAB_SIZE and skip_special_tokens:
                continue
            else:
                raise ValueError(f"id {i} is not a byte id (0..255)"
                                 + ("" if skip_special_tokens else " and specials are not skipped"))
        return bytes(out)


def _saved_chat_template(path: str | os.PathLike[str]) -> str | None:
    """The chat template saved in ``path`` (``chat_template.jinja`` or ``tokenizer_config.json``), if any."""
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    cfg = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def _as_int_list(ids: Iterable[int]) -> Sequence[int]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    out = list(ids)
    if any(isinstance(i, list) for i in out):
        raise ValueError("decode_bytes takes one sequence of ids, not a batch")
    return [int(i) for i in out]
