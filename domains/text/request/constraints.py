"""Constraints on what a row may generate (JSON schemas, regular expressions, grammars), exact under
speculation.

A constraint is a stateful processor with rollback, one per row (:class:`RowConstraint`): it holds
the state after the row's committed new tokens, and answers, for any prefix that extends them (the
drafts before a position), which tokens may come next. Under a constraint the law of the next token
is the target's law masked by the state after THAT position's prefix and renormalised, then warped
(temperature, top-k, top-p): the target is masked at each verified position with the state after the
committed tokens and the drafts before it. A draft may sample from any law as long as it reports that
law; masking it with the state after its OWN drafted prefix only raises acceptance (a token the state
refuses is always rejected). What gives valid text with the wrong law: the target masked with another
state, the warper applied before the mask, a reported law that is not the one sampled, a state not
rolled back after a round (``proofs/12-constrained-decoding.md``).

:class:`Constraints` drives the per-row states for :class:`~.processors.Transforms`: before a call it
advances each row by the tokens committed since (never rolled back), then for each position consumes
the position's drafts, reads the mask, and rolls the drafts back at the end. Chains reuse the
consumed drafts from one position to the next; token trees walk each node's path.

:class:`GrammarConstraint` is the one implementation shipped, on llguidance's ``LLMatcher`` (JSON
schema, regex, Lark grammar; ``pip install "speculate[structured]"``); a user may plug in their own
:class:`RowConstraint` (a stop-sequence automaton, a "no repeated line" rule).

>>> class Digits:                                  # a user's constraint: digits, then EOS after three
...     def __init__(self): self.n = 0
...     def advance(self, tokens): self.n += len(tokens); return len(tokens)
...     def rollback(self, n): self.n -= n
...     def allowed(self, vocab):
...         ok = np.zeros(vocab, bool)
...         ok[9 if self.n >= 3 else slice(0, 9)] = True      # ids 0..8 are digits, 9 is EOS
...         return ok
>>> c = Constraints([Digits()], vocab=10)
>>> import torch
>>> from speculate.domains.text.request.tokens import TokenBuffer
>>> buf = TokenBuffer.from_prompts([[1, 2]], extra=4)
>>> c.masks(buf, np.array([0, 0]), [np.array([3, 4]), np.array([3, 4, 5])])[:, 9].tolist()  # EOS after 3
[False, True]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Constraints", "GrammarConstraint", "RowConstraint", "grammar_constraints"]


@runtime_checkable
class RowConstraint(Protocol):
    """One row's constraint: a state after the tokens it has consumed, with rollback."""

    def advance(self, tokens: Sequence[int]) -> int:
        """Consume ``tokens`` while they are allowed; how many were (the state moves past those only)."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens."""
        ...

    def allowed(self, vocab: int) -> np.ndarray:
        """bool ``[vocab]``: the tokens allowed next in the current state."""
        ...


class Constraints:
    """The per-row constraints of one request (None: a row without one), over ``vocab`` ids."""

    def __init__(self, rows: Sequence[RowConstraint | None], vocab: int, eos: Sequence[int] = ()) -> None:
        for r, c in enumerate(rows):
            if c is not None and not isinstance(c, RowConstraint):
                raise TypeError(f"row {r}: a constraint needs advance(tokens), rollback(n) and allowed(vocab); "
                                f"got {type(c).__name__}")
        self.rows = list(rows)
        self.vocab = int(vocab)
        self.eos = np.asarray(eos, np.int64).reshape(-1)  # what a row may end with once its constraint is met
        self.synced = np.full(len(self.rows), -1, np.int64)  # per row: buffer tokens the state has consumed
        self._eos = set(self.eos.tolist())
        self._memo: dict[int, dict[tuple, np.ndarray]] = {}  # row -> {drafts: mask} since its last commit
        self._held: dict[int, list[int]] = {}  # row -> the drafts its state has consumed past the committed tokens
        self.seconds = 0.0  # time spent in the constraints (advance, masks, rollback): benchmarks read it

    def repeat(self, n: int) -> Constraints:
        """Each row's constraint for ``n`` rows in a row (``num_return_sequences``): fresh copies."""
        import copy

        return Constraints([copy.deepcopy(c) for c in self.rows for _ in range(n)], self.vocab, self.eos)

    def extend(self, rows: Sequence[RowConstraint | None]) -> None:
        """Constraints of new buffer rows after the current ones (continuous batching: rows join)."""
        self.rows += list(rows)
        self.synced = np.concatenate([self.synced, np.full(len(rows), -1, np.int64)])

    def taken(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep``, renumbered ``0 .. len(keep) - 1`` (their drafts in hand dropped)."""
        self.release()
        self._memo.clear()
        keep = np.asarray(keep, np.int64)
        self.rows = [self.rows[int(r)] for r in keep]
        self.synced = self.synced[keep]

    def _sync(self, tokens: Any, row: int) -> RowConstraint:
        """The row's state advanced by the tokens it committed since the last call."""
        c = self.rows[row]
        start = int(tokens.prompt_len[row]) if self.synced[row] < 0 else int(self.synced[row])
        n = int(tokens.n[row])
        if n > start:
            self._memo.pop(row, None)  # masks of the last round's prefixes: stale now
            c.rollback(len(self._held.pop(row, [])))  # the drafts in hand: the committed tokens come instead
            new = tokens.ids[row, start:n].tolist()
            took = c.advance(new)
            if took != len(new):
                raise RuntimeError(f"row {row}: committed token {new[took]} is not allowed by the row's constraint "
                                   "(a token was committed without its mask: a bug)")
        self.synced[row] = n
        return c

    def _goto(self, row: int, c: RowConstraint, prefix: list[int]) -> bool:
        """Move the row's state to the committed tokens then ``prefix`` (rolling back only what differs
        from the drafts in hand); False when the state refuses a token of ``prefix`` (it stops before it)."""
        held = self._held.setdefault(row, [])
        keep = 0
        while keep < min(len(held), len(prefix)) and held[keep] == prefix[keep]:
            keep += 1
        if len(held) > keep:
            c.rollback(len(held) - keep)
            del held[keep:]
        if len(prefix) > keep:
            took = c.advance(prefix[keep:])
            held += prefix[keep : keep + took]
        return len(held) == len(prefix)

    def release(self) -> None:
        """Roll every row back to its committed tokens (the drafts in hand dropped)."""
        for row, held in self._held.items():
            self.rows[row].rollback(len(held))
        self._held.clear()

    def masks(self, tokens: Any, rows: np.ndarray, extras: Sequence[np.ndarray]) -> np.ndarray:
        """bool ``[m, vocab]``: item ``i`` is buffer row ``rows[i]``, its committed tokens, then ``extras[i]``
        (drafts); all True for a row without a constraint, or a prefix its constraint can never reach (a
        draft it does not allow: the target gives that draft probability 0, so nothing there is used)."""
        t0 = time.perf_counter()
        out = np.ones((len(rows), self.vocab), bool)
        order = sorted(range(len(rows)), key=lambda i: (int(rows[i]), len(extras[i])))
        for i in order:
            row = int(rows[i])
            if self.rows[row] is None:
                continue
            c = self._sync(tokens, row)
            if self._goto(row, c, [int(t) for t in extras[i]]):
                out[i] = self._allowed(c)
        self.seconds += time.perf_counter() - t0
        return out

    def chain_masks(self, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None, first: int, J: int) -> np.ndarray:
        """bool ``[R, J, vocab]``: position ``j`` of row ``i`` has the prefix: the committed tokens, then
        ``drafts[i, :first + j]`` (what :class:`~.processors.Transforms` scores: a chain). The same masks as
        :meth:`masks`; grammar rows in one native call for all their positions and rows."""
        R = len(rows)
        drafts = np.zeros((R, 0), np.int64) if drafts is None else np.asarray(drafts)
        grammar = [i for i in range(R) if isinstance(self.rows[int(rows[i])], GrammarConstraint)]
        if not grammar or len(np.unique(rows)) < R:  # a row twice (tree nodes): one state, prefix by prefix
            extras = [drafts[i, : first + j] for i in range(R) for j in range(J)]
            return self.masks(tokens, np.repeat(rows, J), extras).reshape(R, J, self.vocab)
        t0 = time.perf_counter()
        out = np.ones((R, J, self.vocab), bool)
        others = [i for i in range(R) if i not in set(grammar) and self.rows[int(rows[i])] is not None]
        words = (self.rows[int(rows[grammar[0]])].n_tok + 31) // 32
        bits = np.zeros((R * J, words), np.int32)
        jobs, start, fresh = [], {}, {}
        for i in grammar:
            row = int(rows[i])
            c = self._sync(tokens, row)
            memo = self._memo.setdefault(row, {})  # masks of this row's prefixes since its last commit
            d = drafts[i, : first + J - 1].tolist()
            m = 0  # the first positions a draft step already asked for (the target asks again)
            while m < J and tuple(d[: first + m]) in memo:
                out[i, m] = memo[tuple(d[: first + m])]
                m += 1
            start[i] = m
            if m == J:
                continue
            if not self._goto(row, c, d[: first + m]):  # a draft before these positions is refused: unreachable
                bits[i * J + m : (i + 1) * J] = -1
                continue
            tail = d[first + m : first + J - 1]
            ok = c.matcher.validate_tokens(tail) if tail else 0
            end = next((j for j, t in enumerate(tail[:ok]) if t in self._eos), ok)  # a row ends at its EOS
            jobs.append((c.matcher, i * J + m, tail[:end]))
            fresh[i] = m + end  # positions m .. m + end are computed; past them unreachable, all allowed
            bits[i * J + m + end + 1 : (i + 1) * J] = -1
        if 0 < len(jobs) <= DIRECT_ROWS:  # a few rows: directly (the pool's hand-off costs more than their masks)
            for matcher, k, d in jobs:
                for j in range(len(d) + 1):
                    bits[k + j] = np.frombuffer(matcher.compute_bitmask(), np.int32)[:words]
                    if j < len(d):
                        matcher.consume_token(d[j])
                matcher.rollback(len(d))
        elif jobs:
            import llguidance.numpy as lln

            with_drafts = [j for j in jobs if j[2]]
            if with_drafts:
                lln.fill_next_token_bitmask_par_with_draft_tokens(_executor(), with_drafts, bits)
            alone = [(m, k) for m, k, d in jobs if not d]  # llguidance wants at least one draft token above
            if alone:
                lln.fill_next_token_bitmask_par(_executor(), alone, bits)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab].astype(bool)
        if allowed.shape[1] < self.vocab:
            allowed = np.pad(allowed, ((0, 0), (0, self.vocab - allowed.shape[1])))
        for i in grammar:
            m = start[i]
            out[i, m:] = allowed[i * J + m : (i + 1) * J]
            memo = self._memo[int(rows[i])]
            for j in range(m, fresh.get(i, m - 1) + 1):
                memo[tuple(drafts[i, : first + j].tolist())] = out[i, j]
        self.seconds += time.perf_counter() - t0
        if others:
            extras = [drafts[i, : first + j] for i in others for j in range(J)]
            out[others] = self.masks(tokens, np.repeat(rows[others], J), extras).reshape(len(others), J, self.vocab)
        return out

    def _allowed(self, c: RowConstraint) -> np.ndarray:
        a = np.asarray(c.allowed(self.vocab), bool)
        if a.shape != (self.vocab,):
            raise ValueError(f"a constraint's allowed(vocab) must return bool [{self.vocab}], got shape {a.shape}")
        return a


class GrammarConstraint:
    """A row's constraint from llguidance's ``LLMatcher``: a JSON schema, a regex or a Lark grammar."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the grammar is invalid: {self.matcher.get_error()}")
        self.n_tok = int(tokenizer.vocab_size)

    def __deepcopy__(self, memo: dict) -> GrammarConstraint:
        new = object.__new__(GrammarConstraint)
        new.matcher, new.n_tok = self.matcher.deep_copy(), self.n_tok
        return new

    def advance(self, tokens: Sequence[int]) -> int:
        ok = self.matcher.validate_tokens(list(tokens)) if tokens else 0
        if ok and not self.matcher.consume_tokens(list(tokens[:ok])):
            raise RuntimeError(f"the grammar matcher failed: {self.matcher.get_error()}")
        return ok

    def rollback(self, n: int) -> None:
        if n > 0 and not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar matcher could not roll back {n} tokens: {self.matcher.get_error()}")

    def allowed(self, vocab: int) -> np.ndarray:
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        ok = np.unpackbits(bits, bitorder="little")[: min(self.n_tok, vocab)].astype(bool)
        return ok if len(ok) == vocab else np.concatenate([ok, np.zeros(vocab - len(ok), bool)])


_EXECUTOR: list[Any] = []
#: rows whose masks are computed in this thread; more go to llguidance's pool, whose hand-off costs
#: more than a few rows' masks on a small machine (benchmarks/results/text_structured.md is with 16)
DIRECT_ROWS = 16


def _executor() -> Any:
    """llguidance's thread pool for masks of many rows at once (one per process)."""
    if not _EXECUTOR:
        import llguidance

        _EXECUTOR.append(llguidance.LLExecutor())
    return _EXECUTOR[0]


#: one LLTokenizer per tokenizer object (building one reads the whole vocabulary)
_TOKENIZERS: dict[int, tuple[Any, Any]] = {}


def _lltokenizer(tokenizer: Any, vocab: int) -> Any:
    hit = _TOKENIZERS.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    try:
        import llguidance.hf
    except ImportError as e:
        raise ImportError("json_schema=, regex= and grammar= need llguidance: "
                          'pip install "speculate[structured]"') from e
    try:
        llt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=max(vocab, len(tokenizer)))
    except Exception as e:  # a slow (Python) tokenizer: llguidance reads a fast one's vocabulary
        raise ValueError(f"json_schema=, regex= and grammar= need a fast Hugging Face tokenizer "
                         f"(tokenizers backend); {type(tokenizer).__name__} gave: {e}") from e
    _TOKENIZERS[id(tokenizer)] = (tokenizer, llt)
    return llt


def _grammar(kind: str, spec: Any) -> str:
    import json

    import llguidance

    if kind == "json_schema":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise TypeError(f"json_schema must be a dict (or its JSON text), got {type(spec).__name__}")
        # compact JSON unless the schema's "x-guidance" says otherwise: with free whitespace a model can
        # spend its whole budget on spaces and newlines between two keys
        return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False})
    if not isinstance(spec, str):
        raise TypeError(f"{kind} must be a string, got {type(spec).__name__}")
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    return llguidance.LLMatcher.grammar_from_lark(spec)


def grammar_constraints(tokenizer: Any, vocab: int, n_rows: int, eos: Sequence[int] = (),
                        **specs: Any) -> Constraints | None:
    """The :class:`Constraints` of a request from ``json_schema=``, ``regex=`` or ``grammar=`` (Lark), or
    ``constraint=`` (the caller's own :class:`RowConstraint`; one is copied for every row): one spec for
    every row, or a list of ``n_rows`` (None for a row without a constraint). Every spec is
    compiled and checked against the tokenizer before any work (``ValueError`` with llguidance's message)."""
    given = {k: v for k, v in specs.items() if v is not None}
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"give one of json_schema=, regex=, grammar=, constraint=; got {', '.join(given)}")
    (kind, spec), = given.items()
    if kind == "constraint":  # the user's own RowConstraint: one for all rows (copied), or one per row
        import copy

        per_row = list(spec) if isinstance(spec, (list, tuple)) else [copy.deepcopy(spec) for _ in range(n_rows)]
        if len(per_row) != n_rows:
            raise ValueError(f"constraint: {len(per_row)} constraints for {n_rows} prompts; give one, or one per "
                             "prompt")
        return Constraints(per_row, vocab, eos)
    if tokenizer is None:
        raise ValueError(f"{kind}= needs the generator's tokenizer (SpeculativeGenerator(..., tokenizer=tok)): "
                         "the constraint is on text, the model's tokens are spelled by the tokenizer")
    per_row = list(spec) if isinstance(spec, (list, tuple)) else [spec] * n_rows
    if len(per_row) != n_rows:
        raise ValueError(f"{kind}: {len(per_row)} constraints for {n_rows} prompts; give one, or one per prompt")
    import llguidance

    llt = _lltokenizer(tokenizer, vocab)
    compiled: dict[str, str] = {}
    rows: list[RowConstraint | None] = []
    for r, s in enumerate(per_row):
        if s is None:
            rows.append(None)
            continue
        key = repr(s) if not isinstance(s, dict) else __import__("json").dumps(s, sort_keys=True)
        if key not in compiled:
            try:
                g = _grammar(kind, s)
            except (ValueError, TypeError) as e:
                raise type(e)(f"{kind} of row {r}: {e}") from None
            is_err, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(g, llt)
            if is_err:
                raise ValueError(f"{kind} of row {r} is invalid: {'; '.join(msgs)}")
            compiled[key] = g
        rows.append(GrammarConstraint(llt, compiled[key]))
    eos_ids = [*eos, *[int(e) for e in np.atleast_1d(llt.eos_tokens() if callable(getattr(llt, "eos_tokens", None))
                                                      else [llt.eos_token])]]
    return Constraints(rows, vocab, sorted(set(eos_ids)))
