"""The same exactness suite over every registered domain (Gymnasium-style conformance).

Each case samples through the domain's whole speculative path (its Process, the round loop, the
shared kernels) and is chi-squared against the exact law of its outcomes at ALPHA; the test also
states the deviation each case can detect (ConformanceCase.detectable_tv) and requires it <= 0.1.
"""

import importlib

import pytest

from speculate import domains
from speculate.testing import DEFAULT_ALPHA as ALPHA
from speculate.testing import ConformanceCase, check_conformance


def _cases():
    out = []
    for name in domains.REGISTRY:
        try:
            mod = importlib.import_module(f"speculate.domains.{name}.conformance")
        except ImportError as err:  # a domain whose optional dependency is missing
            out.append(pytest.param(name, None, marks=pytest.mark.skip(reason=str(err)), id=name))
            continue
        for case in mod.conformance_cases():
            out.append(pytest.param(name, case, id=f"{name}:{case.name}"))
    return out


@pytest.mark.parametrize(("domain", "case"), _cases())
def test_domain_conformance(domain, case):
    assert isinstance(case, ConformanceCase)
    assert abs(sum(case.law.values()) - 1.0) < 1e-9, f"{domain}:{case.name}: the exact law must sum to 1"
    assert case.detectable_tv(alpha=ALPHA) <= 0.1, f"{domain}:{case.name}: too few samples to be a real test"
    check_conformance(case, seed=0, alpha=ALPHA)


def test_every_domain_registers_cases():
    for name in domains.REGISTRY:
        mod = importlib.import_module(f"speculate.domains.{name}.conformance")
        assert mod.conformance_cases(), f"domain {name} has no conformance cases"
