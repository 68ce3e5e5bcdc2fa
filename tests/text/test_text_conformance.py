"""The text domain's conformance cases at their two strengths.

The shared suite (tests/core/test_core_conformance.py) runs them as ``conformance_cases()`` gives
them: enough samples to catch a deviation of total variation ``DEFAULT_TV`` = 0.02 of the law of
(prompt, first two tokens) with probability 0.99 at ALPHA. Here: that stated power is checked
(cheap, no sampling), and under the ``slow`` marker the same cases run with the samples that catch
TV 0.01 (about 4x as many). Each slow test makes one check at ALPHA.
"""

from __future__ import annotations

import functools

import pytest
from speculate.domains.text.conformance import DEFAULT_TV, conformance_cases

from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import check_conformance, chi2_sample_size


@functools.cache
def _cases(tv):
    return conformance_cases(tv=tv)


def test_default_cases_catch_tv_002():
    for case in _cases(DEFAULT_TV):
        cells = sum(1 for w in case.law.values() if w > 0)
        assert case.n >= chi2_sample_size(DEFAULT_TV, cells, alpha=ALPHA, power=0.99)
        assert case.detectable_tv(alpha=ALPHA) <= DEFAULT_TV, case.name


@pytest.mark.slow
@pytest.mark.parametrize("i", range(4))
def test_text_conformance_at_tv_001(i):
    case = _cases(0.01)[i]
    assert case.detectable_tv(alpha=ALPHA) <= 0.01, case.name
    check_conformance(case, seed=1, alpha=ALPHA)
