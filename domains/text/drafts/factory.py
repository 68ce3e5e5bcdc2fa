"""One factory for every kind of text draft: :func:`make_draft` asks each kind of :data:`KINDS`, in
order, whether ``draft=`` is one of its own (``Draft.from_spec``); the first that says yes builds
it. The generator never names a draft class. A new kind is a new file in ``drafts/`` plus one line
in :data:`KINDS` (or :func:`register_draft` from outside the package).

>>> from speculate.domains.text.conformance import tiny_llama
>>> target = tiny_llama(vocab=12)
>>> [type(make_draft(d, target)).__name__ for d in ("ngram:2", "early-exit:1", tiny_llama(vocab=12, layers=1))]
['NgramDraft', 'EarlyExitDraft', 'ModelDraft']
"""

from __future__ import annotations

from typing import Any

from .base import Draft, DraftOptions
from .eagle import EagleDraft
from .medusa import MedusaDraft
from .model import EarlyExitDraft, ModelDraft
from .ngram import NgramDraft
from .per_row import PerRowDraft
from .seq2seq import Seq2SeqDraft
from .suffix import SuffixDraft

__all__ = ["KINDS", "make_draft", "register_draft"]

#: every kind of draft, asked in this order: drafts on the target (trained heads), an encoder-decoder
#: target's drafts (they take the same strings as the decoder-only ones), then the decoder-only kinds
KINDS: list[type[Draft]] = [MedusaDraft, EagleDraft, Seq2SeqDraft, SuffixDraft, NgramDraft, EarlyExitDraft, ModelDraft]


def register_draft(kind: type[Draft]) -> type[Draft]:
    """Add a kind of draft (a :class:`~speculate.domains.text.drafts.base.Draft` subclass with a
    ``from_spec``), asked before the built-in kinds; returns it (usable as a class decorator)."""
    if not (isinstance(kind, type) and issubclass(kind, Draft)):
        raise TypeError(f"register_draft takes a subclass of speculate.domains.text.drafts.base.Draft, got {kind!r}")
    if kind not in KINDS:
        KINDS.insert(0, kind)
    return kind


def make_draft(draft: Any, target: Any, *, tree: Any = None, tokenizer: Any = None,
               draft_tokenizer: Any = None) -> Draft:
    """The draft for ``draft=`` (a causal LM, ``"ngram"``, ``"ngram:N"``, ``"suffix"``, ``"suffix:N"``,
    ``"early-exit:N"``, ``MedusaHeads``, a ``FeatureDraft``, a kind registered with :func:`register_draft`, or a
    list of chain drafts: :class:`~speculate.domains.text.drafts.per_row.PerRowDraft`, one chosen per row) and
    ``target``; for an encoder-decoder ``target``, their encoder-decoder counterparts."""
    if isinstance(draft, Draft):  # a draft object built by the caller
        return draft
    if isinstance(draft, (list, tuple)):  # several kinds, one chosen per row and round
        if tree is not None:
            raise ValueError(f"tree= cannot be combined with a list of drafts (a per-row choice drafts chains), "
                             f"got tree={tree!r}")
        kinds = [make_draft(d, target, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer) for d in draft]
        return PerRowDraft([d.as_chain() if isinstance(d, SuffixDraft) and d.spec is not None else d
                            for d in kinds])
    options = DraftOptions(tree, tokenizer, draft_tokenizer)
    for kind in KINDS:
        made = kind.from_spec(draft, target, options)
        if made is not None:
            return made
    if isinstance(draft, str):
        raise ValueError(
            f"unknown draft {draft!r}: pass a causal LM, 'ngram', 'ngram:N', 'suffix', 'suffix:N' or 'early-exit:N'")
    raise TypeError(f"draft must be a transformers causal LM or a string, got {type(draft).__name__}")
