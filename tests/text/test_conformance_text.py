"""The text domain's conformance cases pass the shared exactness check and are powerful enough."""

from __future__ import annotations

import time

import pytest

from domains.text.conformance import conformance_cases
from speculate.testing import check_conformance

CASES = conformance_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    t0 = time.perf_counter()
    assert check_conformance(case, seed=1, alpha=1e-7) > 1e-7  # the suite's per-check level
    assert case.detectable_tv() <= 0.1, f"{case.name}: catches only TV {case.detectable_tv():.3f}"
    assert time.perf_counter() - t0 < 60, "a conformance case must stay well under a minute"
