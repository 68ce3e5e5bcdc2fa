"""The runnable examples in the rl domain's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "speculate.domains.rl",
    "speculate.domains.rl.api",
    "speculate.domains.rl.drafts",
    "speculate.domains.rl.snapshots",
    "speculate.domains.rl.snapshots.registry",
    "speculate.domains.rl.snapshots.plain_data",
    "speculate.domains.rl.snapshots.snapshotter",
    "speculate.domains.rl.snapshots.check",
    "speculate.domains.rl.policies",
    "speculate.domains.rl.seeding",
    "speculate.domains.rl.trajectory_law",
    "speculate.domains.rl.models",
    "speculate.domains.rl.distill",
    "speculate.domains.rl.cartpole",
    "speculate.domains.rl.conformance",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0  # a module without examples would pass vacuously
