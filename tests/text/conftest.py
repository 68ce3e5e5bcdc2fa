"""Fixtures of the text-generation tests: tiny random Llamas (no downloads), one torch thread."""

from __future__ import annotations

import pytest
import torch

from domains.text.conformance import tiny_llama


@pytest.fixture
def make_llama():
    return tiny_llama


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
