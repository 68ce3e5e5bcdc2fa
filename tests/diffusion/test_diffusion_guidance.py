"""Classifier-free guidance: the target is the guided mean, eps_u + w (eps_c - eps_u); it is exact.

Fixture: class-conditional Gaussian data in D = 3 (label 0: N(m_0, 0.3^2 I), label 1: N(m_1, 0.4^2 I),
the null label 2: N(0, I)), exact class-conditional denoisers (marginal_law.ClassConditional), guidance
w = 2.5, DDPM T = 30, rows alternating labels 0 and 1 in one batch (30000 samples per label). The
guided eps of Gaussian classes is affine in x, so the guided chain's law is closed form
(``affine_chain_law(sched, guided(cond, uncond, w))``); speculative guided sampling is checked
against it at t = 15 and 0 for each label (goodness of fit: KS of the standardised states on the 3
coordinates, 16 projections and pooled) and against plain guided ``sample`` at t = 0 for each
label (two-sample KS): 6 checks at ALPHA / 6. Drafts: "frozen" and a poor class-conditional denoiser
(guided too, with the same scale), and under ``-m slow`` its frozen correction. Power 0.99 against a
KS distance of 0.016 (pooled), 0.028 (a coordinate or projection) and 0.039 (two-sample), asserted
below.
"""

from __future__ import annotations

import numpy as np
import pytest
from diffusion_helpers import assert_chain_law, assert_same_law, gof_power_distance, same_law_power_distance
from speculate.domains.diffusion import DDPM, frozen_correction, sample, speculative_sample
from speculate.domains.diffusion.marginal_law import ClassConditional, GaussianData, affine_chain_law, guided

from speculate.testing import DEFAULT_ALPHA as ALPHA

SCHED = DDPM(timesteps=30)
LAWS = {0: GaussianData([1.0, 0.0, -1.0], 0.3), 1: GaussianData([-1.0, 1.0, 0.0], 0.4), 2: GaussianData([0.0] * 3, 1.0)}
OTHER = {0: GaussianData([0.0, 0.0, 0.0], 0.6), 1: GaussianData([0.0, 0.5, 0.5], 0.6), 2: GaussianData([0.5] * 3, 0.8)}
W, NULL, PER_LABEL = 2.5, 2, 30_000
LABELS = np.tile([0, 1], PER_LABEL)


def _check(res, plain, name):
    for y in (0, 1):
        law = affine_chain_law(SCHED, guided(LAWS[y], LAWS[NULL], W))
        for t in (15, 0):
            assert_chain_law(res.path[t][LABELS == y], law, t, ALPHA / 6, label=f"{name}, label {y}, t = {t}")
        assert_same_law(res.path[0][LABELS == y], plain.path[0][LABELS == y], ALPHA / 6, label=f"{name}, label {y}")


@pytest.fixture(scope="module")
def plain():
    return sample(SCHED, ClassConditional(LAWS, SCHED), (2 * PER_LABEL, 3), labels=LABELS, guidance=W,
                  null_label=NULL, record=(15, 0), rng=10)


@pytest.mark.parametrize("draft", ["frozen", "poor", pytest.param("corrected", marks=pytest.mark.slow)])
def test_guided_sampling_is_exact(draft, plain):
    target = ClassConditional(LAWS, SCHED)
    d = {"frozen": "frozen", "poor": ClassConditional(OTHER, SCHED),
         "corrected": frozen_correction(ClassConditional(OTHER, SCHED))}[draft]
    res = speculative_sample(SCHED, target, d, (2 * PER_LABEL, 3), lookahead=4, labels=LABELS, guidance=W,
                             null_label=NULL, record=(15, 0), rng=11)
    s = res.stats
    assert 0 < s.accepted < s.proposed
    assert target.calls == s.target_calls == s.rounds  # ONE call per round, both halves inside it
    assert s.target_evaluations % 2 == 0 and s.target_evaluations >= 2 * (2 * PER_LABEL) * s.steps * s.calls_per_step
    if draft != "frozen":
        assert s.draft_evaluations > 0 and s.draft_evaluations % 2 == 0
    _check(res, plain, draft)


def test_plain_guided_sampling_follows_the_guided_law(plain):
    for y in (0, 1):
        law = affine_chain_law(SCHED, guided(LAWS[y], LAWS[NULL], W))
        assert_chain_law(plain.path[0][LABELS == y], law, 0, ALPHA / 2, label=f"plain guided, label {y}")


def test_guidance_is_the_guided_mean_not_the_conditional_one():
    """Guided and conditional chains differ (the guided law is not the conditional law), and w = 1 is
    the conditional model (same samples from the same seed)."""
    target = ClassConditional(LAWS, SCHED)
    cond = sample(SCHED, target, (64, 3), labels=0, rng=1).x
    one = sample(SCHED, target, (64, 3), labels=0, guidance=1.0, null_label=NULL, rng=1).x
    np.testing.assert_allclose(one, cond, rtol=1e-10, atol=1e-10)
    g, c = (affine_chain_law(SCHED, law).marginal(0) for law in (guided(LAWS[0], LAWS[NULL], W), LAWS[0]))
    assert np.abs(g[0] - c[0]).max() > 0.05


def test_power():
    n = PER_LABEL
    assert gof_power_distance(n * 3, 3, ALPHA / 6) <= 0.016
    assert gof_power_distance(n, 3, ALPHA / 6) <= 0.028
    assert same_law_power_distance(n, 3, ALPHA / 6) <= 0.039
