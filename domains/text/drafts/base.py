"""What every text draft is: the :class:`Draft` base class (two methods to write, every other hook
declared here with its default), what a draft proposes (:class:`Drafted`, a chain;
:class:`DraftedTree`, a token tree) and the options the factory hands a kind.

A round: :class:`~speculate.domains.text.process.TextProcess` calls ``propose`` for the active
rows, the round loop verifies (never the draft), and the process calls ``advance`` with how many of
the row's tokens were used and accepted. A draft keeps its own long-lived state (a cache, features)
and hands each round's own state through ``Drafted.state``, which comes back to ``advance``.

A new kind of draft is one file in ``drafts/`` with a subclass of :class:`Draft` whose
``from_spec`` recognises what users pass as ``draft=``, plus one line in ``factory.KINDS`` (or,
from outside the package, :func:`~speculate.domains.text.drafts.factory.register_draft`):

>>> import numpy as np
>>> from speculate.domains.text.request.tokens import TokenBuffer
>>> class RepeatLast(Draft):
...     '''Propose the row's last token again, as a point mass.'''
...     @classmethod
...     def from_spec(cls, draft, target, options):
...         return cls() if draft == "repeat" else None
...     def propose(self, rows, tokens, k, need, cfg, rng, vocab):
...         last = tokens.ids[rows, tokens.n[rows] - 1]                      # [R]
...         lengths = np.minimum(need - 1, k)                                  # [R]
...         return Drafted(np.repeat(last[:, None], k, axis=1), None, lengths)
>>> buf = TokenBuffer.from_prompts([[4, 5, 6]], extra=3)
>>> RepeatLast().propose(np.array([0]), buf, 2, np.array([3]), None, None, 8).outcomes.tolist()
[[6, 6]]
"""

from __future__ import annotations

import copy
import re
from typing import Any, NamedTuple

import numpy as np

from speculate.verify import Tree

__all__ = ["Draft", "DraftOptions", "Drafted", "DraftedTree", "named_draft", "named_kind", "refuse_tree"]


class Drafted(NamedTuple):
    """What a draft proposes for the active rows (see ``speculate.domains.text.drafts``)."""

    outcomes: np.ndarray  #: int64 [R, k]: the drafted tokens (row r's first lengths[r] are valid)
    q: Any  #: float32 [R, k, V] (a DeviceCategorical on the device): the law each was drawn from; None: point masses
    lengths: np.ndarray  #: int64 [R]: valid drafts per row, <= min(k, need - 1)
    state: Any = None  #: the draft's own state for this round, handed back to ``Draft.advance``


class DraftedTree(NamedTuple):
    """A token tree a draft proposes for the active rows (``speculate.verify.tree`` layout): node 0
    is the root (the row's committed tokens), node ``i >= 1`` extends its parent by ``tokens[r, i]``."""

    tokens: np.ndarray  #: int64 [R, N+1]: the token drafted at each node (column 0 unused)
    q: np.ndarray | None  #: float32 [R, N+1, V]: the law each node's children were sampled from; None: greedy
    valid: np.ndarray  #: bool [R, N+1]: the nodes of each row's tree (the root always)
    tree: Tree  #: the shape: parent [N+1] or [R, N+1], children drafted with or without replacement
    state: Any = None  #: the draft's own state for this round, handed back to ``Draft.advance``

class DraftOptions(NamedTuple):
    """What :func:`~speculate.domains.text.drafts.factory.make_draft` hands each kind's ``from_spec``
    beside ``draft`` and ``target``."""

    tree: Any = None  #: ``tree=`` of the generator: a token-tree shape, "dynamic", or None (chains)
    tokenizer: Any = None  #: the target's tokenizer (a draft model's vocabulary is checked against it)
    draft_tokenizer: Any = None  #: the draft model's tokenizer


class Draft:
    """The base class of every text draft: write :meth:`propose` and, for a draft with a cache,
    :meth:`reset`, :meth:`select`, :meth:`release` and :meth:`advance`; every other hook has its
    default here (the process and the generator call them all, on every draft)."""

    #: set by the process: draft where the target's logits are (verification on the device)
    on_device: bool = False
    #: True: :meth:`observe` receives the target's features of the positions each round commits
    reads_features: bool = False
    #: a token-tree shape (``drafts.trees``): the draft proposes :class:`DraftedTree`; None: chains
    spec: Any = None
    #: the draft's own model runtime (``models/``), if it runs a model
    lm: Any = None
    #: whether the target may run static steps (``cuda_graphs=True``) beside this draft
    static_target: bool = False

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> Draft | None:
        """This kind's draft for what the user passed as ``draft=`` (a model, a string, trained heads),
        None when ``draft`` is not of this kind; ``ValueError`` / ``TypeError`` when it is but cannot
        serve ``target``."""
        return None

    # the round
    def propose(self, rows: np.ndarray, tokens: Any, k: int, need: np.ndarray, cfg: Any,
                rng: np.random.Generator, vocab: int) -> Drafted | DraftedTree:
        """Draft for the active ``rows`` (buffer indices, increasing): at most ``min(k, need[r] - 1)``
        tokens of row r, sampled with ``rng`` from laws after every setting of ``cfg`` (a
        ``SamplingConfig`` or ``Transforms``), over the target's ``vocab`` ids."""
        raise NotImplementedError

    def advance(self, state: Any, n_used: np.ndarray, n_accepted: np.ndarray, path: Any = None) -> None:
        """After verification: row r used ``n_used[r]`` tokens, of which ``n_accepted[r]`` were drafts;
        ``state`` is ``Drafted.state`` of this round; ``path`` the accepted nodes of a tree."""

    # the request
    def reset(self, tokens: Any, capacity: int, spare: int = 0) -> None:
        """A new request: ``tokens`` holds the prompts; caches for ``capacity`` (+ ``spare``) slots."""

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (indices into the current rows, increasing): others finished."""

    def release(self) -> None:
        """The request is over: free what :meth:`reset` allocated."""

    # continuous batching (domains/text/serving)
    def join_refusal(self) -> str | None:
        """Why rows of another request cannot join this draft's running batch (:meth:`absorb`); None
        when they can. A draft with state of its own overrides both."""
        return f"the {type(self).__name__} draft cannot take rows of another request into a running batch"

    def fresh(self) -> Draft:
        """A draft of the same kind and models with no request state of its own (its own caches once
        :meth:`reset`): continuous batching prefills each new request's rows on one, then
        :meth:`absorb` s them."""
        return copy.copy(self)

    def absorb(self, other: Draft) -> None:
        """Append the rows of ``other`` (the same kind of draft, reset on another request's tokens)
        after this draft's rows."""
        raise NotImplementedError(self.join_refusal())

    # optional hooks
    def observe(self, features: Any, count: np.ndarray) -> None:
        """(``reads_features``) the target's features ``[R, F, H]`` of the next ``count[r]`` positions."""

    def encode(self, inputs: Any, target_state: Any) -> None:
        """(encoder-decoder targets) once per request, before the first round: the rows' encoder
        inputs and the target's encoder output."""

    def models(self) -> list[tuple[Any, str]]:
        """The models this draft runs besides the target, with their role (length and memory checks)."""
        return []

    def default_lookahead(self) -> int:
        """The lookahead when the user gives none: a tree's depth, else 4."""
        return self.spec.depth if self.spec is not None else 4

    def lookahead_limit(self) -> tuple[int, str] | None:
        """The most drafts per round this draft can make, and why; None: no limit."""
        return None

    def use_static(self) -> bool:
        """Switch to static steps (``cuda_graphs=True``) if this draft's model can: whether it did."""
        return False


_EARLY = re.compile(r"^early-exit:(\d+)$")
_NGRAM = re.compile(r"^ngram(?::(\d+))?$")


def named_draft(draft: Any) -> tuple[str | None, int]:
    """``("ngram", N)`` for ``"ngram"`` / ``"ngram:N"`` (N >= 1, default 3), ``("early-exit", N)``
    for ``"early-exit:N"``, ``(None, 0)`` for anything else."""
    if not isinstance(draft, str):
        return None, 0
    m = _NGRAM.match(draft)
    if m:
        n = int(m.group(1) or 3)
        if n < 1:
            raise ValueError(f"{draft!r}: N in 'ngram:N' (the longest n-gram looked up) must be >= 1")
        return "ngram", n
    m = _EARLY.match(draft)
    return ("early-exit", int(m.group(1))) if m else (None, 0)


def named_kind(draft: Any, kind: str, options: DraftOptions) -> int | None:
    """``N`` when ``draft`` names ``kind`` (``"ngram:N"``, ``"early-exit:N"``; chains only: ``tree=`` is
    refused), else None: the ``from_spec`` of the kinds users name by a string."""
    name, n = named_draft(draft)
    if name != kind:
        return None
    refuse_tree(draft, options)
    return n


def refuse_tree(draft: Any, options: DraftOptions) -> None:
    """``ValueError`` when ``tree=`` was given with a draft that drafts chains only."""
    if options.tree is not None:
        raise ValueError(
            f"tree= needs a draft that proposes token trees: 'suffix', MedusaHeads or a FeatureDraft trained "
            f"on this target (domains.text.training.heads / feature_draft), got {type(draft).__name__}; draft "
            "models, 'ngram' and 'early-exit:N' draft chains (tree=None)")
