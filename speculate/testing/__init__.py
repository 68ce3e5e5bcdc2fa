"""Tools to test speculative samplers, ours and users' own pipelines.

- :mod:`.gof`: goodness-of-fit and two-sample checks with stated significance and power, and
  ``DEFAULT_ALPHA`` (1e-6), the one significance level the whole test suite uses;
- :mod:`.strategies`: Hypothesis strategies for distributions and (p, q) pairs (needs hypothesis);
- :mod:`.exact`: exact (fractions.Fraction) output laws: :mod:`.exact.rules`, the laws of every
  verification rule of ``speculate.verify.RULES``; :mod:`.exact.kernels`, the law of an actual
  kernel over its uniforms;
- :mod:`.conformance`: the exactness suite every domain runs;
- :mod:`.audit`: ``audit(sampler, oracle)``, one call that says whether any sampler (a speculative
  decoder, ours or another library's) follows an exact law, with stated power, a sequential test
  and a two-sample mode (imported on first use).
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
    "AuditReport",
    "ConformanceCase",
    "assert_categorical_matches",
    "assert_continuous_matches",
    "assert_same_categorical",
    "assert_same_continuous",
    "audit",
    "check_conformance",
    "chi2_gof",
    "chi2_power",
    "chi2_sample_size",
    "ks_power_bound",
    "ks_sample_size",
]


def __getattr__(name: str):
    import importlib

    if name in ("strategies", "exact"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("audit", "AuditReport"):
        mod = importlib.import_module(".audit", __name__)
        globals().update(audit=mod.audit, AuditReport=mod.AuditReport)  # the function, not its module
        return globals()[name]
    raise AttributeError(name)
