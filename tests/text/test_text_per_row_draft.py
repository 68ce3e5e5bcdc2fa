"""Drafts of several kinds chosen per row (``draft=[...]``, drafts/per_row.py).

- The law of the first 3 tokens equals the target's exact law (:func:`continuation_law`) at
  temperature 1 with top-k, with a suffix-draft chain and a draft model chosen per row (both used),
  at the suite's level (``speculate.testing.DEFAULT_ALPHA``), catching a joint TV of 0.02 with
  probability 0.99 (the suffix draft's harness: summed per-prompt chi-square).
- A planted bug, choosing each row's kind after the kinds drew (the more confident first draft), is
  caught by the same test.
- Greedy output equals plain greedy decoding, both kinds drafting; bad input.
- A kind that keeps losing for a row is re-tried less and less often (waits double up to MAX_WAIT),
  and found again when it starts to win; new rows start with the kind that gained earlier rows most.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from speculate.domains.text import SpeculativeGenerator
from speculate.domains.text.continuation_law import continuation_law
from speculate.domains.text.drafts import PerRowDraft, make_draft
from speculate.domains.text.drafts.base import Drafted
from speculate.domains.text.drafts.model import ModelDraft
from speculate.domains.text.drafts.ngram import NgramDraft
from speculate.domains.text.drafts.suffix import SuffixDraft
from speculate.domains.text.request.sampling import SamplingConfig

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import chi2_sample_size
from tests.text.test_text_suffix import FAST_TV, POWER, PROMPTS, _p_value, _sample


class _ChosenAfterTheDraws(PerRowDraft):
    """A planted bug: every kind drafts every row, then each row keeps the kind whose first draft was
    the more probable under its own law (a choice that reads this round's draws)."""

    def propose(self, rows, tokens, k, need, cfg, rng, vocab):
        if k == 0:
            return super().propose(rows, tokens, k, need, cfg, rng, vocab)
        got = [d.propose(rows, tokens, k, need, cfg, rng, vocab) for d in self.kinds]
        R = len(rows)
        conf = np.stack([np.where(g.lengths > 0, g.q[np.arange(R), 0, g.outcomes[:, 0]], -1.0) for g in got])
        choice = np.argmax(conf, axis=0)
        out = Drafted(np.zeros((R, k), np.int64), np.zeros((R, k, vocab), np.float32), np.zeros(R, np.int64))
        for j, g in enumerate(got):
            m = choice == j
            out.outcomes[m], out.q[m], out.lengths[m] = g.outcomes[m], g.q[m], g.lengths[m]
        return out._replace(state=(choice, np.zeros(R, bool), [g.state for g in got], np.ones(len(got), bool)))


def _kinds(make_llama):
    suffix = SuffixDraft(max_nodes=6, min_prob=0.0, spec_factor=8.0, max_occurrences=32, store=4096, chain=True)
    return [suffix, ModelDraft(make_llama(layers=1, rng=5))]


def _law_p(make_llama, kind=PerRowDraft):
    target = make_llama(eos=None)
    draft = kind(_kinds(make_llama), prior=False)  # every request tries both kinds: both drafts many rows
    gen = SpeculativeGenerator(target, draft, lookahead=3)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    seed = zlib.crc32(b"per-row")
    _sample(gen, 100, 6, cfg, [], rng=seed + 1)  # earlier requests: the suffix store holds their outputs
    laws = [continuation_law(target, prompt, 3, cfg, []) for prompt in PROMPTS]
    cells = sum(sum(1 for w in law.values() if w > 0) for law in laws)
    n = -(-chi2_sample_size(FAST_TV, cells, alpha=ALPHA, power=POWER) // len(PROMPTS))
    draft.counts[:] = 0
    samples, st = _sample(gen, n, 3, cfg, [], rng=seed)
    return _p_value(laws, samples), st, draft


def test_output_law_is_the_targets(make_llama):
    """Catches a TV deviation of FAST_TV = 0.02 of the joint law with probability 0.99."""
    p, st, draft = _law_p(make_llama)
    assert draft.counts.min() > 1000, draft.counts  # both kinds drafted many rows
    assert st.accepted > 1000 and st.rejections > 1000, st
    assert p > ALPHA, f"p = {p:.2e}: choosing drafts per row biases the output"


def test_a_choice_that_reads_the_draws_is_caught(make_llama):
    p, _, _ = _law_p(make_llama, kind=_ChosenAfterTheDraws)
    assert p < ALPHA, f"p = {p:.2e}: a choice made after the draws went unseen"


def test_greedy_equals_plain_greedy_and_rows_find_their_kind(make_llama):
    """Row 0 repeats itself (the suffix draft's matches); row 1 does not. Greedy output is plain
    greedy decoding's, with drafts accepted and both kinds drafting. (Which kind a row settles on is
    tested without a model below: the tiny random target's greedy text gains little from either.)"""
    target = make_llama(eos=None)
    prompts = [[1, 5, 7, 2, 1, 5, 7, 2, 1, 5, 7, 2, 1], [3, 9, 4, 6]]
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(attention_mask=mask, max_new_tokens=40, temperature=0, eos_token_id=[])
    want = SpeculativeGenerator(target, "ngram", lookahead=0).generate(ids, **kw)
    draft = PerRowDraft(_kinds(make_llama))
    out = SpeculativeGenerator(target, draft, lookahead=4).generate(ids, **kw)
    assert out.sequences == want.sequences
    assert out.stats.accepted >= 10 and draft.counts.min() >= 1


def test_named_and_refused(make_llama):
    target = make_llama()
    d = make_draft(["suffix", "ngram:2"], target)
    assert isinstance(d, PerRowDraft) and d.kinds[0].spec is None and isinstance(d.kinds[1], NgramDraft)
    with pytest.raises(ValueError, match="two or more"):
        PerRowDraft([NgramDraft(2)])
    with pytest.raises(ValueError, match="token trees"):
        PerRowDraft([SuffixDraft(), NgramDraft(2)])  # a tree
    with pytest.raises(ValueError, match="tree="):
        make_draft(["suffix", "ngram"], target, tree="dynamic")
    with pytest.raises(ValueError, match="verify_on_device=False"):
        SpeculativeGenerator(target, ["suffix", "ngram"], verify_on_device=True).generate(
            torch.tensor([[1, 2, 3]]), max_new_tokens=4, temperature=1.0)
    with pytest.raises(TypeError, match="Draft"):
        PerRowDraft([NgramDraft(2), "ngram"])


def test_a_kind_that_keeps_losing_is_retried_less_and_less_often():
    """Two kinds for one row: kind 1 gains 1 token per round, kind 0 three, for 3000 rounds; then they
    swap. A fixed re-try every EXPLORE rounds spent about 3000 / 17 = 176 rounds on the loser; with the
    waits doubling it spends at most a few dozen, and after the swap kind 1 leads again within
    MAX_WAIT rounds and a few more."""
    d = PerRowDraft([NgramDraft(2), NgramDraft(3)])
    d._empty(1)
    no_run = np.zeros(2, bool)  # the kinds' own states are not touched (nothing ran)

    def play(rounds, gains):
        picks = []
        for _ in range(rounds):
            choice, retry = d._choice()
            picks.append(int(choice[0]))
            d.advance((choice, retry, [None, None], no_run), np.array([1]), np.array([gains[choice[0]] - 1]))
        return np.array(picks)

    before = play(3000, {0: 3, 1: 1})
    assert (before == 0).sum() > 2950 and 2 <= (before == 1).sum() <= 40, np.bincount(before)
    assert d.wait[1, 0] == PerRowDraft.MAX_WAIT
    after = play(3000, {0: 1, 1: 3})
    first = int(np.argmax(after == 1))
    assert first <= PerRowDraft.MAX_WAIT + 1 and (after[first + 50:] == 1).mean() > 0.97


def test_new_rows_start_with_the_kind_that_gained_earlier_rows_most():
    """With ``prior`` (the default) a new request's rows draft first with the kind that gained earlier
    rows the most (here the second kind, which an untried-first order would not pick); without it, every
    kind is tried afresh in the order given."""
    no_run = np.zeros(2, bool)
    for prior, first in ((True, 1), (False, 0)):
        d = PerRowDraft([NgramDraft(2), NgramDraft(3)], prior=prior)
        d._empty(3)
        for _ in range(40):
            choice, retry = d._choice()
            gains = np.where(choice == 1, 4, 1)
            d.advance((choice, retry, [None, None], no_run), np.ones(3, np.int64), gains - 1)
        d._empty(2)  # a new request of two rows
        assert d._choice()[0].tolist() == [first, first]
        if prior:
            assert d.prior[1] == pytest.approx(4.0) and 1.0 <= d.prior[0] < 1.5
