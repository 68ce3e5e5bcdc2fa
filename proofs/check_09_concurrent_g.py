"""Checks for proofs/09-concurrent-g.md: running g on the guess concurrently changes nothing."""

from __future__ import annotations

import itertools
import threading
from fractions import Fraction as F

import numpy as np
import pytest

import speculate
from proofs.cases import simplex_grid
from proofs.stats import binomial_test, chi2_gof, min_samples
from speculate.testing.exact import acceptance, residual

M = 4  # g's own randomness: omega uniform on {0, .., M-1}


def g_table(y: int, omega: int) -> int:
    """A stochastic g: z = g(y, omega), with G(z | y) = P(g(y, omega) = z)."""
    return (y + (omega >= 1 + y % 3)) % 2


def G(y: int) -> list[F]:
    law = [F(0), F(0)]
    for w in range(M):
        law[g_table(y, w)] += F(1, M)
    return law


def engine_law(p, q, policy):
    """Exact joint law of (Y, Z) of speculate(f, f_star, g) with p = f(x), q = f_star(x).

    policy: "fresh" (g recomputed with fresh randomness on rejection), "reuse" (the recomputation
    reuses the omega of the discarded call), "keep guess value" (the bug: g(guess) is returned
    even on rejection), "shared uniform" (g's randomness IS the acceptance uniform)."""
    V = len(p)
    law: dict = {}

    def add(y, z, w):
        law[y, z] = law.get((y, z), 0) + w

    r = residual(p, q) if acceptance(p, q) < 1 else None
    for x in range(V):
        if not q[x]:
            continue
        keep = min(F(1), p[x] / q[x])
        if policy == "shared uniform":
            # u < keep accepts; g(x, omega) with omega = floor(M u): the same uniform
            for w in range(M):
                lo, hi = F(w, M), F(w + 1, M)
                acc = max(F(0), min(hi, keep) - lo)  # measure of u in [lo, hi) with u < keep
                add(x, g_table(x, w), q[x] * acc)
                if hi - lo - acc:
                    for y in range(V):
                        for z, gz in enumerate(G(y)):
                            add(y, z, q[x] * (hi - lo - acc) * r[y] * gz)
            continue
        for w in range(M):  # omega of the concurrent call g(x)
            zx = g_table(x, w)
            add(x, zx, q[x] * keep / M)
            if keep < 1:
                for y in range(V):
                    if policy == "fresh":
                        for z, gz in enumerate(G(y)):
                            add(y, z, q[x] * (1 - keep) / M * r[y] * gz)
                    elif policy == "reuse":
                        add(y, g_table(y, w), q[x] * (1 - keep) / M * r[y])
                    else:  # keep guess value
                        add(y, zx, q[x] * (1 - keep) / M * r[y])
    return law


def pipeline_law(p):
    return {(y, z): p[y] * gz for y in range(len(p)) for z, gz in enumerate(G(y)) if p[y] * gz}


@pytest.mark.parametrize("policy", ["fresh", "reuse"])
def test_engine_law_is_the_pipeline_law(policy):
    """Exhaustive over a grid of (p, q) on 3 outcomes: (Y, Z) ~ p(y) G(z | y) exactly."""
    for p, q in itertools.product(simplex_grid(3, 6), repeat=2):
        law = {k: v for k, v in engine_law(p, q, policy).items() if v}
        assert law == pipeline_law(p), (p, q)


@pytest.mark.parametrize("policy", ["keep guess value", "shared uniform"])
def test_broken_contracts_are_biased(policy):
    """Returning g(guess) after a rejection, or letting g draw its randomness from the verifier's
    uniform, changes the law of (Y, Z)."""
    biased = 0
    for p, q in itertools.product(simplex_grid(3, 6), repeat=2):
        law = {k: v for k, v in engine_law(p, q, policy).items() if v}
        biased += law != pipeline_law(p)
        assert sum(law.values()) == 1
        y_law = [sum(v for (y, _), v in law.items() if y == yy) for yy in range(3)]
        assert y_law == p  # Y alone is still exact: the damage is to Z and the pair
    assert biased > 0


class StochasticG:
    """A stochastic g with its own generator (independent of the engine's rng), thread-safe."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, y):
        with self.lock:
            self.calls += 1
            return g_table(int(y), int(self.rng.integers(M)))


def run_engine(n, seed):
    p, q = [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]
    P, Q = speculate.Categorical(probs=p), speculate.Categorical(probs=q)
    g = StochasticG(seed + 1)
    rng = np.random.default_rng(seed)
    counts = np.zeros(6, np.int64)
    kept = 0
    for _ in range(n):
        res = speculate.speculate(lambda x: P, lambda x: Q, g, None, rng=rng)
        counts[2 * int(res.sample) + int(res.value)] += 1
        kept += res.accepted
    law = pipeline_law([F(1, 2), F(1, 4), F(1, 4)])
    expected = [float(law.get((y, z), 0)) for y in range(3) for z in range(2)]
    return counts, expected, kept, g.calls


def test_library_speculate_joint_law():
    """speculate.speculate with a stochastic g: chi-square of (Y, Z) on 6 cells at level 1e-6
    (6 600 calls: power 0.99 at TV >= 0.05) and a binomial test of the acceptance rate."""
    n = 6_600
    assert n >= min_samples(0.05, 6)
    counts, expected, kept, calls = run_engine(n, 3)
    chi2_gof(counts, expected, 0.05, "speculate (Y, Z)")
    binomial_test(kept, n, 0.75, 0.05, "speculate acceptance")
    # g ran on every guess that was kept, and on the sample after each rejection (a discarded
    # call on a rejected guess may or may not have started before it was cancelled)
    assert n <= calls <= n + (n - kept)


@pytest.mark.slow
def test_library_speculate_joint_law_slow():
    """The same at TV >= 0.02 (40 300 calls)."""
    n = 40_300
    assert n >= min_samples(0.02, 6)
    counts, expected, _, _ = run_engine(n, 4)
    chi2_gof(counts, expected, 0.02, "speculate (Y, Z), slow")


def test_library_contract_exceptions_and_values():
    """An exception of g on a rejected guess is discarded; on the final sample it propagates;
    f's exceptions propagate; a deterministic g always returns g(sample)."""
    P = speculate.Categorical(probs=[1.0, 0.0])
    Q = speculate.Categorical(probs=[0.0, 1.0])  # the guess 1 is always rejected

    def g(y):
        if y == 1:
            raise RuntimeError("g is undefined on the guess")
        return "ok"

    for seed in range(20):
        res = speculate.speculate(lambda x: P, lambda x: Q, g, None, rng=seed)
        assert (res.sample, res.value, res.accepted) == (0, "ok", False)
    with pytest.raises(RuntimeError, match="undefined"):
        speculate.speculate(lambda x: Q, lambda x: Q, g, None, rng=0)

    def bad_f(x):
        raise KeyError("f failed")

    with pytest.raises(KeyError):
        speculate.speculate(bad_f, lambda x: Q, lambda y: y, None, rng=0)
    R = speculate.Categorical(probs=[0.2, 0.3, 0.5])
    S = speculate.Categorical(probs=[0.5, 0.3, 0.2])
    for seed in range(50):
        res = speculate.speculate(lambda x: R, lambda x: S, lambda y: 10 * y + 1, None, rng=seed)
        assert res.value == 10 * res.sample + 1
