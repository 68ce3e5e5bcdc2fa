"""distill_policy: a small draft learns the expensive policy's action distributions (deterministic:
seeded rollouts, seeded torch)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from speculate.domains.rl import distill_policy
from speculate.domains.rl.distill import acceptance
from speculate.domains.rl.models import GaussianMLPPolicy, MLPPolicy


@pytest.mark.parametrize("loss", ["kl", "tv"])
def test_distill_raises_acceptance_on_cartpole(loss: str) -> None:
    torch.manual_seed(0)
    teacher = MLPPolicy(4, 2, hidden=(64, 64), temperature=0.5).eval()
    student = MLPPolicy(4, 2, hidden=(16,))
    rep = distill_policy(teacher, student, lambda: gym.make("CartPole-v1"), episodes=8, max_steps=200,
                         steps=300, loss=loss, rng=0)
    assert rep.train_states > 100 and rep.heldout_states > 20
    assert rep.acceptance_after > rep.acceptance_before + 0.05, rep
    assert rep.acceptance_after > 0.85, rep
    assert not student.training


def test_distill_gaussian_draft_on_pendulum() -> None:
    torch.manual_seed(1)
    teacher = GaussianMLPPolicy(3, 1, hidden=(32,), std=0.4).eval()
    student = GaussianMLPPolicy(3, 1, hidden=(16,), std=0.4)
    rep = distill_policy(teacher, student, gym.make("Pendulum-v1"), episodes=3, max_steps=100, steps=300, rng=0)
    assert rep.acceptance_after > max(rep.acceptance_before, 0.8), rep


def test_acceptance_is_one_for_identical_policies_and_errors() -> None:
    pi = MLPPolicy(4, 2).eval()
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    assert acceptance(pi, pi, x, gym.make("CartPole-v1").action_space) == pytest.approx(1.0)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        distill_policy(pi, lambda o: o, lambda: gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="loss"):
        distill_policy(pi, MLPPolicy(4, 2), lambda: gym.make("CartPole-v1"), loss="js")


def test_behaviour_clone_fits_the_soft_linear_teacher() -> None:
    from speculate.domains.rl.cartpole import CARTPOLE_SCALE, SoftLinearPolicy, behaviour_clone

    torch.manual_seed(0)
    teacher = SoftLinearPolicy([0.05, -0.07, 0.91, 0.40], temperature=0.05)
    model = MLPPolicy(4, 2, hidden=(32,), obs_scale=CARTPOLE_SCALE)
    log = behaviour_clone(teacher, model, episodes=4, steps=300, lr=3e-3, rng=0, log_every=100)
    assert log[-1]["cross_entropy"] < log[0]["cross_entropy"]
    x = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32) * np.float32(0.05)
    assert acceptance(teacher, model, x, gym.make("CartPole-v1").action_space) > 0.9
    assert not model.training


@pytest.mark.slow
def test_demo_runs(capsys) -> None:
    from speculate.domains.rl.demo import demo

    assert demo(["--quick", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "alpha" in out
