"""Checks of the exact mode itself (speculate.testing.exact): its examples run, bad input is
refused with a clear message, and kernel_laws catches kernels that are wrong."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from proofs.cases import constant
from speculate.testing import exact
from speculate.testing.exact import (
    as_law,
    assert_exact_law,
    chain_joint_law,
    kernel_law,
    kernel_round_law,
    kernels,
    round_law,
    rules,
    speculative_law,
    to_fractions,
)
from speculate.verify import RULES, verify_block, verify_multi, verify_token


def test_the_rule_names_are_the_verification_cores():
    assert exact.RULES is RULES and not hasattr(rules, "RULES") and not hasattr(kernels, "RULES")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: as_law([F(1, 2), F(1, 3)]), ValueError, "not exactly 1"),
        (lambda: as_law([1.5, -0.5]), ValueError, "negative"),
        (lambda: as_law([float("nan"), 1]), ValueError, "not finite"),
        (lambda: as_law([F(1)], V=2), ValueError, "expected V = 2"),
        (lambda: to_fractions([[0.5, 0.5]]), ValueError, "1-D"),
        (lambda: to_fractions([True, False]), TypeError, "bool"),
        (lambda: speculative_law([F(1)], [F(1, 2), F(1, 2)]), ValueError, "outcomes"),
        (lambda: round_law(constant([1, 0]), constant([1, 0]), 2, 1, "tokens"), ValueError,
         "unknown rule"),
        (lambda: round_law(constant([1, 0]), constant([1, 0]), 2, 1, "block", branches=2), ValueError,
         r"branches > 1 \(multi-draft\) needs rule='token'"),
        (lambda: round_law(constant([1, 0]), constant([1, 0]), 2, 1, "multi", 2), ValueError,
         "unknown rule 'multi'.*rule='token' with branches > 1"),
        (lambda: round_law(constant([1, 0]), constant([1, 0]), 2, 1, branches=0), ValueError,
         "branches = 0"),
        (lambda: round_law(constant([1, 0]), constant([1, 0]), 2, -1), ValueError, "lookahead k"),
        (lambda: kernel_round_law(verify_token, constant([1, 0]), constant([1, 0]), 2, 1, length=2),
         ValueError, "length"),
        (lambda: kernel_round_law(verify_multi, constant([1, 0]), constant([1, 0]), 2, 1, branches=2,
                                  stop=lambda s: True), ValueError, "branches > 1"),
        (lambda: kernel_law(verify_block, [[[0.5, 0.5]] * 2] * 2, [[[0.5, 0.5]]] * 2, [[0], [1]],
                            "block"), ValueError, "need rule='token'"),
        (lambda: round_law(constant([1, 0]), constant([0, 1]), 2, 1, proposal=constant([1, 0])),
         ValueError, "q = 0"),
        (lambda: chain_joint_law(constant([1, 0]), constant([1, 0]), 2, 2, 1,
                                 rule=lambda s: {(): 1}), ValueError, "empty block"),
        (lambda: chain_joint_law(constant([1, 0]), constant([1, 0]), 2, 2, 1,
                                 rule=lambda s: {(0,): F(1, 2)}), ValueError, "sums to"),
        (lambda: kernel_law(verify_token, [[0.5, 0.5]] * 2, [[0.5, 0.5]], [0], length=2),
         ValueError, "length"),
        (lambda: kernel_law(verify_token, [[0.5, 0.5]] * 2, [[0.5, 0.5]], [2]), ValueError,
         "outside range"),
        (lambda: kernel_law(verify_token, [[0.5, 0.5]] * 2, [[1, 0]], [1]), ValueError, "q = 0"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_assert_exact_law_names_the_first_differing_outcome():
    with pytest.raises(AssertionError, match=r"outcome \(0, 0\): got 3/4 .*expected 1/2"):
        assert_exact_law({(0, 0): F(3, 4), (1, 0): F(1, 4)}, {(0, 0): F(1, 2), (1, 0): F(1, 2)})
    assert_exact_law([F(1, 2), F(1, 2), 0], {0: F(1, 2), 1: F(1, 2)})  # missing = 0


T = constant([F(1, 8), F(5, 8), F(1, 4)])
D = constant([F(1, 4), F(1, 4), F(1, 2)])


def test_a_kernel_with_a_wrong_threshold_is_caught():
    def off_by_ten_percent(p, q, drafts, lengths, u_accept, u_next):
        return verify_token(p, q, drafts, lengths, np.minimum(u_accept * 1.1, 0.9999), u_next)

    with pytest.raises(AssertionError, match="not constant"):
        kernel_round_law(off_by_ten_percent, T, D, 3, 2)


def test_a_kernel_that_swaps_rules_is_caught():
    """verify_block passed off as the token rule: its law differs from the token rule's, or its
    thresholds are not the token rule's."""
    with pytest.raises(AssertionError):
        law = kernel_round_law(verify_block, T, D, 3, 2, "token")
        assert_exact_law(law, round_law(T, D, 3, 2, "token"))


def test_a_kernel_returning_an_impossible_index_is_caught():
    def too_many(p, q, drafts, lengths, u_accept, u_next):
        n, y = verify_token(p, q, drafts, lengths, u_accept, u_next)
        return n + 1, y

    with pytest.raises(AssertionError, match="outside"):
        kernel_round_law(too_many, T, D, 3, 2)


def test_a_kernel_reading_past_the_length_is_caught():
    """Positions past `length` hold a decoy that a kernel ignoring `lengths` would accept."""

    def ignores_lengths(p, q, drafts, lengths, u_accept, u_next):
        return verify_token(p, q, drafts, None, u_accept, u_next)

    with pytest.raises(AssertionError):
        kernel_round_law(ignores_lengths, T, D, 3, 2, length=1)


def test_degenerate_rounds_k_zero():
    """k = 0 (no drafts): every kernel's round is one draw from the target (or its argmax)."""
    from speculate.verify import verify_greedy

    for kernel, rule, branches in [(verify_token, "token", 1), (verify_block, "block", 1),
                                   (verify_greedy, "greedy", 1), (verify_multi, "token", 2)]:
        law = kernel_round_law(kernel, T, D, 3, 0, rule, branches)
        assert law == round_law(T, D, 3, 0, rule, branches)
        assert law == ({(1,): F(1)} if rule == "greedy" else {(0,): F(1, 8), (1,): F(5, 8),
                                                              (2,): F(1, 4)})
