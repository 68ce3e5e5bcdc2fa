"""The samplers (DDPM, stochastic DDIM, VP-SDE Euler-Maruyama), per-step scales, the end of the chain.

Closed forms first: the schedules' coefficients against the formulas they implement (DDIM with
eta = 1 over every time is DDPM with the posterior variance; the last step of every sampler is
deterministic; x_0 and v predictions give the same chain as eps). Then exactness where the step
scales vary strongly and where drafted blocks reach the end of the chain, on Gaussian data in
D = 4 (the exact chain law is closed form, marginal_law.affine_chain_law):

* a geometric schedule, betas 1e-4 .. 0.9 over T = 30 (sigma_t from 0.012 to 0.95: an 80-fold range of
  per-position scales within one drafted block), lookahead 6, with the frozen and a poor draft; the
  cosine schedule with the posterior variance;
* DDIM (eta = 0.6, 12 of 300 times), VP-SDE Euler-Maruyama (15 of 300 times, with and without the
  final noise removal), x_0 prediction;
* a 6-step chain with lookahead 8 and 20: every block reaches t = 0 (the loop caps k at need - 1;
  the deterministic last step is the verifier's draw there).

Each exactness test: goodness of fit of x_t at 2 or 3 recorded times to the exact law (KS of the
standardised states on the coordinates, 16 projections and pooled, Bonferroni inside), at ALPHA / m
for m times, 30000 samples: power 0.99 against a KS distance of 0.014 (pooled) and 0.028 (one
coordinate or projection), asserted in test_power.
"""

from __future__ import annotations

import numpy as np
import pytest
from diffusion_helpers import assert_chain_law, gof_power_distance
from speculate.domains.diffusion import DDIM, DDPM, VPSDE, frozen_correction, sample, speculative_sample
from speculate.domains.diffusion.marginal_law import GaussianData, affine_chain_law

from speculate.testing import DEFAULT_ALPHA as ALPHA

N, D = 30_000, 4
DATA = GaussianData(mean=[1.0, -1.0, 0.5, 0.0], std=0.4)
POOR = GaussianData(mean=[-1.0, 1.0, 0.0, 0.5], std=0.8)


def test_ddim_with_eta_1_over_every_time_is_ddpm_with_the_posterior_variance():
    a = DDIM(timesteps=50, steps=50, eta=1.0).plan()
    b = DDPM(timesteps=50, variance="posterior").plan()
    np.testing.assert_array_equal(a.times, b.times)
    for f in ("a", "b", "sigma"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-10, atol=1e-12)


def test_ddpm_coefficients_are_ho_et_al():
    sched = DDPM(timesteps=10, schedule="cosine")
    p = sched.plan()
    t = 4
    i = int(np.flatnonzero(p.times == t)[0])
    beta, ab = sched.betas[t - 1], sched.alpha_bar[t]
    assert p.a[i] == pytest.approx(1 / np.sqrt(1 - beta))
    assert p.b[i] == pytest.approx(-beta / np.sqrt(1 - beta) / np.sqrt(1 - ab))
    assert p.sigma[i] == pytest.approx(np.sqrt(beta))
    assert p.times.tolist() == list(range(10, 0, -1)) and p.sigma[-1] == 0.0
    assert np.all(p.sigma[:-1] > 0)


def test_every_sampler_ends_with_a_deterministic_step():
    for s in (DDPM(timesteps=20), DDPM(timesteps=20, variance="posterior"), DDIM(timesteps=20, steps=5, eta=0.5),
              VPSDE(timesteps=20, steps=7)):
        p = s.plan()
        assert p.sigma[-1] == 0.0 and np.all(p.sigma[:-1] > 0), s
        assert p.times[0] == 20 and p.times[-1] >= 1 and np.all(np.diff(p.times) < 0)
    assert VPSDE(timesteps=20, steps=7, denoise=False).plan().sigma.min() > 0
    assert np.all(DDIM(timesteps=20, steps=5, eta=0.0).plan().sigma == 0)


def test_the_three_predictions_give_the_same_chain():
    """The exact denoiser predicting eps, x_0 or v: the same samples from the same seed (to rounding)."""
    out = []
    for pred in ("eps", "x0", "v"):
        sched = DDPM(timesteps=30, prediction=pred)
        out.append(sample(sched, DATA.denoiser(sched), (64, D), rng=3).x)
    np.testing.assert_allclose(out[1], out[0], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(out[2], out[0], rtol=1e-8, atol=1e-8)


GEOMETRIC = np.geomspace(1e-4, 0.9, 30)  # beta_1 = 1e-4 .. beta_30 = 0.9


def test_the_geometric_schedule_scales_vary_strongly():
    sigma = DDPM(betas=GEOMETRIC).plan().sigma[:-1]
    assert sigma.max() / sigma.min() > 80


CASES = {
    "geometric T=30, lookahead 6": (DDPM(betas=GEOMETRIC), "frozen", 6, (20, 5, 0)),
    "geometric T=30, poor draft": (DDPM(betas=GEOMETRIC), "poor", 6, (20, 5, 0)),
    "cosine, posterior variance": (DDPM(timesteps=30, schedule="cosine", variance="posterior"), "corrected", 5, (0,)),
    "DDIM eta=0.6": (DDIM(timesteps=300, steps=12, eta=0.6), "corrected", 4, (0,)),
    "VP-SDE, noise removal": (VPSDE(timesteps=300, steps=15), "frozen", 5, (0,)),
    "VP-SDE, no noise removal": (VPSDE(timesteps=300, steps=15, denoise=False), "poor", 5, (0,)),
    "x0 prediction": (DDPM(timesteps=20, prediction="x0"), "frozen-x0", 4, (10, 0)),
    "6 steps, lookahead 8": (DDPM(timesteps=6), "poor", 8, (3, 1, 0)),
    "6 steps, lookahead 20": (DDPM(timesteps=6), "frozen", 20, (3, 1, 0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_exact_law_with_varying_scales_and_blocks_reaching_the_end(name):
    sched, draft, k, times = CASES[name]
    if name.startswith("DDIM"):
        times = (int(sched.plan().times[4]), *times)
    if name.startswith("VP-SDE"):
        times = (int(sched.plan().times[7]), *times)
    d = {"frozen": "frozen", "frozen-x0": "frozen-x0", "poor": POOR.denoiser(sched),
         "corrected": frozen_correction(POOR.denoiser(sched))}[draft]
    res = speculative_sample(sched, DATA.denoiser(sched), d, (N, D), lookahead=k, record=times, rng=2)
    s = res.stats
    assert 0 < s.accepted < s.proposed
    law = affine_chain_law(sched, DATA)
    for t in times:
        assert_chain_law(res.path[t], law, t, ALPHA / len(times), label=f"{name}, t = {t}")
    if name.startswith("6 steps"):  # every block that drafts can reach the end; the loop caps k at need - 1
        assert max(s.lookahead_counts) <= 5 and s.proposed_by_step[-1] == 0  # the deterministic step: never drafted
        assert s.accepted_by_step[-2] > 0  # drafted steps into t = 1 kept, then the verifier's t = 0


def test_deterministic_ddim_runs_step_by_step_and_equals_plain():
    """eta = 0: every step is a point mass, nothing is drafted; the result is plain sampling's."""
    sched = DDIM(timesteps=100, steps=10, eta=0.0)
    target = DATA.denoiser(sched)
    plain = sample(sched, target, (32, D), rng=5)
    spec = speculative_sample(sched, target, "frozen", (32, D), lookahead=8, rng=5)
    np.testing.assert_allclose(spec.x, plain.x, rtol=1e-12, atol=1e-12)
    assert spec.stats.target_calls == 10 and spec.stats.proposed == 0


def test_power():
    for m in (2, 3):
        assert gof_power_distance(N * D, D, ALPHA / m) <= 0.014
        assert gof_power_distance(N, D, ALPHA / m) <= 0.028
