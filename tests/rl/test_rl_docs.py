"""The runnable examples in the rl domain's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "speculate.domains.rl",
    "speculate.domains.rl.snapshots",
    "speculate.domains.rl.snapshot_check",
    "speculate.domains.rl.policies",
    "speculate.domains.rl.speculative",
    "speculate.domains.rl.exact",
    "speculate.domains.rl.models",
    "speculate.domains.rl.distill",
    "speculate.domains.rl.conformance",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0  # a module without examples would pass vacuously
