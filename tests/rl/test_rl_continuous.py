"""Continuous actions: Pendulum with Normal policies, speculative vs plain rollouts (two-sample tests).

Target: mean = 2 tanh(W x + b) with a fixed std; draft: perturbed W, b. With equal stds the core
verifies by reflection maximal coupling (constant time); with unequal stds by the general rule
(accept min(1, p/q), residual by rejection from p). For each, n episodes of speculative and of plain
rollouts are compared on the joint vector (a_1, o_1, a_4, o_4, a_8, o_8) (14 coordinates) with
``assert_same_continuous`` (Kolmogorov-Smirnov on every coordinate and 16 random projections,
Bonferroni-corrected). Level alpha = speculate.testing.DEFAULT_ALPHA (1e-6) per check; power: a
shift of the sup-distance between the CDFs of any coordinate or projection by ``D`` (asserted below)
is caught with probability >= 99%.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from speculate.domains.rl import rollouts, speculative_rollouts

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_same_continuous, ks_sample_size

STEPS = (0, 3, 7)  # a_1/o_1, a_4/o_4, a_8/o_8 (0-based action index)


class LinearGaussian:
    """Normal policy for Pendulum: mean 2 tanh(W obs + b) [N, 1], a fixed std."""

    def __init__(self, W: np.ndarray, b: np.ndarray, std: float) -> None:
        self.W, self.b, self.std = W, b, std

    def __call__(self, obs: np.ndarray):
        mean = 2.0 * np.tanh(obs @ self.W.T + self.b)  # [N, 1]
        return mean, np.full_like(mean, self.std)


def _policies(draft_std: float):
    rng = np.random.default_rng(7)
    W, b = rng.normal(size=(1, 3)), rng.normal(size=1)
    target = LinearGaussian(W, b, 0.6)
    draft = LinearGaussian(W + 0.3 * rng.normal(size=(1, 3)), b + 0.2, draft_std)
    return target, draft


def _features(out) -> np.ndarray:
    rows = []
    for t in out:
        assert len(t) >= STEPS[-1] + 1  # Pendulum never terminates early
        rows.append(np.concatenate([np.r_[t.actions[i], t.observations[i + 1]] for i in STEPS]))
    return np.asarray(rows, dtype=np.float64)  # [n, 4 * len(STEPS)]


def _sample(fn, n: int, seed: int) -> np.ndarray:
    envs = [gym.make("Pendulum-v1") for _ in range(500)]
    feats = []
    for call in range(-(-n // len(envs))):
        feats.append(_features(fn(envs, seed * 10_007 + call)))
    return np.concatenate(feats)[:n]


PATHS = [(0.6, "reflection coupling"), (0.8, "general rule")]
ROUTES = {"reflection coupling": "gaussian", "general rule": "general"}  # Stats.routes' names


def _compare(draft_std: float, path: str, n: int, d: float) -> None:
    # two-sample KS at level ALPHA / (coordinates + projections): n per sample must reach 2x the
    # one-sample size (ks_sample_size's convention)
    n_checks = 4 * len(STEPS) + 16
    assert 2 * ks_sample_size(d, alpha=ALPHA / n_checks) <= n, "not enough samples for the stated power"
    target, draft = _policies(draft_std)
    spec = _sample(lambda envs, s: speculative_rollouts(envs, target, draft, max_steps=STEPS[-1] + 1,
                                                        lookahead=4, rng=s), n, seed=1)
    plain = _sample(lambda envs, s: rollouts(envs, target, max_steps=STEPS[-1] + 1, rng=s), n, seed=2)
    assert_same_continuous(spec, plain, alpha=ALPHA, label=f"Pendulum, {path}")


@pytest.mark.parametrize(("draft_std", "path"), PATHS)
def test_pendulum_speculative_matches_plain(draft_std: float, path: str) -> None:
    """n = 2000 episodes each: catches a CDF sup-distance of 0.16 (a mean shift of ~0.4 sd)."""
    _compare(draft_std, path, n=2000, d=0.16)


@pytest.mark.slow
@pytest.mark.parametrize(("draft_std", "path"), PATHS)
def test_pendulum_speculative_matches_plain_slow(draft_std: float, path: str) -> None:
    """n = 20000 episodes each: catches a CDF sup-distance of 0.05 (a mean shift of ~0.13 sd)."""
    _compare(draft_std, path, n=20_000, d=0.05)


def test_pendulum_acceptance_is_plausible() -> None:
    """The drafts are neither always kept nor always rejected, so both branches of the rule run."""
    target, draft = _policies(0.6)
    out = speculative_rollouts([gym.make("Pendulum-v1") for _ in range(50)], target, draft,
                               max_steps=30, lookahead=4, rng=0)
    assert 0.3 < out.stats.acceptance_rate < 0.98
    assert out.stats.rejections > 0 and out.stats.accepted > 0


@pytest.mark.parametrize(("draft_std", "path"), PATHS)
def test_each_path_is_the_one_taken(draft_std: float, path: str) -> None:
    """Both paths are exact, so the law cannot tell them apart: count which one verified (the
    round loop's ``stats.routes``). Rows near max_steps draft fewer steps (padding), which must not
    push equal stds to the general rule."""
    target, draft = _policies(draft_std)
    out = speculative_rollouts([gym.make("Pendulum-v1") for _ in range(20)], target, draft,
                               max_steps=11, lookahead=4, rng=0)
    assert out.stats.routes.get(ROUTES[path], 0) == out.stats.rounds
    assert sum(out.stats.routes.values()) == out.stats.rounds
    assert any(len(t) == 11 for t in out)  # the rows reached max_steps: some rounds were padded
