"""Every kind of draft of the text domain, one file each, behind one base class and one factory.

``base.py``: :class:`Draft` (the hooks, with their defaults), :class:`Drafted` / :class:`DraftedTree`
(what a round proposes). ``factory.py``: :func:`make_draft` and :func:`register_draft` (the kinds, in
the order they are asked). The kinds: ``model.py`` (a draft LM; early exit), ``ngram.py`` (prompt
lookup; over the source too for encoder-decoders), ``suffix.py`` (token trees from the continuations
of the longest earlier match, in the row and in a shared store of earlier outputs), ``seq2seq.py``
(an encoder-decoder target's draft models), ``medusa.py`` and ``eagle.py`` (drafts on the target:
Medusa heads, the EAGLE-style feature draft; what they share in ``on_target.py``) and ``trees.py``
(token-tree shapes, grown level by level); ``per_row.py`` (a list of chain drafts, one chosen per row
and round from its past: :class:`PerRowDraft`).

>>> from speculate.domains.text.conformance import tiny_llama
>>> draft = make_draft("ngram:2", tiny_llama(vocab=12))
>>> type(draft).__name__, isinstance(draft, Draft), draft.default_lookahead()
('NgramDraft', True, 4)
"""

from .base import Draft, Drafted, DraftedTree, DraftOptions
from .factory import KINDS, make_draft, register_draft
from .per_row import PerRowDraft

__all__ = ["KINDS", "Draft", "DraftOptions", "Drafted", "DraftedTree", "PerRowDraft", "make_draft", "register_draft"]
