"""Acceptance by time step against theory, and the per-step counters of DiffusionStats.

A draft whose eps differs from the target's by the same vector at every state: the exact
denoisers of N(m, s^2 I) (target) and N(m', s^2 I) (draft) differ by c_t sqrt(ab_t) (m - m') with
c_t = sqrt(1 - ab_t) / (ab_t s^2 + 1 - ab_t), whatever x, so the step means differ by
b_t c_t sqrt(ab_t) (m - m') and reflection coupling keeps a drafted step at time t with probability
alpha_t = 2 Phi(-delta_t / 2), delta_t = |b_t| c_t sqrt(ab_t) |m - m'| / sigma_t, independently of
everything before it. DDPM T = 30 (sigma_t and delta_t vary along the chain: alpha_t from 0.85
to 1.0), 10000 samples at each of lookahead 3, 4 and 5 (with one k the samples move in step and
every (k+1)-th step is mostly the verifier's bonus draw, never drafted; three periods cover every
step): at each of the 29 stochastic steps the kept drafts among the tested ones
(``accepted_by_step``, ``accepted_by_step + rejected_by_step``, summed over the three runs) are
binomial with alpha_t (fresh uniforms); two-sided binomial tests at ALPHA / 29 each. Power
(asserted): every step is tested >= 9000 times, so each test catches an error of 0.045 in alpha_t
with probability >= 0.99 (normal approximation, the variance at alpha = 1/2 as the worst case).
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st
from speculate.domains.diffusion import DDPM, speculative_sample
from speculate.domains.diffusion.marginal_law import GaussianData

from speculate.testing import DEFAULT_ALPHA as ALPHA

SCHED = DDPM(timesteps=30)
TARGET = GaussianData([1.0, -0.5], 0.5)
DRAFT = GaussianData([1.5, -0.3], 0.5)  # the same std: a constant eps difference
N = 10_000


def alpha_theory() -> np.ndarray:
    p = SCHED.plan()
    ab, s = p.alpha_bar, TARGET.std
    c = np.sqrt(1 - ab) / (ab * s**2 + 1 - ab)
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = np.abs(p.b) * c * np.sqrt(ab) * np.linalg.norm(TARGET.mean - DRAFT.mean) / p.sigma
    return 2 * st.norm.cdf(-delta / 2)


def test_acceptance_by_time_step_is_2_phi_of_minus_half_delta():
    runs = [speculative_sample(SCHED, TARGET.denoiser(SCHED), DRAFT.denoiser(SCHED), (N, 2), lookahead=k, rng=k).stats
            for k in (3, 4, 5)]
    s = runs[0]
    want = alpha_theory()[:-1]  # the last step is deterministic: never drafted
    acc = sum(r.accepted_by_step for r in runs)[:-1]
    tested = acc + sum(r.rejected_by_step for r in runs)[:-1]
    assert want.min() < 0.86 and want.max() > 0.999  # alpha_t varies along the chain
    assert tested.min() >= 9000 and all(r.proposed_by_step[-1] == 0 for r in runs)
    m = len(want)
    for i in range(m):
        p = st.binomtest(int(acc[i]), int(tested[i]), float(want[i])).pvalue
        assert p * m >= ALPHA, (f"step {i} (t = {s.step_times[i]}): kept {acc[i]} of {tested[i]} "
                                f"= {acc[i] / tested[i]:.4f}, theory {want[i]:.4f}, p = {p:.3g}")
    np.testing.assert_allclose(acc / tested, want, atol=0.03)
    z = st.norm.isf(ALPHA / m / 2)  # the power of each test against an error of 0.045
    assert st.norm.cdf(0.045 * np.sqrt(9000) / 0.5 - z) >= 0.99


def test_the_per_step_counters_add_up():
    for lookahead in (4, "auto"):
        res = speculative_sample(SCHED, TARGET.denoiser(SCHED), DRAFT.denoiser(SCHED), (64, 2), lookahead=lookahead,
                                 rng=1)
        s = res.stats
        assert s.proposed_by_step.sum() == s.proposed and s.accepted_by_step.sum() == s.accepted
        assert s.rejected_by_step.sum() == s.rejections and s.rounds_by_step.sum() == s.row_rounds
        assert np.all(s.accepted_by_step + s.rejected_by_step <= s.proposed_by_step)
        k = s.lookahead_at_step[np.isfinite(s.lookahead_at_step)]
        if lookahead == 4:  # every round has k = 4 but the last ones (capped at the steps still needed)
            assert np.all(k <= 4) and np.mean(k == 4) > 0.5
        assert list(s.as_dict()["lookahead_at_step"]) and len(s.as_dict()["acceptance_by_step"]) == s.steps


def test_stats_of_disjoint_samples_merge():
    """Sharded runs merge their stats: counters and per-step counts add up, the steps per sample
    and the plan's times (labels) do not."""
    from speculate.domains.diffusion import DiffusionStats

    times = np.array([3, 2, 1])
    a = DiffusionStats(steps=3, samples=2, step_times=times.copy(), accepted_by_step=np.array([1, 0, 2]))
    b = DiffusionStats(steps=3, samples=5, step_times=times.copy(), accepted_by_step=np.array([0, 4, 1]))
    m = a + b
    assert type(m) is DiffusionStats and (m.steps, m.samples) == (3, 7)
    assert m.step_times.tolist() == [3, 2, 1] and m.accepted_by_step.tolist() == [1, 4, 3]
