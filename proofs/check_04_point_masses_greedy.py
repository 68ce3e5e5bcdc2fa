"""Checks for proofs/04-point-masses-greedy.md: speculative execution and greedy verification."""

from __future__ import annotations

import random
from fractions import Fraction as F

import numpy as np
import pytest

import speculate
from proofs.cases import random_table, simplex_grid
from speculate.testing.exact import (
    acceptance,
    assert_exact_law,
    chain_joint_law,
    greedy,
    kernel_round_law,
    round_law,
    speculative_law,
    target_joint_law,
)
from speculate.verify import verify_greedy, verify_greedy_reference


def point(a, V):
    return [F(int(i == a)) for i in range(V)]


@pytest.mark.parametrize(("V", "n"), [(2, 12), (3, 6), (4, 4)])
def test_point_mass_target_is_speculative_execution(V, n):
    """p = delta_a: the draft is kept iff it equals a (probability q(a)), else a is returned."""
    for q in simplex_grid(V, n):
        for a in range(V):
            p = point(a, V)
            assert speculative_law(p, q) == p
            assert acceptance(p, q) == q[a]
            for x in range(V):  # the acceptance probability min(1, p(x)/q(x)) is 1{x = a}
                if q[x]:
                    assert min(F(1), p[x] / q[x]) == (x == a)


def tied_table(seed, V):
    """A context-dependent table whose rows often have tied maxima (to pin the tie rule)."""
    rng = random.Random(seed)
    cache = {}

    def table(prefix):
        if prefix not in cache:
            w = [rng.choice([0, 1, 2, 2]) for _ in range(V)]
            if not sum(w):
                w[rng.randrange(V)] = 1
            cache[prefix] = [F(x, sum(w)) for x in w]
        return cache[prefix]

    return table


@pytest.mark.parametrize("seed", range(12))
def test_greedy_verification_reproduces_argmax_decoding(seed):
    V = 2 + seed % 2
    T, D = tied_table(seed, V), random_table(100 + seed, V, den=4)
    want = target_joint_law(greedy(T), V, 4)
    assert len(want) == 1  # a point mass: the argmax sequence
    for k in (1, 2, 3):
        assert_exact_law(chain_joint_law(T, D, V, 4, k, "greedy"), want, f"greedy k={k}")
        # greedy verification IS token-wise verification against the greedy (point-mass) target
        for prefix in [(), (0,), (1, 0)]:
            assert round_law(greedy(T), D, V, k, "token", prefix=prefix) == round_law(
                T, D, V, k, "greedy", prefix=prefix)


@pytest.mark.parametrize("kernel", [verify_greedy, verify_greedy_reference])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_greedy(kernel, seed):
    """verify_greedy[_reference]: exact law of each round (every draft, lengths 0..k, ties broken
    to the lowest index) and the chain it drives equals argmax decoding."""
    V, k = 3, 2
    T, D = tied_table(seed, V), random_table(200 + seed, V, den=4)
    for n in range(k + 1):
        law = kernel_round_law(kernel, T, D, V, k, "greedy", length=n)
        assert_exact_law(law, round_law(T, D, V, n, "greedy"), f"{kernel.__name__} length {n}")
    chained = chain_joint_law(
        T, D, V, 4, k, rule=lambda s: kernel_round_law(kernel, T, D, V, k, "greedy", prefix=s))
    assert_exact_law(chained, target_joint_law(greedy(T), V, 4), "greedy kernel chain")


def collatz(s: int) -> int:
    return s // 2 if s % 2 == 0 else 3 * s + 1


@pytest.mark.parametrize("verify", ["token", "greedy"])
def test_library_chain_with_point_masses(verify):
    """speculate.chain with plain values (point masses): the output is the deterministic target
    trajectory, token for token, whatever the (often wrong) guesses are."""
    guess = lambda s: s // 2 if s % 3 else s + 1  # noqa: E731 (right on most even states)
    target = lambda states: [collatz(s) for s in states]  # noqa: E731
    want, s = [], 27
    for _ in range(60):
        s = collatz(s)
        want.append(s)
    for k in (1, 3, 6):
        traj = speculate.chain(target, guess, lambda s, x: x, 27, n=60, lookahead=k,
                               verify=verify, rng=k)
        assert traj.samples == want
        assert traj.state == want[-1]
        assert traj.stats.accepted <= traj.stats.proposed


def test_library_chain_greedy_categorical_equals_argmax_decoding():
    """verify='greedy' with Categorical targets and sampled drafts decodes the argmax path."""
    rng = np.random.default_rng(0)
    V = 5
    P = rng.dirichlet(np.ones(V), size=(V, V))  # order-2 chain: P[a, b] = law after (a, b)
    Qd = rng.dirichlet(np.ones(V), size=(V, V))
    target = lambda states: speculate.Categorical(  # noqa: E731
        probs=np.stack([P[a, b] for a, b in states]))
    draft = lambda s: speculate.Categorical(probs=Qd[s])  # noqa: E731
    step = lambda s, x: (s[1], int(x))  # noqa: E731
    want, s = [], (0, 1)
    for _ in range(40):
        x = int(np.argmax(P[s]))
        want.append(x)
        s = step(s, x)
    traj = speculate.chain(target, draft, step, (0, 1), n=40, lookahead=3, verify="greedy", rng=1)
    assert traj.samples == want


def test_library_speculate_with_point_masses():
    """speculate(f, f_star, g, x) with plain values is speculative execution: the result is
    g(f(x)); the guess is kept iff it equals f(x)."""
    f = lambda x: x * x  # noqa: E731
    for x in range(-5, 6):
        for f_star in (lambda x: x * x, lambda x: abs(x) * 2):
            res = speculate.speculate(f, f_star, lambda y: y + 1, x, rng=0)
            assert res.sample == x * x and res.value == x * x + 1
            assert res.accepted == (f_star(x) == x * x)
