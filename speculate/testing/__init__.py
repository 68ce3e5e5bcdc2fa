"""Tools to test speculative samplers, ours and users' own pipelines.

- :mod:`.gof`: goodness-of-fit and two-sample checks with stated significance and power, and
  ``DEFAULT_ALPHA`` (1e-6), the one significance level the whole test suite uses;
- :mod:`.strategies`: Hypothesis strategies for distributions and (p, q) pairs (needs hypothesis);
- :mod:`.exact`: exact (fractions.Fraction) output laws: :mod:`.exact.rules`, the laws of every
  verification rule of ``speculate.verify.RULES``; :mod:`.exact.kernels`, the law of an actual
  kernel over its uniforms;
- :mod:`.conformance`: the exactness suite every domain runs.
"""

from .conformance import ConformanceCase, check_conformance
from .gof import (
    DEFAULT_ALPHA,
    assert_categorical_matches,
    assert_continuous_matches,
    assert_same_categorical,
    assert_same_continuous,
    chi2_gof,
    chi2_power,
    chi2_sample_size,
    ks_power_bound,
    ks_sample_size,
)

__all__ = [
    "DEFAULT_ALPHA",
    "ConformanceCase",
    "assert_categorical_matches",
    "assert_continuous_matches",
    "assert_same_categorical",
    "assert_same_continuous",
    "check_conformance",
    "chi2_gof",
    "chi2_power",
    "chi2_sample_size",
    "ks_power_bound",
    "ks_sample_size",
]


def __getattr__(name: str):
    if name in ("strategies", "exact"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(name)
