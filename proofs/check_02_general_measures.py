"""Checks for proofs/02-general-measures.md: accept w.p. min(1, dp/dq); residual by rejection."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction as F

import numpy as np
import pytest
import sympy as sp
from scipy import integrate, stats

import speculate
from proofs.cases import simplex_grid
from proofs.stats import binomial_test, chi2_gof, min_samples
from speculate.testing.exact import acceptance, assert_exact_law, residual, total_variation

# ----------------------------------------------------------- exact laws of the general algorithm


def rejection_residual_law(p, q, tries: int | None):
    """Exact law of the residual sampler "Z ~ p, keep Z w.p. (1 - q(Z)/p(Z))_+", at most
    ``tries`` tries (None: unbounded). Returns (law of the kept Z, probability of failure)."""
    V = len(p)
    keep = [(1 - q[z] / p[z]) if p[z] > q[z] else F(0) for z in range(V)]
    per_try = [p[z] * keep[z] for z in range(V)]  # P(this try keeps and returns z)
    s = sum(per_try)  # P(a try succeeds) = TV(p, q)
    if tries is None:
        reach = 1 / s  # sum over j >= 1 of (1 - s)^(j - 1)
        fail = F(0)
    else:
        reach = sum((1 - s) ** j for j in range(tries))
        fail = (1 - s) ** tries
    return [w * reach for w in per_try], fail


def general_law(p, q, tries: int | None):
    """Exact law of the whole general rule, and its failure probability (an error is raised)."""
    a = acceptance(p, q)
    res, fail = rejection_residual_law(p, q, tries) if a < 1 else ([F(0)] * len(p), F(0))
    return [min(x, y) + (1 - a) * r for x, y, r in zip(p, q, res, strict=True)], (1 - a) * fail


GRIDS = [(2, 12), (3, 6), (4, 4)]


@pytest.mark.parametrize(("V", "n"), GRIDS)
def test_rejection_from_p_gives_the_residual_and_the_rule_is_exact(V, n):
    for p, q in itertools.product(simplex_grid(V, n), repeat=2):
        if p == q:
            continue
        tv = total_variation(p, q)
        res, _ = rejection_residual_law(p, q, None)
        assert res == residual(p, q)
        law, fail = general_law(p, q, None)
        assert_exact_law(law, p, f"general rule, p={p}, q={q}")
        assert fail == 0
        # tries ~ Geometric(TV): the partial sums of E[tries] are (1 - (1-t)^J (1 + J t)) / t,
        # which tend to 1/TV; expected draws from p per call: P(reject) / TV = 1
        J = 12
        partial = sum(j * tv * (1 - tv) ** (j - 1) for j in range(1, J + 1))
        assert partial == (1 - (1 - tv) ** J * (1 + J * tv)) / tv
        assert (1 - acceptance(p, q)) * (1 / tv) == 1


@pytest.mark.parametrize("N", [1, 2, 3, 5, 10])
def test_the_cost_of_bounding_the_tries(N):
    """Failure probability TV (1 - TV)^N <= 1/(e N); the law given success is within
    eps/(1 - eps) of p; falling back to a draw from p instead would be biased by eps TV(p, r)."""
    for p, q in itertools.product(simplex_grid(3, 6), repeat=2):
        if p == q:
            continue
        tv = total_variation(p, q)
        law, eps = general_law(p, q, N)
        assert eps == tv * (1 - tv) ** N
        assert float(eps) <= 1 / (math.e * N)
        given_success = [x / (1 - eps) for x in law]
        r = residual(p, q)
        assert total_variation(given_success, p) == eps * total_variation(p, r) / (1 - eps)
        fallback = [x + eps * y for x, y in zip(law, p, strict=True)]
        assert total_variation(fallback, p) == eps * total_variation(p, r)
        # expected draws from p per call with the bound: 1 - (1 - TV)^N <= 1
        draws = (1 - acceptance(p, q)) * sum((1 - tv) ** j for j in range(N))
        assert draws == 1 - (1 - tv) ** N


def test_symbolic_tries_and_the_bound():
    t = sp.symbols("t", positive=True)
    j, N = sp.symbols("j N", positive=True, integer=True)
    mean = sp.summation(j * t * (1 - t) ** (j - 1), (j, 1, sp.oo))
    assert sp.simplify(sp.piecewise_fold(mean).args[0][0] - 1 / t) == 0
    f = t * (1 - t) ** N
    assert sp.simplify(sp.diff(f, t).subs(t, 1 / (N + 1))) == 0  # the maximiser
    # max value N^N/(N+1)^(N+1) <= 1/(e N)  <=>  (1 + 1/N)^(N+1) >= e: decreasing to e
    g = (1 + 1 / N) ** (N + 1)
    assert sp.limit(g, N, sp.oo) == sp.E
    for n in [1, 2, 5, 10, 100, 10_000]:
        assert n**n / (n + 1) ** (n + 1) <= 1 / (math.e * n)


# ---------------------------------------------------------------------- continuous laws


def crossings(mp, sp_, mq, sq):
    """Points where N(mp, sp^2) and N(mq, sq^2) densities cross."""
    a = 1 / (2 * sq**2) - 1 / (2 * sp_**2)
    b = mp / sp_**2 - mq / sq**2
    c = mq**2 / (2 * sq**2) - mp**2 / (2 * sp_**2) + math.log(sq / sp_)
    if abs(a) < 1e-15:
        return [-c / b]
    d = math.sqrt(b * b - 4 * a * c)
    return sorted([(-b - d) / (2 * a), (-b + d) / (2 * a)])


def test_quadrature_continuous_identities():
    """Numerical quadrature (absolute tolerance 1e-9) for P = N(0.5, 1), Q = N(0, 1.5^2):
    acceptance = 1 - TV; the rejection sampler's per-try success = TV; residual integrates to 1."""
    P, Q = stats.norm(0.5, 1.0), stats.norm(0.0, 1.5)
    xs = crossings(0.5, 1.0, 0.0, 1.5)
    pts = [-40.0, *xs, 40.0]

    def quad(f):
        return sum(integrate.quad(f, a, b, epsabs=1e-13, limit=200)[0]
                   for a, b in itertools.pairwise(pts))

    alpha = quad(lambda x: min(P.pdf(x), Q.pdf(x)))
    tv = quad(lambda x: max(P.pdf(x) - Q.pdf(x), 0.0))
    tv2 = 0.5 * quad(lambda x: abs(P.pdf(x) - Q.pdf(x)))
    per_try = quad(lambda x: P.pdf(x) * max(1 - Q.pdf(x) / P.pdf(x), 0.0) if P.pdf(x) else 0.0)
    assert abs(alpha + tv - 1) < 1e-9 and abs(tv - tv2) < 1e-9 and abs(per_try - tv) < 1e-9
    # the closed form through the crossing points
    cdf = [P.cdf(x) - Q.cdf(x) for x in xs]
    assert abs(tv - (cdf[1] - cdf[0] if P.pdf(0.5) > Q.pdf(0.5) else cdf[0] - cdf[1])) < 1e-9


class Table:
    """A user distribution over 0..V-1 following the speculate.Distribution protocol."""

    discrete = True

    def __init__(self, probs):
        self.p = [float(x) for x in probs]
        self.c = np.cumsum(self.p)

    def sample(self, rng):
        return int(np.searchsorted(self.c, rng.random() * self.c[-1], side="right"))

    def log_prob(self, y):
        return math.log(self.p[y]) if 0 <= y < len(self.p) and self.p[y] > 0 else -math.inf


class Density:
    """A user density (Normal or Laplace) following the speculate.Distribution protocol."""

    discrete = False

    def __init__(self, kind, loc, scale):
        self.kind, self.loc, self.scale = kind, loc, scale

    def sample(self, rng):
        f = rng.normal if self.kind == "normal" else rng.laplace
        return float(f(self.loc, self.scale))

    def log_prob(self, y):
        z = (y - self.loc) / self.scale
        if self.kind == "normal":
            return -0.5 * z * z - math.log(self.scale * math.sqrt(2 * math.pi))
        return -abs(z) - math.log(2 * self.scale)


def test_library_general_rule_continuous():
    """speculative_sample through the general rule (rejection from p): chi-square on 10
    equiprobable bins of the target (level 1e-6, power 0.99 at binned TV >= 0.03) and a binomial
    test of the acceptance rate (|d alpha| >= 0.02)."""
    target, draft = Density("normal", 0.5, 1.0), Density("laplace", 0.0, 1.0)
    P, Q = stats.norm(0.5, 1.0), stats.laplace(0.0, 1.0)
    alpha = integrate.quad(lambda x: min(P.pdf(x), Q.pdf(x)), -40, 40, points=[-2, 0, 0.5, 3],
                           limit=200, epsabs=1e-12)[0]
    n = 26_000
    assert n >= min_samples(0.03, 10)
    rng = np.random.default_rng(7)
    ys, kept = np.empty(n), np.empty(n, bool)
    for i in range(n):
        ys[i], kept[i] = speculate.speculative_sample(target, draft, rng)
    bins = np.searchsorted(P.ppf(np.linspace(0, 1, 11)[1:-1]), ys)
    chi2_gof(np.bincount(bins, minlength=10), np.full(10, 0.1), 0.03, "general rule, continuous")
    binomial_test(int(kept.sum()), n, alpha, 0.02, "general rule acceptance")


def test_library_bounded_tries_fail_with_the_predicted_probability():
    """max_tries = 1 on a discrete pair: the error (ResidualSamplingError, never a wrong sample)
    occurs with probability TV (1 - TV) exactly as predicted, and the law given success is the
    predicted conditional law. Binomial test (|dp| >= 0.02) and chi-square (TV >= 0.03)."""
    p = [F(8, 64), F(24, 64), F(24, 64), F(8, 64)]  # Binomial(3, 1/2)
    q = [F(27, 64), F(27, 64), F(9, 64), F(1, 64)]  # Binomial(3, 1/4)
    law, eps = general_law(p, q, 1)
    assert eps == F(11, 32) * F(21, 32)
    rng = np.random.default_rng(11)
    n = 30_000
    target, draft = Table(p), Table(q)
    ys, fails = [], 0
    for _ in range(n):
        try:
            ys.append(speculate.speculative_sample(target, draft, rng, max_tries=1)[0])
        except speculate.ResidualSamplingError:
            fails += 1
    binomial_test(fails, n, float(eps), 0.02, "bounded tries: failure rate")
    expected = [float(x / (1 - eps)) for x in law]
    chi2_gof(np.bincount(ys, minlength=4), expected, 0.03, "bounded tries: law given success")


def test_library_general_rule_in_a_chain():
    """The round loop's position-by-position path (user distributions that are not Categorical,
    so each position goes through the general rule): a Markov chain on 3 states, the joint law
    of its first 3 outcomes against the exact law (27 cells, level 1e-6; 9 500 chains: power
    0.99 at TV >= 0.05)."""
    from speculate.testing.exact import target_joint_law

    P = [[F(1, 2), F(1, 4), F(1, 4)], [F(1, 8), F(5, 8), F(1, 4)], [F(1, 4), F(1, 4), F(1, 2)]]
    Q = [[F(1, 4), F(1, 2), F(1, 4)], [F(1, 4), F(1, 4), F(1, 2)], [F(1, 2), F(1, 4), F(1, 4)]]
    B = 9_500
    assert B >= min_samples(0.05, 27)
    res = speculate.chains(lambda states: [Table(P[s]) for s in states],
                           lambda s: Table(Q[s]), lambda s, x: int(x), [0] * B, n=3,
                           lookahead=2, rng=17)
    law = target_joint_law(lambda prefix: P[(0, *prefix)[-1]], 3, 3)
    cells = list(itertools.product(range(3), repeat=3))
    counts = np.zeros(27, np.int64)
    for s in res.samples:
        counts[cells.index(tuple(int(v) for v in s))] += 1
    chi2_gof(counts, [float(law.get(c, 0)) for c in cells], 0.05, "general rule chain")
