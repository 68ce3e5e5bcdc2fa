"""Shared test settings.

Test files are named ``tests/<area>/test_<area>_<topic>.py`` (area: core, text, rl, physics; the
proofs' checks are ``proofs/check_NN_<theorem>.py``).

Statistical tests in this suite are seeded (deterministic), calibrated and powered:
- ONE significance level, ``speculate.testing.DEFAULT_ALPHA`` (1e-6), imported as ``ALPHA``
  everywhere; a test that makes m checks runs each at ALPHA / m (Bonferroni). The suite makes
  fewer than 250 checks, so a correct sampler fails it with probability below 2.5e-4 for a fresh
  seed, and the seeded runs are deterministic;
- sample sizes come from speculate.testing.chi2_sample_size / ks_sample_size (or the power is
  asserted with chi2_power / ks_power_bound) for the deviation each test states (TV 0.01 for the
  core kernels, unless a test says otherwise).
Hypothesis runs derandomized, so every run draws the same examples.
"""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("SPECULATE_MAX_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a 2-core machine shared by two pytest-xdist workers: one intra-op torch thread
    is several times faster. Only when the test's modules imported torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
