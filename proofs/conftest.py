"""proofs/ runs with the default test command; tests marked ``slow`` are skipped unless selected
with ``-m slow`` (or any -m expression naming slow) or SPECULATE_SLOW=1."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or "") or os.environ.get("SPECULATE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or SPECULATE_SLOW=1")
    for item in items:
        if item.fspath is not None and "proofs" in str(item.fspath) and "slow" in item.keywords:
            item.add_marker(skip)
