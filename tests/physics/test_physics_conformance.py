"""The physics conformance cases pass, quickly, with the power they claim."""

from __future__ import annotations

import pytest
from speculate.domains.physics.conformance import conformance_cases

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import check_conformance

CASES = conformance_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_case(case):
    assert abs(sum(case.law.values()) - 1) < 1e-9
    check_conformance(case, seed=1, alpha=ALPHA / len(CASES))
    assert case.detectable_tv(alpha=ALPHA / len(CASES)) <= 0.04   # any deviation of TV 0.04
