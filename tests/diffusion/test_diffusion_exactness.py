"""speculative_sample samples exactly the chain of plain sampling with the target denoiser.

Data whose score is known in closed form, so the exact denoiser is a formula (marginal_law):

* Gaussian data N(m, 0.3^2 I) in D = 4: the exact eps is affine in x, so along the chain every x_t
  is Gaussian with a closed-form mean and variance (``affine_chain_law``, exact for the discretised
  chain). DDPM with T = 40 (linear betas scaled to T: beta from 0.0025 to 0.5, so the step scales
  vary 14-fold), lookahead 4, 40000 samples. At t = 30, 15, 5 and 0: goodness of fit of x_t to the
  exact law (KS of the standardised states on the 4 coordinates, 16 random projections and all
  coordinates pooled) and a two-sample test against plain ``sample`` (KS on coordinates and 16
  projections). 8 checks per test at ALPHA / 8, Bonferroni inside each (ALPHA =
  speculate.testing.DEFAULT_ALPHA). Drafts: "frozen" with ``lookahead="auto"`` and a deliberately
  poor denoiser (the exact denoiser of other data: most drafts rejected, so the reflection path
  carries the run); its frozen correction under ``-m slow`` (and in test_diffusion_samplers).
* a Gaussian mixture (3 components in D = 2: a nonlinear denoiser), DDPM T = 60, lookahead 5,
  40000 samples: two-sample tests against plain sampling at t = 40, 10 and 0 (3 checks at ALPHA / 3),
  for "frozen-x0" and the poor draft (its frozen correction under ``-m slow``).
Every run keeps and rejects drafts (asserted).

Power (asserted in test_the_exactness_tests_have_power, DKW bounds, probability >= 0.99 each): the
goodness-of-fit check catches a deviation of KS distance 0.012 of the pooled law (a 5.1% error in
the standard deviation of x_t moves the normal CDF by 0.012) and 0.024 of one coordinate's or
projection's; the two-sample checks one of 0.034 (Gaussian) and 0.033 (mixture, both 40000 vs
40000). A plain sampler whose eps is 3% too large is caught (test_a_biased_sampler_is_caught).
Under ``-m slow`` the Gaussian checks run on 240000 samples for every draft kind ("frozen" and
"frozen-x0" at lookahead 4 too): pooled 0.0049, coordinates 0.0098, two-sample 0.0138.
"""

from __future__ import annotations

import numpy as np
import pytest
from diffusion_helpers import (
    assert_chain_law,
    assert_same_law,
    gof_power_distance,
    same_law_power_distance,
)
from speculate.domains.diffusion import DDPM, frozen_correction, sample, speculative_sample
from speculate.domains.diffusion.marginal_law import GaussianData, GaussianMixture, affine_chain_law

from speculate.testing import DEFAULT_ALPHA as ALPHA

N, SLOW_N, D = 40_000, 240_000, 4
TIMES = (30, 15, 5, 0)
SCHED = DDPM(timesteps=40)
DATA = GaussianData(mean=np.linspace(-1.5, 1.5, D), std=0.3)
POOR = GaussianData(mean=np.linspace(2.0, -2.0, D), std=1.0)  # a wrong data law: its exact denoiser is a poor draft

MIX = GaussianMixture(weights=[0.5, 0.3, 0.2], means=[[2.0, 0.0], [-1.0, 1.5], [-1.0, -1.5]], stds=[0.3, 0.5, 0.2])
MIX_SCHED = DDPM(timesteps=60)
MIX_N, MIX_TIMES = 40_000, (40, 10, 0)


def drafts(sched, poor):
    return {"frozen": "frozen", "frozen-x0": "frozen-x0", "poor": poor.denoiser(sched),
            "corrected": frozen_correction(poor.denoiser(sched))}


@pytest.fixture(scope="module")
def plain_gaussian():
    return sample(SCHED, DATA.denoiser(SCHED), (N, D), record=TIMES, rng=1234).path


def check_gaussian(draft, lookahead, plain, n):
    law = affine_chain_law(SCHED, DATA)
    res = speculative_sample(SCHED, DATA.denoiser(SCHED), drafts(SCHED, POOR)[draft], (n, D), lookahead=lookahead,
                             record=TIMES, rng=7, cost_ratio=0.05)
    s = res.stats
    assert 0 < s.accepted < s.proposed and s.calls_per_step < 1
    if draft == "poor":
        assert s.acceptance_rate < 0.5  # mostly rejections: the reflection path carries the run
    for t in TIMES:
        assert_chain_law(res.path[t], law, t, ALPHA / 8, label=f"{draft}, lookahead {lookahead}")
        assert_same_law(res.path[t], plain[t], ALPHA / 8, label=f"{draft} vs plain at t = {t}")
    np.testing.assert_array_equal(res.path[0], res.x)


@pytest.mark.parametrize("draft, lookahead", [("frozen", "auto"), ("poor", 4)])
def test_gaussian_data_every_recorded_state_has_the_exact_law(draft, lookahead, plain_gaussian):
    check_gaussian(draft, lookahead, plain_gaussian, N)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["frozen", "frozen-x0", "poor", "corrected"])
def test_gaussian_data_exact_law_on_240000_samples(draft):
    plain = sample(SCHED, DATA.denoiser(SCHED), (SLOW_N, D), record=TIMES, rng=4321).path
    check_gaussian(draft, 4, plain, SLOW_N)


def test_plain_sampling_follows_the_exact_chain_law(plain_gaussian):
    """The reference itself: plain sampling against the closed-form law (4 checks at ALPHA / 4)."""
    law = affine_chain_law(SCHED, DATA)
    for t in TIMES:
        assert_chain_law(plain_gaussian[t], law, t, ALPHA / 4, label="plain")


@pytest.fixture(scope="module")
def plain_mixture():
    return sample(MIX_SCHED, MIX.denoiser(MIX_SCHED), (MIX_N, 2), record=MIX_TIMES, rng=4).path


@pytest.mark.parametrize("draft", ["frozen-x0", "poor", pytest.param("corrected", marks=pytest.mark.slow)])
def test_gaussian_mixture_speculative_and_plain_agree(draft, plain_mixture):
    poor = GaussianMixture([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [1.0, 0.5])
    target = MIX.denoiser(MIX_SCHED)
    d = {"frozen-x0": "frozen-x0", "poor": poor.denoiser(MIX_SCHED),
         "corrected": frozen_correction(poor.denoiser(MIX_SCHED))}[draft]
    spec = speculative_sample(MIX_SCHED, target, d, (MIX_N, 2), lookahead=5, record=MIX_TIMES, rng=3)
    assert 0 < spec.stats.accepted < spec.stats.proposed
    for t in MIX_TIMES:
        assert_same_law(spec.path[t], plain_mixture[t], ALPHA / 3, label=f"mixture, {draft}, t = {t}")


def test_the_exactness_tests_have_power():
    assert gof_power_distance(N * D, D, ALPHA / 8) <= 0.0121  # the pooled coordinates
    assert gof_power_distance(N, D, ALPHA / 8) <= 0.024  # a coordinate or a projection
    assert same_law_power_distance(N, D, ALPHA / 8) <= 0.0338
    assert same_law_power_distance(MIX_N, 2, ALPHA / 3) <= 0.0332
    assert gof_power_distance(SLOW_N * D, D, ALPHA / 8) <= 0.005
    assert gof_power_distance(SLOW_N, D, ALPHA / 8) <= 0.0099
    assert same_law_power_distance(SLOW_N, D, ALPHA / 8) <= 0.0139


class _Scaled:
    """eps * c: the planted error of the power check."""

    def __init__(self, fn, c):
        self.fn, self.c = fn, c

    def __call__(self, x, t):
        return self.c * self.fn(x, t)


def test_a_biased_sampler_is_caught():
    """The same check on plain sampling with eps 3% too large rejects (seeded)."""
    law = affine_chain_law(SCHED, DATA)
    wrong = sample(SCHED, _Scaled(DATA.denoiser(SCHED), 1.03), (N, D), dtype=np.float64, rng=5)
    with pytest.raises(AssertionError, match="does not follow the exact chain law"):
        assert_chain_law(wrong.x, law, 0, ALPHA / 8, label="biased")


def test_seeded_runs_are_reproducible():
    target = DATA.denoiser(SCHED)
    a = speculative_sample(SCHED, target, "frozen", (50, D), lookahead=4, rng=11)
    b = speculative_sample(SCHED, target, "frozen", (50, D), lookahead=4, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(a.x, b.x)
    c = speculative_sample(SCHED, target, "frozen", (50, D), lookahead=4, rng=12)
    assert not np.array_equal(a.x, c.x)
    x, y = (speculative_sample(SCHED, target, "frozen", (50, D), rng=None).x for _ in range(2))
    assert not np.array_equal(x, y)
    p, q = (sample(SCHED, target, (50, D), rng=3).x for _ in range(2))
    np.testing.assert_array_equal(p, q)
