"""The diffusion conformance cases pass with the power they claim.

Each case (conformance.py) is the joint law of two neighbouring rows with different labels, binned
at t = 6, 3 and 0 (64 cells, several rounds at lookahead 3). Two cases per test function, each at
ALPHA / 2. Power: the default cases catch ANY deviation of total variation 0.02 of their joint law
with probability >= 0.99 (about 78000 row pairs each); the slow ones (``-m slow``) any deviation
of TV 0.01 (about 310000 pairs). Both are asserted with ConformanceCase.detectable_tv.
"""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.diffusion import sample
from speculate.domains.diffusion.conformance import CHECKS, COORDINATE, LAWS, OBSERVE, SAMPLER, conformance_cases
from speculate.domains.diffusion.marginal_law import ClassConditional, GaussianData, affine_chain_law

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import assert_categorical_matches, check_conformance

CASES = conformance_cases()


def _check(case, tv):
    assert abs(sum(case.law.values()) - 1) < 1e-9
    assert len(CASES) == CHECKS
    assert case.detectable_tv(alpha=ALPHA / CHECKS) <= tv  # any deviation of TV `tv`, power 0.99
    check_conformance(case, seed=1, alpha=ALPHA / CHECKS)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_case(case):
    _check(case, 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(CHECKS), ids=[c.name for c in CASES])
def test_conformance_case_at_tv_001(index):
    _check(conformance_cases(tv=0.01)[index], 0.01)


def test_a_dependence_between_rows_is_caught():
    """Rows that share their noise have exact marginals but the wrong joint law: the default case's
    check rejects them (seeded). Plain sampling, the same seed for both rows; row b's data has its
    coordinates swapped, so its observed coordinate (1) has its own law but row a's noise (coordinate 0)."""
    case = CASES[0]
    swapped = GaussianData(LAWS[1].mean[::-1], LAWS[1].std)
    parts = []
    for label, law_used, column in ((0, LAWS[0], 0), (1, swapped, 0)):
        res = sample(SAMPLER, ClassConditional({label: law_used}, SAMPLER), (case.n, 2), labels=label,
                     record=OBSERVE, rng=4)
        law = affine_chain_law(SAMPLER, LAWS[label])
        c = COORDINATE[label]
        parts.append(np.stack([res.path[t][:, column] >= law.marginal(t)[0][c] for t in OBSERVE], 1))
    outcomes = [tuple(r) for r in np.concatenate(parts, axis=1).astype(np.int64).tolist()]
    with pytest.raises(AssertionError, match="do not follow the reference law"):
        assert_categorical_matches(outcomes, dict(case.law), alpha=ALPHA / CHECKS)
