"""The runnable examples in the rl domain's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "domains.rl", "domains.rl.snapshots", "domains.rl.snapshot_check", "domains.rl.policies",
    "domains.rl.speculative", "domains.rl.exact", "domains.rl.models", "domains.rl.distill",
    "domains.rl.conformance",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0  # a module without examples would pass vacuously
