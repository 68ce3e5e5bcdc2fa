"""Shared test settings.

Statistical tests in this suite are seeded (deterministic), calibrated and powered:
- each check runs at ALPHA = 1e-7 (tests/_calib.py), and the suite runs fewer than 200 of them, so a correct sampler
  makes the whole suite fail with probability below 2e-5 (Bonferroni);
- sample sizes come from speculate.testing.chi2_sample_size / ks_sample_size for the deviation
  each test states (TV 0.01 for the core kernels, unless a test says otherwise).
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
