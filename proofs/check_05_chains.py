"""Checks for proofs/05-chains.md: token-wise verification of chains, stochastic transitions,
and which randomness may be reused after a rejection."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction as F

import pytest

from proofs.cases import random_table
from speculate.testing.exact import (
    assert_exact_law,
    chain_joint_law,
    extend_with_target,
    kernel_laws,
    kernel_round_law,
    round_law,
    target_joint_law,
)
from speculate.verify import (
    verify_block,
    verify_block_reference,
    verify_token,
    verify_token_reference,
)


@pytest.mark.parametrize("seed", range(16))
def test_token_chain_law_is_the_target_law(seed):
    """Random context-dependent tables with zeros (whole-prefix contexts), L = 4, k = 1..3."""
    V = 2 + seed % 2
    T, D = random_table(seed, V), random_table(1000 + seed, V)
    want = target_joint_law(T, V, 4)
    for k in (1, 2, 3):
        assert_exact_law(chain_joint_law(T, D, V, 4, k, "token"), want, f"token k={k}")
        # the one-round criterion (C): the block followed by target sampling is the target
        for prefix in [(), (0,), (1, 1)]:
            block = round_law(T, D, V, k, "token", prefix=prefix)
            assert_exact_law(extend_with_target(block, T, V, k + 1, prefix),
                             target_joint_law(T, V, k + 1, prefix), f"round after {prefix}")


def test_lookahead_chosen_from_the_past_keeps_exactness():
    """k may depend on the committed outcomes (here: on the prefix) without bias."""
    V = 3
    T, D = random_table(7, V), random_table(8, V)
    want = target_joint_law(T, V, 5)
    law = chain_joint_law(T, D, V, 5, 0, rule=lambda s: round_law(T, D, V, 1 + sum(s) % 3,
                                                                  "token", prefix=s))
    assert_exact_law(law, want, "prefix-dependent lookahead")


@pytest.mark.parametrize("kernel", [verify_token, verify_token_reference])
def test_kernel_token_chain(kernel):
    """The code path: verify_token[_reference] drives every round of the chain."""
    V, k = 3, 2
    for seed in range(3):
        T, D = random_table(20 + seed, V), random_table(40 + seed, V)
        for n in range(k + 1):
            assert_exact_law(kernel_round_law(kernel, T, D, V, k, length=n),
                             round_law(T, D, V, n), f"{kernel.__name__} length {n}")
        law = chain_joint_law(T, D, V, 3, k,
                              rule=lambda s, T=T, D=D: kernel_round_law(kernel, T, D, V, k,
                                                                        prefix=s))
        assert_exact_law(law, target_joint_law(T, V, 3), f"{kernel.__name__} chain")


@pytest.mark.parametrize("kernel", [verify_token, verify_block])
def test_kernel_ragged_lengths_and_stopping_times(kernel):
    """Lengths that depend on the prefix (an n-gram draft with or without a match) or on the
    drafts themselves (a confidence-based stop: a stopping time) keep the chain exact."""
    rule = "token" if kernel is verify_token else "block"
    V, k = 3, 3
    T, D = random_table(3, V), random_table(4, V)
    want = target_joint_law(T, V, 4)
    by_prefix = chain_joint_law(T, D, V, 4, k, rule=lambda s: kernel_round_law(
        kernel, T, D, V, k, rule, prefix=s, length=len(s) % (k + 1)))
    assert_exact_law(by_prefix, want, "prefix-dependent lengths")
    def stop(d):  # stop after a 0, or after a draft the draft itself found unlikely
        return d[-1] == 0 or D(d[:-1])[d[-1]] < F(1, 4)

    stopping = chain_joint_law(T, D, V, 4, k, rule=lambda s: kernel_round_law(
        kernel, T, D, V, k, rule, prefix=s, stop=stop))
    assert_exact_law(stopping, want, "stopping-time lengths")


# --------------------------------------------------------- a tiny stochastic environment

NOISE = [F(3, 4), F(1, 4)]  # the environment's own randomness xi
PI = {0: [F(3, 4), F(1, 4)], 1: [F(1, 4), F(3, 4)], 2: [F(1, 2), F(1, 2)]}  # target policy
RHO = {0: [F(1, 2), F(1, 2)], 1: [F(1, 2), F(1, 2)], 2: [F(3, 4), F(1, 4)]}  # draft policy
NU = 4  # the draft samples by inverse CDF from a uniform on {0, 1/4, 2/4, 3/4}


def env_step(s: int, a: int, xi: int) -> int:
    return (s + a + 2 * xi) % 3


def draft_by_noise(s: int, nu: int) -> int:
    """Inverse CDF of RHO[s] at nu/4: exactly RHO[s] when nu is uniform on 0..3."""
    c = F(0)
    for a, pa in enumerate(RHO[s]):
        c += pa
        if c > F(nu, NU):
            return a
    raise AssertionError


def target_trajectory_law(L: int, s0: int = 0):
    """Law of (actions, states) of L steps of the target policy in the environment."""
    out = {((), (s0,)): F(1)}
    for _ in range(L):
        new = defaultdict(F)
        for (acts, sts), w in out.items():
            for a, pa in enumerate(PI[sts[-1]]):
                for xi, px in enumerate(NOISE):
                    if pa and px:
                        new[(*acts, a), (*sts, env_step(sts[-1], a, xi))] += w * pa * px
        out = new
    return dict(out)


def speculative_trajectory_law(L, k, rule, kernel, env_noise, draft_noise, s0=0):
    """Exact law of L steps when rounds of k drafted steps are verified by ``kernel``.

    env_noise: "fresh" (every transition draws new noise) or "restored" (the noise is a stream
    indexed by time: a snapshot that includes the environment's RNG is restored after a
    rejection, so the residual step and later steps replay the discarded steps' noise).
    draft_noise: "fresh", or "restored" (the DRAFT policy's sampling noise is such a stream too,
    e.g. the draft samples from the environment's RNG)."""
    # every drafted path (s0, a1, s1, ..., ak, sk) -> the kernel's exact law of (n, next)
    paths = [((s,), ()) for s in range(3)]
    for _ in range(k):
        paths = [((*ss, env_step(ss[-1], a, xi)), (*xs, a))
                 for ss, xs in paths for a in range(2) for xi in range(2)]
    cases = [([PI[s] for s in ss], [RHO[s] for s in ss[:-1]], list(xs)) for ss, xs in paths]
    verdict = dict(zip(paths, kernel_laws(kernel, cases, rule), strict=True))

    def reveal(table, pos, law):
        if pos in table:
            return [(table[pos], F(1), table)]
        return [(v, pv, {**table, pos: v}) for v, pv in enumerate(law) if pv]

    done = defaultdict(F)
    frontier = [((), (s0,), {}, {}, F(1))]
    while frontier:
        acts, sts, env, drf, w = frontier.pop()
        t = len(acts)
        if t >= L:
            done[acts[:L], sts[:L + 1]] += w
            continue
        drafted = [((sts[-1],), (), env, drf, F(1))]
        for i in range(k):
            new = []
            for ss, xs, e, d, wd in drafted:
                s = ss[-1]
                if draft_noise == "restored":
                    acts_i = [(draft_by_noise(s, nu), pnu, d2)
                              for nu, pnu, d2 in reveal(d, t + i, [F(1, NU)] * NU)]
                else:
                    acts_i = [(a, pa, d) for a, pa in enumerate(RHO[s]) if pa]
                for a, pa, d2 in acts_i:
                    noise = (reveal(e, t + i, NOISE) if env_noise == "restored"
                             else [(xi, px, e) for xi, px in enumerate(NOISE)])
                    for xi, px, e2 in noise:
                        new.append(((*ss, env_step(s, a, xi)), (*xs, a), e2, d2, wd * pa * px))
            drafted = new
        for ss, xs, e, d, wd in drafted:
            for (n, y), pv in verdict[ss, xs].items():
                noise = (reveal(e, t + n, NOISE) if env_noise == "restored"
                         else [(xi, px, e) for xi, px in enumerate(NOISE)])
                for xi, px, e2 in noise:
                    frontier.append(((*acts, *xs[:n], y), (*sts, *ss[1:n + 1],
                                                           env_step(ss[n], y, xi)),
                                     e2, d, w * wd * pv * px))
    return dict(done)


L, K = 3, 2


@pytest.mark.parametrize(("rule", "kernel"), [("token", verify_token), ("block", verify_block)])
@pytest.mark.parametrize("env_noise", ["fresh", "restored"])
def test_environment_noise_may_be_fresh_or_restored(rule, kernel, env_noise):
    """Stochastic transitions: exact with fresh noise AND when a snapshot restores the
    environment's RNG (its noise replayed after a rejection), for token AND block verification."""
    law = speculative_trajectory_law(L, K, rule, kernel, env_noise, "fresh")
    assert_exact_law(law, target_trajectory_law(L), f"{rule}, env noise {env_noise}")


def test_replaying_the_draft_sampling_noise_is_exact_for_token():
    law = speculative_trajectory_law(L, K, "token", verify_token, "restored", "restored")
    assert_exact_law(law, target_trajectory_law(L), "token, draft noise replayed")


@pytest.mark.parametrize("env_noise", ["fresh", "restored"])
def test_replaying_the_draft_sampling_noise_biases_block(env_noise):
    """Counterexample: block verification's decision depends on the discarded drafts, so
    replaying their sampling noise in the next round biases the trajectory law."""
    law = speculative_trajectory_law(L, K, "block", verify_block_reference, env_noise, "restored")
    with pytest.raises(AssertionError, match="differs at outcome"):
        assert_exact_law(law, target_trajectory_law(L), "block, draft noise replayed")
    want = target_trajectory_law(L)
    tv = sum(abs(law.get(x, 0) - want.get(x, 0)) for x in set(law) | set(want)) / 2
    assert tv > F(1, 100)


def replayed_draft_noise_law(T, D, V, L, k, rule):
    """Law of the first L outcomes when the draft at absolute position t is always the same coin
    c_t (inverse CDF of D at a uniform that is replayed, not redrawn, after a rejection)."""
    total = defaultdict(F)
    streams = list(__import__("itertools").product(range(2), repeat=L + k))
    for coins in streams:
        def proposal(prefix, coins=coins):
            q = D(prefix)
            x = 0 if F(coins[len(prefix)], 2) < q[0] else 1
            return [F(int(y == x)) for y in range(V)]
        for seq, w in chain_joint_law(T, D, V, L, k, rule, proposal=proposal).items():
            total[seq] += w / len(streams)
    return dict(total)


def test_minimal_counterexample_replayed_draft_noise():
    """The two-outcome example of the proof: q = (1/2, 1/2) drafted by a replayed coin per
    position, p(.|()) = (1/4, 3/4), p(.|..0) = (0, 1), p(.|..1) = (1/2, 1/2), k = 2."""
    half = F(1, 2)
    T = lambda s: [F(1, 4), F(3, 4)] if not s else ([F(0), F(1)] if s[-1] == 0 else [half, half])  # noqa: E731
    D = lambda s: [half, half]  # noqa: E731
    want = target_joint_law(T, 2, 2)
    assert want == {(0, 1): F(1, 4), (1, 0): F(3, 8), (1, 1): F(3, 8)}
    assert replayed_draft_noise_law(T, D, 2, 2, 2, "token") == want
    assert replayed_draft_noise_law(T, D, 2, 2, 2, "block") == {
        (0, 1): F(1, 4), (1, 0): F(1, 2), (1, 1): F(1, 4)}
