"""The conformance suite every domain runs: a case samples outcomes through the domain's
speculative path and names the exact law they must follow.

>>> import numpy as np
>>> from speculate.testing import ConformanceCase, check_conformance
>>> case = ConformanceCase("fair coin", lambda n, seed: np.random.default_rng(seed).integers(0, 2, n).tolist(),
...                        {0: 0.5, 1: 0.5}, n=10_000)
>>> check_conformance(case) > 1e-6
True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from .gof import DEFAULT_ALPHA, assert_categorical_matches, chi2_sample_size

__all__ = ["ConformanceCase", "check_conformance"]


@dataclass(frozen=True)
class ConformanceCase:
    name: str
    sample: Callable[[int, int], list]  #: (n, seed) -> n i.i.d. hashable outcomes from the speculative path
    law: Mapping[Hashable, float]  #: the exact law of one outcome (sums to 1)
    n: int = 20_000  #: samples the suite draws

    def detectable_tv(self, alpha: float = DEFAULT_ALPHA, power: float = 0.99) -> float:
        """The total-variation deviation this case catches with probability ``power`` at level ``alpha``."""
        bins = max(2, sum(1 for v in self.law.values() if v > 0))
        lo, hi = 1e-4, 1.0
        for _ in range(40):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if chi2_sample_size(mid, bins, alpha=alpha, power=power) > self.n else (lo, mid)
        return hi


def check_conformance(case: ConformanceCase, *, seed: int = 0, alpha: float = DEFAULT_ALPHA) -> float:
    """Draw ``case.n`` outcomes and chi-square them against ``case.law``; returns the p-value."""
    samples = case.sample(case.n, seed)
    if len(samples) != case.n:
        raise AssertionError(f"{case.name}: sample(n={case.n}) returned {len(samples)} outcomes")
    return assert_categorical_matches(samples, dict(case.law), alpha=alpha, label=case.name)
