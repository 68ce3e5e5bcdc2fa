"""Exactness of speculative rollouts against the exact joint law (slippery FrozenLake).

A random stochastic tabular policy P and a perturbed draft Q (alpha about 0.75) roll out slippery
FrozenLake, whose own transitions are random (each move slips left or right with probability 2/3).
The outcome of an episode is its first ``pairs`` (action, observation) pairs
``(o_0, a_1, o_1, ..., a_t, o_t)`` (shorter if it falls in a hole or reaches the goal); its law is
computed exactly from P and ``env.unwrapped.P`` and compared with a chi-square test
(``speculate.testing``).

Calibration: each test has level ``speculate.testing.DEFAULT_ALPHA`` (1e-6), split evenly over its
checks (ALPHA / m for m checks). Power: every test computes, with ``chi2_sample_size``, the
total-variation deviation (on the merged cells) that each check detects with probability >= 99%,
and asserts it is at most the ``TV`` stated next to it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from speculate.domains.rl import TabularPolicy, speculative_rollouts
from speculate.domains.rl.conformance import frozenlake_pair, sample_keys
from speculate.domains.rl.trajectory_law import trajectory_key, trajectory_law

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, chi2_sample_size

# A second, smaller-holed slippery map, so that rows of one batch follow different laws.
MAP_B = ["SFFF", "FFFH", "FHFF", "FFFG"]


def _frozenlake(desc=None):
    return lambda: gym.make("FrozenLake-v1", desc=desc, is_slippery=True)


def detectable_tv(n: int, law: dict, alpha: float = ALPHA) -> float:
    """The smallest TV caught with probability 0.99 at level ``alpha`` by n samples (bisection)."""
    bins = max(2, min(sum(1 for v in law.values() if v > 0), n // 5))
    lo, hi = 1e-4, 1.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if chi2_sample_size(mid, bins, alpha=alpha) > n else (lo, mid)
    return hi


def _check(keys: list, law: dict, n: int, tv: float, label: str, alpha: float = ALPHA) -> None:
    assert detectable_tv(n, law, alpha) <= tv, f"{label}: {n} samples cannot detect TV {tv}"
    assert len(keys) == n
    assert_categorical_matches(keys, law, alpha=alpha, label=label)


@pytest.mark.parametrize("verify", ["token", "block"])
def test_frozenlake_two_pairs(verify: str) -> None:
    """max_steps=3, lookahead=2: one full round (2 drafts + the verifier's step) and the next. TV 0.075."""
    P, Q = frozenlake_pair(rng=11)
    n = 8000
    law = trajectory_law(_frozenlake()(), P, steps=2)
    keys = sample_keys(_frozenlake(), TabularPolicy(P), TabularPolicy(Q), n, pairs=2, max_steps=3,
                       lookahead=2, verify=verify, rng=1)
    _check(keys, law, n, 0.075, f"FrozenLake {verify}")


def test_frozenlake_many_envs_different_policies_and_maps() -> None:
    """One batch of 600 envs: rows alternate between two maps and two (policy, draft) pairs, so each
    row has its own law; ragged acceptance, rows ending at different times, automatic lookahead.
    Each configuration is checked on its own rows (two checks, ALPHA / 2 each). TV 0.09 per configuration."""
    configs = [(None, *frozenlake_pair(rng=3)), (MAP_B, *frozenlake_pair(rng=4, mix=0.7))]
    N, n_each = 600, 5000
    makes = [_frozenlake(configs[i % 2][0]) for i in range(N)]
    pols = [TabularPolicy(configs[i % 2][1]) for i in range(2)]
    drafts = [TabularPolicy(configs[i % 2][2]) for i in range(2)]
    envs = [m() for m in makes]
    keys: list[list] = [[], []]
    call = 0
    while len(keys[0]) < n_each or len(keys[1]) < n_each:
        out = speculative_rollouts(envs, [pols[i % 2] for i in range(N)], [drafts[i % 2] for i in range(N)],
                                   max_steps=3, lookahead="auto", verify="block", rng=100 + call)
        for i, t in enumerate(out):
            keys[i % 2].append(trajectory_key(t, 2))
        call += 1
    for c in range(2):
        law = trajectory_law(makes[c](), configs[c][1], steps=2)
        _check(keys[c][:n_each], law, n_each, 0.09, f"config {c}", alpha=ALPHA / 2)


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["token", "block"])
def test_frozenlake_three_pairs_slow(verify: str) -> None:
    """max_steps=4, lookahead=3: the first round drafts 3 steps, so block verification's decision
    depends on drafted states beyond the kept prefix. Law of 3 pairs (1078 outcomes). TV 0.045."""
    P, Q = frozenlake_pair(rng=11)
    n = 60_000
    law = trajectory_law(_frozenlake()(), P, steps=3)
    keys = sample_keys(_frozenlake(), TabularPolicy(P), TabularPolicy(Q), n, pairs=3, max_steps=4,
                       lookahead=3, verify=verify, rng=2)
    _check(keys, law, n, 0.045, f"FrozenLake 3 pairs {verify}")


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["token", "block"])
def test_frozenlake_8x8_long_lookahead_slow(verify: str) -> None:
    """8x8 map, lookahead 5 (the first round drafts 5 steps), law of 3 pairs. TV 0.055."""
    P, Q = frozenlake_pair(rng=5, n_states=64, mix=0.4)
    n = 40_000
    make = lambda: gym.make("FrozenLake8x8-v1", is_slippery=True)  # noqa: E731
    law = trajectory_law(make(), P, steps=3)
    keys = sample_keys(make, TabularPolicy(P), TabularPolicy(Q), n, pairs=3, max_steps=6,
                       lookahead=5, verify=verify, rng=3)
    _check(keys, law, n, 0.055, f"FrozenLake8x8 {verify}")


def test_law_is_a_distribution_and_differs_between_configs() -> None:
    """Sanity of the reference: each law sums to 1, and the two configurations differ (TV > 0.1),
    so mixing up rows between them would be caught by the test above."""
    la = trajectory_law(_frozenlake()(), frozenlake_pair(rng=3)[0], steps=2)
    lb = trajectory_law(_frozenlake(MAP_B)(), frozenlake_pair(rng=4, mix=0.7)[0], steps=2)
    assert abs(sum(la.values()) - 1) < 1e-12 and abs(sum(lb.values()) - 1) < 1e-12
    tv = 0.5 * sum(abs(la.get(k, 0) - lb.get(k, 0)) for k in set(la) | set(lb))
    assert tv > 0.1
    alpha = np.minimum(*frozenlake_pair(rng=11)).sum(axis=1).mean()
    assert 0.6 < alpha < 0.9  # drafts are rejected often enough to exercise the residual path
