"""rl tests: one torch thread (the CI machine has two cores and pytest-xdist runs two workers)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
