"""The physics conformance cases pass with the power they claim.

Each case (conformance.py) is the joint law of two neighbouring rows started in different states,
binned at steps 1, 2 and 4 (64 cells, several rounds at lookahead 2). Three cases per test
function, each at ALPHA / 3. Power: the default cases catch ANY deviation of total variation
0.02 of their joint law with probability >= 0.99 (about 80000 row pairs each); the slow ones
(``-m slow``) any deviation of TV 0.01 (about 320000 pairs). Both are asserted below with
ConformanceCase.detectable_tv (chi-square noncentrality bound, speculate.testing).
"""

from __future__ import annotations

import numpy as np
import pytest
from speculate.domains.physics import DoubleWell, Langevin, simulate
from speculate.domains.physics.conformance import CHECKS, EDGES, OBSERVE, STARTS, STEPS, conformance_cases

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
    """Rows that share their noise have exact marginals but the wrong joint law: the default
    case's check rejects them (seeded; plain ``simulate`` of both starts with the same noise)."""
    case = CASES[0]
    model = Langevin(force=DoubleWell(1.0), dt=0.05)  # the target of case 0
    paths = np.concatenate([simulate(model, np.full((case.n, 1, 1), x), STEPS, rng=4).positions[:, list(OBSERVE), 0, 0]
                            for x in STARTS], axis=1)  # [n, 6]: row a, row b, driven by the same noise
    outcomes = [tuple(r) for r in (paths >= np.repeat(EDGES, len(OBSERVE))).astype(np.int64).tolist()]
    with pytest.raises(AssertionError, match="do not follow the reference law"):
        assert_categorical_matches(outcomes, dict(case.law), alpha=ALPHA / CHECKS)
