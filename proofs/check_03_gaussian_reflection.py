"""Checks for proofs/03-gaussian-reflection.md: reflection coupling of equal-scale Normals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import sympy as sp
from scipy import stats
from scipy.special import roots_legendre

import speculate
from proofs.stats import binomial_test, chi2_gof, min_samples
from speculate.verify import verify_gaussian, verify_gaussian_reference

KERNELS = [verify_gaussian, verify_gaussian_reference]


def test_symbolic_acceptance_is_two_phi_minus_half_delta():
    t = sp.symbols("t", real=True)
    d = sp.symbols("delta", positive=True)
    phi = lambda x: sp.exp(-x**2 / 2) / sp.sqrt(2 * sp.pi)  # noqa: E731
    Phi = lambda x: (1 + sp.erf(x / sp.sqrt(2))) / 2  # noqa: E731
    # for t < delta/2 the draft density phi(t) exceeds the target's phi(t - delta)
    assert sp.simplify((phi(t) / phi(t - d)).subs(t, d / 2)) == 1
    left = sp.integrate(phi(t - d), (t, -sp.oo, d / 2))
    right = sp.integrate(phi(t), (t, d / 2, sp.oo))
    assert sp.simplify(left + right - 2 * Phi(-d / 2)) == 0
    # and 1 - acceptance is the total variation 2 Phi(delta/2) - 1
    assert sp.simplify(1 - (left + right) - (2 * Phi(d / 2) - 1)) == 0


def test_symbolic_reflection_maps_the_rejected_mass_onto_the_residual():
    """d = 3, symbolic vectors: H = I - 2 e e^T/|e|^2 is an isometric involution with He = -e,
    so |Hw| = |w| and |Hw - e| = |w + e|; and p(x)/q(x) = exp(z.e - |e|^2/2)."""
    z = sp.Matrix(sp.symbols("z0:3", real=True))
    w = sp.Matrix(sp.symbols("w0:3", real=True))
    e = sp.Matrix(sp.symbols("e0:3", real=True))
    ee = (e.T * e)[0]
    H = sp.eye(3) - 2 * e * e.T / ee
    assert sp.simplify(H * H - sp.eye(3)) == sp.zeros(3)
    assert sp.simplify(H * e + e) == sp.zeros(3, 1)
    assert sp.simplify(((H * w).T * (H * w))[0] - (w.T * w)[0]) == 0
    assert sp.simplify(((H * w - e).T * (H * w - e))[0] - ((w + e).T * (w + e))[0]) == 0
    logratio = -((z - e).T * (z - e))[0] / 2 + (z.T * z)[0] / 2
    assert sp.simplify(logratio - ((z.T * e)[0] - ee / 2)) == 0


def _case(rng, D):
    m_q = rng.normal(size=D)
    m_p = m_q + rng.normal(scale=0.8, size=D)
    s = rng.uniform(0.5, 2.0, size=D)
    return m_p, m_q, s


def _call(kernel, m_p, m_q, s, x, u):
    """One position (K = 1) for a batch of drafts x [B, D] and uniforms u [B]."""
    B, D = x.shape
    loc_p = np.broadcast_to(m_p, (B, 2, D))
    loc_q = np.broadcast_to(m_q, (B, 1, D))
    scale = np.broadcast_to(s, (B, 2, D))
    n, y = kernel(loc_p, loc_q, scale, x[:, None, :], None, u[:, None], np.zeros((B, D)))
    return n, y


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("D", [1, 2, 5])
def test_kernel_threshold_and_reflection(kernel, D):
    """The kernel keeps x iff u < min(1, p(x)/q(x)) (probed 1e-9 on either side), and otherwise
    returns m_p + s (z - 2 (z.e/|e|^2) e): the component along e reflected, the rest kept."""
    rng = np.random.default_rng(D)
    for _ in range(5):
        m_p, m_q, s = _case(rng, D)
        x = m_q + s * rng.normal(size=(400, D))
        z, e = (x - m_q) / s, (m_p - m_q) / s
        r = np.minimum(1.0, np.exp(z @ e - e @ e / 2))
        inner = r < 1 - 1e-6
        n_lo, _ = _call(kernel, m_p, m_q, s, x, r * (1 - 1e-9))
        n_hi, y = _call(kernel, m_p, m_q, s, x[inner], r[inner] * (1 + 1e-9))
        assert np.all(n_lo == 1) and np.all(n_hi == 0)
        w = (y - m_p) / s  # whitened output: must be H z
        zi = z[inner]
        along = zi @ e / (e @ e)
        assert np.allclose(w @ e / (e @ e), -along, atol=1e-12, rtol=1e-12)
        assert np.allclose(w - np.outer(w @ e / (e @ e), e), zi - np.outer(along, e), atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_output_cdf_by_quadrature(kernel):
    """1-D: P(Y <= t) = int q(x) [r(x) 1{x <= t} + (1 - r(x)) 1{y(x) <= t}] dx with y(x) the
    kernel's own reflection, by Gauss-Legendre quadrature split at every kink (tolerance 1e-9);
    it equals the target CDF Phi((t - m_p)/s) at every t tried."""
    nodes, weights = roots_legendre(80)
    for m_p, m_q, s in [(0.7, 0.0, 1.0), (-1.3, 0.4, 0.6), (2.5, -0.5, 1.7)]:
        Q = stats.norm(m_q, s)
        mid = (m_p + m_q) / 2
        for t in np.linspace(m_p - 3 * s, m_p + 3 * s, 7):
            cuts = sorted({m_q - 14 * s, t, m_p + m_q - t, mid, m_q + 14 * s})
            cuts = [c for c in cuts if m_q - 14 * s <= c <= m_q + 14 * s]
            total = 0.0
            for a, b in itertools.pairwise(cuts):
                if b - a < 1e-14:
                    continue
                x = (b - a) / 2 * nodes + (a + b) / 2
                r = np.minimum(1.0, np.exp(stats.norm(m_p, s).logpdf(x) - Q.logpdf(x)))
                _, y = _call(kernel, np.array([m_p]), np.array([m_q]), np.array([s]),
                             x[:, None], np.full(len(x), 1 - 1e-16))
                f = Q.pdf(x) * (r * (x <= t) + (1 - r) * (y[:, 0] <= t))
                total += (b - a) / 2 * float(weights @ f)
            assert abs(total - stats.norm(m_p, s).cdf(t)) < 1e-9, (m_p, m_q, s, t)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_several_positions_lengths_and_bonus(kernel):
    """K = 3 positions: n is the first i with u_i >= r_i (within lengths), the next outcome is the
    reflection there, or the bonus m_p[L] + s z_next when all L are kept."""
    rng = np.random.default_rng(3)
    B, K, D = 300, 3, 2
    loc_q = rng.normal(size=(B, K, D))
    loc_p = np.concatenate([loc_q + 0.5 * rng.normal(size=(B, K, D)), rng.normal(size=(B, 1, D))],
                           axis=1)
    scale = rng.uniform(0.5, 2, size=(B, K + 1, D))
    x = loc_q + scale[:, :K] * rng.normal(size=(B, K, D))
    z, e = (x - loc_q) / scale[:, :K], (loc_p[:, :K] - loc_q) / scale[:, :K]
    r = np.minimum(1.0, np.exp(np.sum(z * e, -1) - np.sum(e * e, -1) / 2))  # [B, K]
    u = rng.uniform(size=(B, K))
    u = np.where(np.abs(u - r) < 1e-6, 0.5 * r, u)  # stay away from the thresholds
    lengths = rng.integers(0, K + 1, size=B)
    z_next = rng.normal(size=(B, D))
    n, y = kernel(loc_p, loc_q, scale, x, lengths, u, z_next)
    for b in range(B):
        rej = [i for i in range(lengths[b]) if u[b, i] >= r[b, i]]
        want = rej[0] if rej else lengths[b]
        assert n[b] == want
        if rej:
            i = want
            zz, ee = z[b, i], e[b, i]
            refl = loc_p[b, i] + scale[b, i] * (zz - 2 * (zz @ ee) / (ee @ ee) * ee)
            assert np.allclose(y[b], refl, atol=1e-12)
        else:
            assert np.allclose(y[b], loc_p[b, want] + scale[b, want] * z_next[b], atol=1e-12)


def test_library_reflection_statistical_1d():
    """speculative_sample(Normal, Normal) of equal scale, 130 000 batched draws: chi-square on 20
    equiprobable bins (level 1e-6, power 0.99 at binned TV >= 0.015) and a binomial test of the
    acceptance 2 Phi(-delta/2) (|d alpha| >= 0.01)."""
    m_p, m_q, s, N = 1.1, 0.2, 0.8, 130_000
    assert N >= min_samples(0.015, 20)
    y, kept = speculate.speculative_sample(
        speculate.Normal(np.full(N, m_p), s, batch_ndims=1),
        speculate.Normal(np.full(N, m_q), s, batch_ndims=1), rng=5)
    bins = np.searchsorted(stats.norm(m_p, s).ppf(np.linspace(0, 1, 21)[1:-1]), y)
    chi2_gof(np.bincount(bins, minlength=20), np.full(20, 0.05), 0.015, "reflection 1-D")
    delta = abs(m_p - m_q) / s
    binomial_test(int(kept.sum()), N, 2 * stats.norm.cdf(-delta / 2), 0.01, "reflection acceptance")


def test_library_reflection_statistical_3d():
    """3-D events with per-coordinate scales: in the frame (e, e_perp1, e_perp2) of the whitened
    target the coordinates are i.i.d. N(0, 1). Chi-square on 4 x 4 x 4 = 64 equiprobable cells
    (power 0.99 at binned TV >= 0.03)."""
    N = 40_000
    assert N >= min_samples(0.03, 64)
    m_p, m_q, s = np.array([0.5, -0.2, 1.0]), np.array([0.0, 0.3, 0.4]), np.array([1.0, 0.5, 2.0])
    y, _ = speculate.speculative_sample(
        speculate.Normal(np.tile(m_p, (N, 1)), np.tile(s, (N, 1)), batch_ndims=1),
        speculate.Normal(np.tile(m_q, (N, 1)), np.tile(s, (N, 1)), batch_ndims=1), rng=9)
    w = (y - m_p) / s
    e = (m_p - m_q) / s
    basis, _ = np.linalg.qr(np.stack([e, [1.0, 0, 0], [0, 1.0, 0]], axis=1))  # orthonormal, e first
    coords = w @ basis  # [N, 3] i.i.d. N(0, 1) under the target
    edges = stats.norm.ppf([0.25, 0.5, 0.75])
    cell = (np.searchsorted(edges, coords) * np.array([16, 4, 1])).sum(axis=1)
    chi2_gof(np.bincount(cell, minlength=64), np.full(64, 1 / 64), 0.03, "reflection 3-D")
    assert math.isclose(float(np.linalg.norm(basis[:, 0] @ e)), float(np.linalg.norm(e)))


def test_library_gaussian_chain_through_the_round_loop():
    """speculate.chains with Normal transitions (the round loop's reflection path, K = 2):
    target x' ~ N(0.8 x, 1), draft x' ~ N(0.5 x + 0.1, 1). Under the target the standardised
    innovations e_t = x_t - 0.8 x_(t-1) of the first 3 steps are i.i.d. N(0, 1): chi-square on
    the 3 x 3 x 3 tercile cells (level 1e-6; 9 500 chains: power 0.99 at binned TV >= 0.05)."""
    B = 9_500
    assert B >= min_samples(0.05, 27)

    def target(states):
        x = np.asarray(states, dtype=float)
        return speculate.Normal(0.8 * x, np.ones(len(x)), batch_ndims=1)

    @speculate.batched
    def draft(states):
        x = np.asarray(states, dtype=float)
        return speculate.Normal(0.5 * x + 0.1, np.ones(len(x)), batch_ndims=1)

    res = speculate.chains(target, draft, lambda x, y: float(y), [0.0] * B, n=3, lookahead=2,
                           rng=21)
    x = np.array(res.samples, dtype=float)  # [B, 3]
    e = x - 0.8 * np.concatenate([np.zeros((B, 1)), x[:, :-1]], axis=1)
    t = np.searchsorted(stats.norm.ppf([1 / 3, 2 / 3]), e)  # [B, 3] terciles
    cell = t @ np.array([9, 3, 1])
    chi2_gof(np.bincount(cell, minlength=27), np.full(27, 1 / 27), 0.05, "Gaussian chain")
    assert res.stats.accepted < res.stats.proposed  # both branches of the rule were exercised
