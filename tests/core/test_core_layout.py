"""One shape for every domain, one naming scheme for every test file (docs/architecture.md).

A reader who knows one domain knows all: each has the same files under the same names, and its
Process has the protocol's three methods with the protocol's arguments.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from speculate import domains
from speculate.rounds import Process

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ("__init__.py", "api.py", "process.py", "drafts.py", "conformance.py", "demo.py", "README.md")
#: where a larger domain may hold a file of the shape instead: a folder of its own (text's drafts/), or
#: its examples/ folder (text's demo, beside its embedded assets)
INSTEAD = {"drafts.py": ("drafts/__init__.py",), "demo.py": ("examples/demo.py",)}


@pytest.mark.parametrize("name", domains.REGISTRY)
def test_every_domain_has_the_same_files(name):
    folder = ROOT / "domains" / name
    missing = [f for f in SHAPE if not any((folder / g).is_file() for g in (f, *INSTEAD.get(f, ())))]
    assert not missing, f"domains/{name} lacks {missing}"
    laws = sorted(p.name for p in folder.glob("*_law.py"))
    assert len(laws) == 1, f"domains/{name} must hold its exact law in one *_law.py module, found {laws}"


def _processes(name: str) -> list[type]:
    mod = importlib.import_module(f"speculate.domains.{name}.process")
    return [c for _, c in inspect.getmembers(mod, inspect.isclass)
            if c.__module__ == mod.__name__ and all(hasattr(c, m) for m in ("propose", "score", "commit"))]


@pytest.mark.parametrize("name", domains.REGISTRY)
def test_every_domain_process_follows_the_protocol(name):
    procs = _processes(name)
    assert len(procs) == 1, f"speculate.domains.{name}.process must define one Process, found {procs}"
    for method in ("propose", "score", "commit"):
        want = list(inspect.signature(getattr(Process, method)).parameters)
        got = list(inspect.signature(getattr(procs[0], method)).parameters)
        assert got == want, f"{procs[0].__name__}.{method}{tuple(got)} differs from the protocol's {tuple(want)}"


def test_test_files_follow_one_naming_scheme():
    areas = "|".join(("core", "distributed", *domains.REGISTRY))  # distributed: speculate.distributed
    pattern = re.compile(rf"^tests/({areas})/test_\1_[a-z0-9_]+\.py$")
    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
           if not pattern.match(str(p.relative_to(ROOT)))]
    assert not bad, f"test files must be tests/<area>/test_<area>_<topic>.py: {bad}"
