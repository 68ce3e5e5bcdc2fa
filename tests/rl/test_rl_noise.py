"""Which randomness may be replayed: the tests catch the one mistake that biases block verification.

Restoring a snapshot replays the environment's random stream; that is exact for every rule
(proofs/05-chains.md, statement 3; the FrozenLake tests in test_rl_exactness.py run that way).
What must not be replayed under block verification is the draft's own sampling randomness
(statement 4): if the drafted action at absolute step t always came from the same coin c_t (for
example a draft that samples with the environment's generator, which the snapshot restores), then
the discarded draft that made block verification reject would come back in the next round.

The environment below makes statement 4's counterexample concrete (observation = the last action;
target pi(.|start) = (1/4, 3/4), pi(.|after 0) = (0, 1), pi(.|after 1) = (1/2, 1/2); uniform draft;
lookahead 2): with replayed draft coins the first two actions have law (1,0): 1/2, (1,1): 1/4,
(0,1): 1/4 instead of 3/8, 3/8, 1/4 (TV 1/8). The chi-square check (level
speculate.testing.DEFAULT_ALPHA = 1e-6) must reject that process and accept the real one;
token-wise verification stays exact even with replayed coins.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from speculate.domains.rl import TabularPolicy, speculative_rollouts
from speculate.domains.rl import api as api_module
from speculate.domains.rl.drafts import PolicyDraft
from speculate.domains.rl.trajectory_law import trajectory_key, trajectory_law

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, chi2_sample_size

PI = np.array([[0.25, 0.75], [0.0, 1.0], [0.5, 0.5]])
DRAFT = np.full((3, 2), 0.5)


class LastAction(gym.Env):
    """Observation: 0 at the start, then 1 + the last action. Toy-text style table P for exact laws."""

    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.Discrete(2)
    def __init__(self) -> None:
        self.P = {s: {a: [(1.0, 1 + a, 0.0, False)] for a in range(2)} for s in range(3)}
        self.initial_state_distrib = np.array([1.0, 0.0, 0.0])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return 0, {}

    def step(self, a):
        self.s = 1 + int(a)
        return self.s, 0.0, False, False, {}


_COINS = np.random.default_rng(12345)


class ReplayedDraftCoins(PolicyDraft):
    """The mistake: the drafted action at absolute step t of row r always uses the same uniform."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.coins = _COINS.random((len(self.policies), 64))  # [rows, absolute step]

    def sample(self, dist, rows, steps, rng):
        u = self.coins[rows, steps]  # replayed, not fresh
        cdf = np.cumsum(dist.probs, axis=1)  # [n, A]
        return np.minimum((cdf <= u[:, None]).sum(axis=1), dist.probs.shape[1] - 1)


def _keys(verify: str, n: int) -> list:
    envs = [LastAction() for _ in range(500)]
    keys: list = []
    call = 0
    while len(keys) < n:
        out = speculative_rollouts(envs, TabularPolicy(PI), TabularPolicy(DRAFT), max_steps=3, lookahead=2,
                                   verify=verify, rng=call)
        keys += [trajectory_key(t, 2) for t in out]
        call += 1
    return keys[:n]


N = 3000


def test_power_against_the_counterexample() -> None:
    assert chi2_sample_size(0.125, 3, alpha=ALPHA) <= N


@pytest.mark.parametrize("verify", ["block", "token"])
def test_fresh_draft_noise_is_exact(verify: str) -> None:
    law = trajectory_law(LastAction(), PI, steps=2)
    assert_categorical_matches(_keys(verify, N), law, alpha=ALPHA, label=verify)


def test_replayed_draft_noise_biases_block_and_is_caught(monkeypatch) -> None:
    law = trajectory_law(LastAction(), PI, steps=2)
    monkeypatch.setattr(api_module, "PolicyDraft", ReplayedDraftCoins)
    keys = _keys("block", N)
    with pytest.raises(AssertionError, match="do not follow the reference law"):
        assert_categorical_matches(keys, law, alpha=ALPHA)
    freq = keys.count((0, 1, 2, 0, 1)) / N
    assert abs(freq - 0.5) < 0.04  # the counterexample's 1/2 instead of 3/8
    # token-wise verification tolerates the replay (its decisions never look past the rejection)
    assert_categorical_matches(_keys("token", N), law, alpha=ALPHA, label="token, replayed coins")
