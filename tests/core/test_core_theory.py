import math

import numpy as np
import pytest

from speculate import theory


@pytest.mark.parametrize(
    ("alpha", "k", "expected"),
    [
        (0.6, 2, 1.96),
        (0.7, 3, 2.53),
        (0.8, 2, 2.44),
        (0.8, 5, 3.69),
        (0.9, 2, 2.71),
        (0.9, 10, 6.86),
    ],
)
def test_leviathan_table_1(alpha, k, expected):
    # Leviathan et al. 2023, Table 1 (c = 0: the improvement factor is the expected tokens per call)
    assert round(theory.speedup(alpha, k, 0.0), 2) == expected


def test_leviathan_table_4_prediction():
    # T5-XXL / T5-small, alpha = 0.75, gamma = 7, c = 0.02: predicted 3.2x
    assert round(theory.speedup(0.75, 7, 0.02), 1) == 3.2


def test_expected_tokens_limits():
    assert theory.expected_tokens(0.0, 5) == 1.0
    assert theory.expected_tokens(1.0, 5) == 6.0
    assert theory.expected_tokens(0.5, 0) == 1.0
    assert math.isclose(theory.expected_tokens(0.5, 3), 1 + 0.5 + 0.25 + 0.125)


def test_accepted_length_pmf_matches_expected_tokens():
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for k in (0, 1, 4, 9):
            pmf = theory.accepted_length_pmf(alpha, k)
            assert math.isclose(pmf.sum(), 1.0)
            assert math.isclose((pmf * (np.arange(k + 1) + 1)).sum(), theory.expected_tokens(alpha, k))


def test_optimal_lookahead_is_the_argmax():
    for alpha in (0.5, 0.8, 0.95):
        for c in (0.0, 0.05, 0.3):
            k = theory.optimal_lookahead(alpha, c, k_max=40)
            best = max(range(41), key=lambda j: theory.speedup(alpha, j, c))
            assert math.isclose(theory.speedup(alpha, k, c), theory.speedup(alpha, best, c))
    assert theory.optimal_lookahead(0.1, 1.0) == 0  # speculation cannot pay


def test_acceptance_rate_is_one_minus_tv():
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.8, 0.1, 0.1])
    assert math.isclose(theory.acceptance_rate(p, q), 1 - 0.5 * np.abs(p - q).sum())
    batch = theory.acceptance_rate(np.stack([p, q]), np.stack([q, q]))
    assert batch.shape == (2,) and math.isclose(batch[1], 1.0)


def test_multi_draft_acceptance_and_engine_speedup():
    assert math.isclose(theory.multi_draft_acceptance([0.5, 0.5]), 0.75)
    # f and g both 1 s: sequential 2 s; speculative max(1, 1) + (1 - alpha) * 1
    assert math.isclose(theory.engine_speedup(1.0, 1.0, 1.0), 2.0)
    assert math.isclose(theory.engine_speedup(0.0, 1.0, 1.0), 1.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: theory.expected_tokens(1.5, 3), "alpha"),
        (lambda: theory.expected_tokens(float("nan"), 3), "alpha"),
        (lambda: theory.expected_tokens(0.5, -1), "lookahead"),
        (lambda: theory.speedup(0.5, 2, -0.1), "cost ratio"),
        (lambda: theory.acceptance_rate([0.5, 0.5], [1.0]), "same shape"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_optimal_lookahead_is_the_first_maximiser_on_a_grid():
    """The bisections (O(log k_max)) give what a full scan gives: the smallest k whose speedup is
    within a relative 1e-12 of the best over 0..k_max (exhaustive over a grid of alpha, c, k_max)."""
    for a in np.linspace(0.0, 1.0, 41):
        for c in (0.0, 1e-3, 0.01, 0.05, 0.1, 0.3, 1.0, 5.0):
            for k_max in (0, 1, 2, 7, 16, 64):
                s = [theory.speedup(float(a), k, c) for k in range(k_max + 1)]
                want = next(k for k in range(k_max + 1) if s[k] >= max(s) / (1 + 1e-12))
                assert theory.optimal_lookahead(float(a), c, k_max) == want, (a, c, k_max)
    assert theory.optimal_lookahead(0.9, 0.01, 10**12) < 1000  # no scan over a huge k_max
