"""Every runnable example in every module's docstrings runs and prints what it claims.

One test for the whole package, the domains included (Gymnasium-style: the examples are part of
the documentation, so they are checked like code). The modules a newcomer reads first must have
examples: the core's public modules, and in every domain its package, its public functions, its
Process, its drafts and its conformance cases.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import speculate
from speculate import domains

CORE = ["speculate", "speculate.distributions", "speculate.engine", "speculate.chain", "speculate.rounds",
        "speculate.stats", "speculate.theory", "speculate.rng", "speculate.verify", "speculate.testing.gof",
        "speculate.testing.conformance", "speculate.testing.exact", "speculate.testing.exact.rules",
        "speculate.testing.exact.kernels", "speculate.testing.exact._checks"]
SHAPE = ["", ".api", ".process", ".drafts", ".conformance"]
MUST_HAVE_EXAMPLES = {*CORE, *(f"speculate.domains.{d}{m}" for d in domains.REGISTRY for m in SHAPE)}


def _modules() -> list[str]:
    names = ["speculate"]
    for pkg, prefix in ((speculate, "speculate."), (domains, "speculate.domains.")):
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix) if not m.name.endswith("__main__")]
    return sorted(set(names))


def test_every_module_that_must_have_examples_exists():
    assert MUST_HAVE_EXAMPLES <= set(_modules()), MUST_HAVE_EXAMPLES - set(_modules())


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
    if name in MUST_HAVE_EXAMPLES:
        assert result.attempted > 0, f"{name} has no runnable example"
