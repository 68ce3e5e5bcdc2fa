"""Checks for proofs/12-constrained-decoding.md: constrained (masked) targets under speculation."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from fractions import Fraction as F

import numpy as np
import pytest

from proofs.cases import constant, marginal, random_table, simplex_grid
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    chain_joint_law,
    expected_outcomes,
    extend_with_target,
    residual,
    round_law,
    target_joint_law,
)

# ----------------------------------------------------------------------- automata and masks


class Automaton:
    """A deterministic automaton over tokens ``0..V-1``: ``allowed[s]`` (non-empty) and ``delta[s][x]``.

    ``delta`` is total; its values on refused tokens are never used by the constrained law.
    """

    def __init__(self, allowed, delta, start=0):
        self.allowed = [frozenset(a) for a in allowed]
        self.delta = [list(row) for row in delta]
        self.start = start

    def run(self, tokens, s=None):
        """The state after ``tokens`` from ``s`` (default: the start); None if a token is refused."""
        s = self.start if s is None else s
        for x in tokens:
            if x not in self.allowed[s]:
                return None
            s = self.delta[s][x]
        return s

    def consume(self, tokens, s):
        """The state after the longest allowed prefix of ``tokens`` (what ``RowConstraint.advance`` does)."""
        for x in tokens:
            if x not in self.allowed[s]:
                break
            s = self.delta[s][x]
        return s


def random_automaton(seed, V, S=3):
    """Random non-empty allowed sets (not all of them full) and random transitions."""
    rng = random.Random(seed)
    while True:
        allowed = []
        for _ in range(S):
            a = {x for x in range(V) if rng.random() < 0.55} or {rng.randrange(V)}
            allowed.append(a)
        if any(len(a) < V for a in allowed):
            break
    delta = [[rng.randrange(S) for _ in range(V)] for _ in range(S)]
    return Automaton(allowed, delta)


def mask(law, A):
    """norm(law * 1_A); the constrained law needs Z = law(A) > 0."""
    w = [p if x in A else F(0) for x, p in enumerate(law)]
    Z = sum(w)
    if Z == 0:
        raise ValueError("the mask removed every token")
    return [x / Z for x in w]


def mask_draft(law, A):
    """A draft masked with A: norm(law * 1_A), or uniform on A if the draft gives A no mass (any law will
    do for the draft, as long as it is the one reported)."""
    Z = sum(p for x, p in enumerate(law) if x in A)
    if Z == 0:
        return [F(1, len(A)) if x in A else F(0) for x in range(len(law))]
    return [p / Z if x in A else F(0) for x, p in enumerate(law)]


# warpers on exact laws, as in domains/text/request/sampling.py (the mask is -inf logits: probability 0)


def temperature_half(law):
    """Temperature 1/2: p^2, renormalised (exact in Fractions)."""
    w = [p * p for p in law]
    return [x / sum(w) for x in w]


def top_k(kk):
    def warp(law):
        thr = sorted(law, reverse=True)[kk - 1]  # ties at the boundary are kept
        w = [p if p >= thr else F(0) for p in law]
        return [x / sum(w) for x in w]

    return warp


def top_p(t):
    def warp(law):
        order = sorted(range(len(law)), key=lambda i: law[i])  # ascending, stable (as torch.sort(stable=True))
        remove, cum = set(), F(0)
        for pos, i in enumerate(order):
            cum += law[i]
            if cum <= 1 - t and pos < len(order) - 1:  # keep at least the most likely token
                remove.add(i)
        w = [F(0) if i in remove else p for i, p in enumerate(law)]
        return [x / sum(w) for x in w]

    return warp


def constrained(T, aut, warp=None):
    """The constrained target: p(. | h) masked with the state after h, then the warper. After a prefix the
    automaton refuses, the law is unmasked (``Constraints.masks`` returns all True there); it is never used."""

    def Tc(h):
        s = aut.run(h)
        law = T(h) if s is None else mask(T(h), aut.allowed[s])
        return law if warp is None else warp(law)

    return Tc


def draft_for(kind, Q, aut, c, warp=None):
    """The draft law reported to the verifier (and sampled from) in a round from committed prefix ``c``."""
    if kind == "unmasked":
        return Q
    if kind == "own":  # masked with the state after its own drafted prefix (the implementation)

        def D(h):
            s = aut.run(h)
            law = Q(h) if s is None else mask_draft(Q(h), aut.allowed[s])
            return law if warp is None else warp(law)

        return D
    s = aut.run(c) if kind == "committed" else aut.start  # a wrong state: the committed one, or a fixed one
    return lambda h: mask_draft(Q(h), aut.allowed[s])


DRAFTS = ["own", "unmasked", "committed", "start"]
WARPS = [None, top_p(F(3, 4)), top_k(2), temperature_half]


def reachable(Tc, V, L, c=()):
    """The histories of length L the constrained target reaches from c (positive probability)."""
    return [c + s for s in target_joint_law(Tc, V, L, c)]


def case(seed):
    V = 3 + seed % 2
    aut = random_automaton(seed, V)
    T = random_table(seed, V, zeros=False)  # p > 0: Z(h) > 0 for every state
    Q = random_table(300 + seed, V)  # the draft has zeros (masks may leave it no mass: uniform on A)
    return V, aut, T, Q, WARPS[seed % 4]


# ----------------------------------------------------------------------- statement 1 and 2: exactness


@pytest.mark.parametrize("seed", range(8))
def test_one_round_is_exact_for_the_constrained_target(seed):
    """Criterion (C) for one round (k = 1, 2; token and block rules) with the target masked by each
    position's own prefix state, and every draft: masked by its own state, unmasked, masked by the
    committed state, masked by a fixed state (and, with a warper, masked then warped like the target)."""
    V, aut, T, Q, warp = case(seed)
    Tc = constrained(T, aut, warp)
    kinds = DRAFTS + (["own, warped"] if warp else [])
    for c in [(), *reachable(Tc, V, 1)[:2]]:
        for k in (1, 2):
            want = target_joint_law(Tc, V, k + 1, c)
            assert all(aut.run(c + s) is not None for s in want)  # the target only says what A allows
            for rule in ("token", "block"):
                for kind in kinds:
                    D = draft_for(kind.split(",")[0], Q, aut, c, warp if "," in kind else None)
                    law = round_law(Tc, D, V, k, rule, prefix=c)
                    assert all(aut.run(c + b) is not None for b in law)
                    assert_exact_law(extend_with_target(law, Tc, V, k + 1, c), want,
                                     f"{rule} k={k} draft {kind} after {c}")


@pytest.mark.parametrize("seed", range(4))
def test_rounds_give_the_constrained_joint_law(seed):
    """Successive rounds (k = 2), the draft's mask recomputed from each round's committed prefix: the law of
    the first 4 tokens is the constrained target's, for every draft."""
    V, aut, T, Q, warp = case(seed)
    Tc = constrained(T, aut, warp)
    want = target_joint_law(Tc, V, 4)
    for rule in ("token", "block"):
        for kind in DRAFTS:
            law = chain_joint_law(Tc, Q, V, 4, 2, rule=lambda s, kind=kind, rule=rule: round_law(
                Tc, draft_for(kind, Q, aut, s), V, 2, rule, prefix=s))
            assert_exact_law(law, want, f"{rule} chain, draft {kind}")


def test_the_law_after_a_refused_draft_is_never_used():
    """Statement 1's remark: after a draft the automaton refuses, any target law gives the same round law
    (unmasked, as the implementation; or another law)."""
    for seed in range(4):
        V, aut, T, Q, _ = case(seed)
        Tc = constrained(T, aut)
        other = lambda h, Tc=Tc, aut=aut, V=V: Tc(h) if aut.run(h) is not None else [F(1, V)] * V  # noqa: E731
        for rule in ("token", "block"):
            assert round_law(Tc, Q, V, 2, rule) == round_law(other, Q, V, 2, rule)


@pytest.mark.parametrize("seed", range(8))
def test_acceptance_identity_and_the_drafts_mask(seed):
    """alpha = sum_x min(p_c, q) = sum over A(s) of min(p_c, q), the probability that a k = 1 round keeps the
    draft; a draft outside A(s) is never kept; masking the draft with its own state never lowers alpha
    (pointwise at every history) nor Pr[a round keeps >= i drafts] (token and block rules, k = 2)."""
    V, aut, T, Q, warp = case(seed)
    Tc = constrained(T, aut, warp)
    strict = False
    for h in [(), *reachable(Tc, V, 1), *reachable(Tc, V, 2)]:
        A = aut.allowed[aut.run(h)]
        p = Tc(h)
        alphas = {}
        for kind in DRAFTS:
            q = draft_for(kind, Q, aut, h[:1])(h)
            a = acceptance(p, q)
            assert a == sum(min(p[x], q[x]) for x in A)
            law = round_law(Tc, constant(q), V, 1, "token", prefix=h)  # the draft's law at h is q
            assert sum(w for b, w in law.items() if len(b) == 2) == a
            assert all(b[0] in A for b in law)  # a draft outside A(s) is rejected (p_c = 0 there)
            alphas[kind] = a
        assert alphas["own"] >= alphas["unmasked"]
        strict |= alphas["own"] > alphas["unmasked"]
    own, unmasked = draft_for("own", Q, aut, ()), Q
    for rule in ("token", "block"):
        lo, hi = round_law(Tc, unmasked, V, 2, rule), round_law(Tc, own, V, 2, rule)
        for i in (1, 2):
            assert sum(w for b, w in hi.items() if len(b) > i) >= sum(w for b, w in lo.items() if len(b) > i)
        assert expected_outcomes(Tc, own, V, 2, rule) >= expected_outcomes(Tc, unmasked, V, 2, rule)
    assert strict  # on each of these tables some history has alpha(own) > alpha(unmasked)


def test_no_order_between_the_own_mask_and_a_wrong_one():
    """At one position a wrong state's mask may accept more or less than the right one."""
    p_c, q = [F(1), F(0)], [F(1, 2), F(1, 2)]  # A(s) = {0, 1}: the own mask leaves q as it is
    assert acceptance(p_c, mask_draft(q, {0, 1})) == F(1, 2)
    assert acceptance(p_c, mask_draft(q, {0})) == 1
    assert acceptance(p_c, mask_draft(q, {1})) == 0


# ----------------------------------------------------------------------- statement 3: failure modes

NO_00 = Automaton([{0, 1}, {1}], [[1, 0], [1, 0]])  # "no two 0s in a row": s1 = after a 0
ONLY_0_FIRST = Automaton([{0}, {0, 1}], [[1, 1], [1, 1]])  # the first token is 0, then anything
HALF = constant([F(1, 2), F(1, 2)])


def committed_state_target(T, aut, c):
    """The bug: every position of the round from c masked with the committed state s(c)."""
    return lambda h: mask(T(h), aut.allowed[aut.run(c)])


@pytest.mark.parametrize("rule", ["token", "block"])
def test_committed_state_target_counterexamples(rule):
    """p uniform on {0, 1}, k = 1, the draft masked by its own state. "No 00": the target's law of the first
    two tokens is 01: 1/2, 10: 1/4, 11: 1/4; masking position 2 with the committed state gives each pair 1/4,
    00 included, which the automaton refuses (loud). "0 first": 00: 1/2, 01: 1/2 becomes 00: 1 (silent)."""
    want = target_joint_law(constrained(HALF, NO_00), 2, 2)
    assert want == {(0, 1): F(1, 2), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    D = draft_for("own", HALF, NO_00, ())
    bad = round_law(committed_state_target(HALF, NO_00, ()), D, 2, 1, rule)
    assert bad == {(0, 0): F(1, 4), (0, 1): F(1, 4), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    assert NO_00.run((0, 0)) is None
    good = round_law(constrained(HALF, NO_00), D, 2, 1, rule)
    assert good == want
    want = target_joint_law(constrained(HALF, ONLY_0_FIRST), 2, 2)
    assert want == {(0, 0): F(1, 2), (0, 1): F(1, 2)}
    D = draft_for("own", HALF, ONLY_0_FIRST, ())
    bad = round_law(committed_state_target(HALF, ONLY_0_FIRST, ()), D, 2, 1, rule)
    assert bad == {(0, 0): F(1)}
    assert all(ONLY_0_FIRST.run(b) is not None for b in bad)


def test_committed_state_target_is_biased_on_random_automata():
    """One round (k = 1, 2; token and block) with every position masked by the committed state fails
    criterion (C) on random automata, while the same tables with the right masks pass it."""
    biased = 0
    for seed in range(8):
        V, aut, T, Q, _ = case(seed)
        Tc = constrained(T, aut)
        for k in (1, 2):
            want = target_joint_law(Tc, V, k + 1)
            for rule in ("token", "block"):
                D = draft_for("own", Q, aut, ())
                assert extend_with_target(round_law(Tc, D, V, k, rule), Tc, V, k + 1) == want
                law = round_law(committed_state_target(T, aut, ()), D, V, k, rule)
                biased += extend_with_target(law, Tc, V, k + 1) != want
    assert biased >= 24


def test_warper_before_the_mask_is_a_different_law():
    """Top-p 3/4 on p = (5/8, 1/4, 1/8) with A = {1, 2}: mask then top-p gives (0, 2/3, 1/3); top-p then mask
    gives (0, 1, 0). Top-k 2 on (1/2, 1/4, 3/16, 1/16) with A = {1, 2, 3}: (0, 4/7, 3/7, 0) against
    (0, 1, 0, 0). Every token stays allowed: silent. Temperature commutes with the mask."""
    p, A = [F(5, 8), F(1, 4), F(1, 8)], {1, 2}
    assert top_p(F(3, 4))(mask(p, A)) == [0, F(2, 3), F(1, 3)]
    assert mask(top_p(F(3, 4))(p), A) == [0, 1, 0]
    p4, A4 = [F(1, 2), F(1, 4), F(3, 16), F(1, 16)], {1, 2, 3}
    assert top_k(2)(mask(p4, A4)) == [0, F(4, 7), F(3, 7), 0]
    assert mask(top_k(2)(p4), A4) == [0, 1, 0, 0]
    # through a round (k = 2, token and block), any draft: the round emits the wrong law, exactly
    aut = Automaton([A], [[0, 0, 0]])
    right = constrained(constant(p), aut, top_p(F(3, 4)))
    wrong = lambda h: mask(top_p(F(3, 4))(p), A)  # noqa: E731
    for rule in ("token", "block"):
        law = round_law(wrong, constant([F(1, 3)] * 3), 3, 2, rule)
        assert all(aut.run(b) is not None for b in law)
        assert marginal(law, 0, 3) == [0, 1, 0] != right(())
    for law in simplex_grid(3, 4):
        for r in range(1, 4):
            for B in itertools.combinations(range(3), r):
                if sum(law[x] for x in B):
                    assert temperature_half(mask(law, B)) == mask(temperature_half(law), B)


def test_reported_q_must_be_the_sampling_law():
    """The draft samples from its masked law but the verifier is told the unmasked one: p = (1/2, 1/4, 1/4),
    A = {0, 1} (p_c = (2/3, 1/3, 0)), q uniform: every ratio p_c / q is >= 1, every draft is kept, and the
    output is the masked draft (1/2, 1/2, 0). Also biased on random tables."""
    aut = Automaton([{0, 1}], [[0, 0, 0]])
    Tc = constrained(constant([F(1, 2), F(1, 4), F(1, 4)]), aut)
    Q = constant([F(1, 3)] * 3)
    law = round_law(Tc, Q, 3, 1, proposal=draft_for("own", Q, aut, ()))
    assert marginal(law, 0, 3) == [F(1, 2), F(1, 2), 0] != Tc(())
    biased = 0
    for seed in range(8):
        V, aut, T, _, _ = case(seed)
        Q = random_table(300 + seed, V, zeros=False)
        Tc = constrained(T, aut)
        for rule in ("token", "block"):
            law = round_law(Tc, Q, V, 2, rule, proposal=draft_for("own", Q, aut, ()))
            biased += extend_with_target(law, Tc, V, 3) != target_joint_law(Tc, V, 3)
    assert biased >= 8


# ----------------------------------------------------------------------- statement 4: rollback


def paths(q_at, k):
    out = [((), F(1))]
    for _ in range(k):
        out = [((*xs, x), w * qx) for xs, w in out for x, qx in enumerate(q_at(xs)) if qx]
    return out


def token_round(p_at, q_at, k):
    """{(drafts, block): probability} of one token-rule round; ``p_at(xs)``, ``q_at(xs)``: the target's and
    the draft's law after the drafts ``xs``."""
    out = defaultdict(F)
    for xs, w in paths(q_at, k):
        keep = w
        for i in range(k + 1):
            p = p_at(xs[:i])
            if i == k:
                for y, py in enumerate(p):
                    if py:
                        out[(xs, (*xs, y))] += keep * py
                break
            q, x = q_at(xs[:i]), xs[i]
            a = min(F(1), p[x] / q[x])
            if a < 1:
                for y, r in enumerate(residual(p, q)):
                    if r:
                        out[(xs, (*xs[:i], y))] += keep * (1 - a) * r
            keep *= a
            if not keep:
                break
    return out


def stateful_rounds(T, Q, aut, V, L, k, rollback=True):
    """Law of the first L tokens when the automaton's state is carried between rounds as the implementation
    does: the masks consume the drafts; with ``rollback`` they are rolled back and the state advances by the
    committed block; without, the block is consumed after the drafts. A committed token the state refuses
    raises (outcome "raise")."""
    live, done = {((), aut.start): F(1)}, defaultdict(F)
    while live:
        new = defaultdict(F)
        for (seq, s), w in live.items():
            if len(seq) >= L:
                done[seq[:L]] += w
                continue

            def state(xs, seq=seq, s=s):
                return aut.run(xs, s)

            def p_at(xs, seq=seq, state=state):
                st = state(xs)
                return T(seq + xs) if st is None else mask(T(seq + xs), aut.allowed[st])

            def q_at(xs, seq=seq, state=state):
                st = state(xs)
                return Q(seq + xs) if st is None else mask_draft(Q(seq + xs), aut.allowed[st])

            for (xs, block), pb in token_round(p_at, q_at, k).items():
                after = s if rollback else aut.consume(xs, s)
                nxt = aut.run(block, after)
                if nxt is None:
                    done["raise"] += w * pb
                else:
                    new[(seq + block, nxt)] += w * pb
        live = new
    return dict(done)


def test_rollback():
    """With the drafts rolled back, carrying the state gives the constrained target's law of 4 tokens (and
    the round enumerator agrees with round_law); without, the law changes (a refused commit raises, or
    silently)."""
    changed = 0
    for seed in range(6):
        V, aut, T, Q, _ = case(seed)
        Tc = constrained(T, aut)
        own = draft_for("own", Q, aut, ())
        rounds = defaultdict(F)
        for (_, block), w in token_round(Tc, own, 2).items():
            rounds[block] += w
        assert dict(rounds) == round_law(Tc, own, V, 2)
        assert stateful_rounds(T, Q, aut, V, 4, 2) == target_joint_law(Tc, V, 4)
        changed += stateful_rounds(T, Q, aut, V, 4, 2, rollback=False) != target_joint_law(Tc, V, 4)
    assert changed >= 5
    # "No 00", p and q uniform, k = 1: a first draft 0 is kept (p_c = q at s0) and the bonus is 1, so the
    # round commits 01; without rollback the state has consumed the draft 0 already and refuses the committed
    # 0: the run raises with probability 1/2.
    bad = stateful_rounds(HALF, HALF, NO_00, 2, 2, 1, rollback=False)
    assert bad == {"raise": F(1, 2), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    assert stateful_rounds(HALF, HALF, NO_00, 2, 2, 1) == target_joint_law(constrained(HALF, NO_00), 2, 2)


# ----------------------------------------------------------------------- the code path


class AutomatonRow:
    """A ``RowConstraint`` (``domains/text/request/constraints.py``) on an Automaton."""

    def __init__(self, aut):
        self.aut, self.states = aut, [aut.start]

    def advance(self, tokens):
        n = 0
        for x in tokens:
            s = self.states[-1]
            if x not in self.aut.allowed[s]:
                break
            self.states.append(self.aut.delta[s][x])
            n += 1
        return n

    def rollback(self, n):
        if n:
            del self.states[-n:]

    def allowed(self, vocab):
        ok = np.zeros(vocab, bool)
        ok[sorted(self.aut.allowed[self.states[-1]])] = True
        return ok


def test_constraints_masks_code_path():
    """``Constraints.masks`` gives every prefix (committed tokens, then drafts) the allowed set of the state
    after it (all True after a refused draft); the state is the one after the committed tokens and the drafts
    it holds (rolled back when the next committed tokens come, or by ``release``), follows the committed
    tokens across rounds, and raises on a committed token the state refuses."""
    constraints = pytest.importorskip("speculate.domains.text.request.constraints")
    tokens_mod = pytest.importorskip("speculate.domains.text.request.tokens")
    V = 4
    for seed in range(3):
        aut = random_automaton(40 + seed, V)
        rows = [AutomatonRow(aut), None, AutomatonRow(aut)]
        c = constraints.Constraints(rows, vocab=V)
        buf = tokens_mod.TokenBuffer.from_prompts([[3], [1, 2], [0]], extra=8)
        rng = random.Random(seed)
        extras = [e for n in range(3) for e in itertools.product(range(V), repeat=n)]
        for _ in range(3):  # rounds: commit an allowed block on rows 0 and 2, then ask for every mask
            for r in (0, 2):
                done = tuple(buf.ids[r, buf.prompt_len[r]:buf.n[r]].tolist())
                for _ in range(rng.randint(0, 2)):
                    tok = rng.choice(sorted(aut.allowed[aut.run(done)]))
                    buf.ids[r, buf.n[r]] = tok
                    buf.n[r] += 1
                    done += (tok,)
            items = [(r, e) for r in range(3) for e in extras]
            rng.shuffle(items)
            got = c.masks(buf, np.array([r for r, _ in items]), [np.array(e, np.int64) for _, e in items])
            for (r, e), m in zip(items, got, strict=True):
                done = tuple(buf.ids[r, buf.prompt_len[r]:buf.n[r]].tolist())
                s = aut.run(done + e) if rows[r] is not None else None
                want = np.ones(V, bool) if s is None else np.isin(np.arange(V), sorted(aut.allowed[s]))
                assert (m == want).all(), (r, e)
            for r in (0, 2):  # the state: after the committed tokens and the drafts in hand (rolled back later)
                done = tuple(buf.ids[r, buf.prompt_len[r]:buf.n[r]].tolist())
                assert rows[r].states[-1] == aut.run(done + tuple(c._held.get(r, [])))
        c.release()
        for r in (0, 2):  # release: back to the committed tokens
            assert rows[r].states[-1] == aut.run(tuple(buf.ids[r, buf.prompt_len[r]:buf.n[r]].tolist()))
        done = tuple(buf.ids[0, buf.prompt_len[0]:buf.n[0]].tolist())
        refused = [x for x in range(V) if x not in aut.allowed[aut.run(done)]]
        if refused:  # loud: a committed token the state refuses
            buf.ids[0, buf.n[0]] = refused[0]
            buf.n[0] += 1
            with pytest.raises(RuntimeError, match="not allowed"):
                c.masks(buf, np.array([0]), [np.array([], np.int64)])
