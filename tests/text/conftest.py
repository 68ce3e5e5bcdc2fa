"""Fixtures of the text-generation tests: tiny random Llamas (no downloads)."""

from __future__ import annotations

import pytest
from speculate.domains.text.conformance import tiny_llama


@pytest.fixture
def make_llama():
    return tiny_llama

