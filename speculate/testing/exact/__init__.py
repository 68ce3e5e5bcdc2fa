"""Exact mode: the output law of every verification rule, in rational arithmetic.

Everything here is pure Python on :class:`fractions.Fraction`. The package re-exports:

* ``rules.py``: the MATHEMATICS of each rule of ``speculate.verify.RULES`` (``speculative_law``,
  ``round_law``, ``chain_joint_law``, ...), computed exactly from distributions given as
  Fractions; nothing there calls a kernel;
* ``kernels.py``: the law of an ACTUAL kernel (``kernel_law``, ``kernel_laws``,
  ``kernel_round_law``): the kernel is called on every piece of its uniforms' space (enumerated
  between the rule's rational breakpoints) and must be constant on each piece, so a kernel with a
  wrong threshold or index is caught;
* ``_checks.py`` (private): the exact conversions (``to_fractions``, ``as_law``) and the argument
  checks both use.

Multi-draft verification is the token rule with ``branches > 1`` (``round_law(...,
branches=m)``); a multi-draft kernel is recognised by the layout of ``p`` (``[m][K+1][V]``).
Token-tree verification has its own: ``tree_round_law`` / ``tree_walk`` (the mathematics) and
``kernel_tree_round_law`` / ``kernel_tree_laws`` (a kernel such as ``speculate.verify.verify_tree``).
Chains are given as functions ``prefix -> probabilities`` over ``V`` outcomes, where the prefix
is the tuple of outcomes emitted so far; they may depend on the whole prefix and contain zeros.

>>> from fractions import Fraction as F
>>> p, q = [F(3, 4), F(1, 4)], [F(1, 4), F(3, 4)]
>>> speculative_law(p, q) == p
True
>>> acceptance(p, q)
Fraction(1, 2)
"""

from ...verify import RULES
from ._checks import as_law, to_fractions
from .kernels import kernel_law, kernel_laws, kernel_round_law, kernel_tree_laws, kernel_tree_round_law
from .rules import (
    acceptance,
    assert_exact_law,
    block_quantities,
    chain_joint_law,
    expected_outcomes,
    extend_with_target,
    greedy,
    residual,
    round_law,
    speculative_law,
    target_joint_law,
    total_variation,
    tree_drafts,
    tree_round_law,
    tree_walk,
)

__all__ = [
    "RULES",
    "acceptance",
    "as_law",
    "assert_exact_law",
    "block_quantities",
    "chain_joint_law",
    "expected_outcomes",
    "extend_with_target",
    "greedy",
    "kernel_law",
    "kernel_laws",
    "kernel_round_law",
    "kernel_tree_laws",
    "kernel_tree_round_law",
    "residual",
    "round_law",
    "speculative_law",
    "target_joint_law",
    "to_fractions",
    "total_variation",
    "tree_drafts",
    "tree_round_law",
    "tree_walk",
]
