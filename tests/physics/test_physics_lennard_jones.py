"""Lennard-Jones fluid: speculative and plain runs agree (two-sample tests over replicas).

B independent replicas start from the same fcc lattice (density 0.8, kT = 1, dt = 1e-4) and run
T steps, speculatively and plainly. Per replica at step T: the potential energy and the pair
counts in three shells of g(r) (the first peak, the first minimum, the rest up to L/2): i.i.d.
over replicas, compared with speculate.testing.assert_same_continuous (two-sample KS on each of
the 4 features and 16 random projections, Bonferroni inside; conservative for integer counts),
plus a KS test of every standardised step of the speculative run against N(0, 1). Two checks
per run at ALPHA / 2 each (speculate.testing.DEFAULT_ALPHA in all). Power: with B = 512 replicas each two-sample KS test
(at level ALPHA / 2 / 20) catches a KS distance of 0.35 (a shift of 0.93 standard deviations of a
Gaussian feature) with probability >= 0.99 (DKW bound: 4 exp(-n eps^2 / 2) <= 0.01 on top of
the critical value); the per-step KS test, with 2 million steps, catches a per-step law at KS
distance 0.0032.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from speculate.domains.physics import (
    Langevin,
    LennardJones,
    fcc_lattice,
    frozen_correction,
    radial_distribution,
    simulate,
    speculative_simulate,
)
from speculate.domains.physics.checks import innovations

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_continuous_matches, assert_same_continuous, ks_power_bound


def features(X, lj):
    """Per replica: (energy, pair counts in 3 shells) -> [B, 4]."""
    _, _, counts = radial_distribution(X, lj.box, nbins=60)           # [B, 60], r < L/2
    edges = np.linspace(0, lj.box / 2, 61)
    shells = np.searchsorted(edges[1:], [1.05, 1.3], side="right")   # bin indices of shell ends
    c = np.stack([counts[:, : shells[0]].sum(1), counts[:, shells[0] : shells[1]].sum(1),
                  counts[:, shells[1] :].sum(1)], axis=1)
    return np.column_stack([lj.energy(X), c])


def compare(n_cells, B, steps, draft_kind, rc, lookahead=4):
    x0, L = fcc_lattice(n_cells, 0.8)
    exact = LennardJones(L)
    cheap = LennardJones(L, cutoff=rc, method="cells")
    draft = {"cells": cheap, "frozen": "frozen", "corrected": frozen_correction(cheap)}[draft_kind]
    model = Langevin(force=exact, draft_force=draft, dt=1e-4, kT=1.0)
    X0 = np.repeat(x0[None], B, axis=0)
    spec = speculative_simulate(model, X0, steps, lookahead=lookahead, rng=21)
    plain = simulate(model, X0, steps, rng=22)
    assert 0 < spec.stats.accepted < spec.stats.proposed
    fs, fp = features(spec.final, exact), features(plain.final, exact)
    label = f"LJ N={x0.shape[0]}, draft {draft_kind}: (energy, 3 shell counts)"
    assert_same_continuous(fs, fp, alpha=ALPHA / 2, label=label)
    z = innovations(model, spec.positions).ravel()
    assert_continuous_matches(z, stats.norm, alpha=ALPHA / 2, label="standardised steps")
    return spec


def test_lj_speculative_matches_plain_small():
    # N = 32 (L = 3.42, exact cutoff 1.71), cell-list draft at rc = 1.1 (3 cells per side)
    spec = compare(n_cells=2, B=512, steps=40, draft_kind="cells", rc=1.1)
    assert spec.stats.calls_per_step < 0.6


def test_lj_tests_have_power():
    n, per_test = 512, ALPHA / 2 / 20                                  # 4 features + 16 projections
    c = np.sqrt(np.log(2 / per_test) / 2) * np.sqrt(2 / n)         # two-sample KS critical value
    eps = 2 * np.sqrt(np.log(400) / (2 * n))                       # each ECDF within eps/2 w.p. .995
    assert c + eps <= 0.35
    assert 2 * stats.norm.cdf(0.93 / 2) - 1 >= 0.35                 # a 0.93 sd shift is that far
    assert ks_power_bound(512 * 40 * 32 * 3, 0.0032, alpha=ALPHA / 2) >= 0.99


def test_lj_force_is_batch_invariant():
    x0, L = fcc_lattice(2, 0.8)
    X = x0[None] + 0.05 * np.random.default_rng(0).standard_normal((7, *x0.shape))
    for lj in (LennardJones(L), LennardJones(L, cutoff=1.1, method="cells")):
        F = lj(X)
        for b in (0, 3, 6):
            np.testing.assert_array_equal(F[b], lj(X[b : b + 1])[0])


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["cells", "frozen", "corrected"])
def test_lj_speculative_matches_plain_108(draft_kind):
    compare(n_cells=3, B=512, steps=60, draft_kind=draft_kind, rc=1.5)
