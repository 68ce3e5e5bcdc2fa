"""The install layout: one top-level package (speculate), the domains under speculate.domains, py.typed.

The repository keeps the domains in its top-level ``domains/`` folder and pyproject.toml maps it to
``speculate.domains``. An editable install finds a package folder even when the list in
pyproject.toml forgets it, so these checks read the list and the tree directly: a forgotten
package would be missing from a wheel while every other test still passed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """The folder pyproject.toml maps ``package`` to (longest package-dir prefix wins)."""
    dirs = CONFIG.get("package-dir", {})
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in dirs:
            return ROOT / dirs[prefix] / Path(*parts[n:])
    return ROOT / Path(*parts)


def test_every_package_folder_is_listed_and_every_listed_package_exists():
    listed = set(CONFIG["packages"])
    assert all(p == "speculate" or p.startswith("speculate.") for p in listed), listed
    folders = {_folder(p) for p in listed}
    for p in listed:
        assert (_folder(p) / "__init__.py").is_file(), f"{p} is listed but {_folder(p)} has no __init__.py"
    for top in ("speculate", "domains"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert init.parent in folders, f"{init.parent.relative_to(ROOT)} is a package missing from pyproject.toml"


def test_typed_marker_ships():
    assert (ROOT / "speculate" / "py.typed").is_file()
    assert "py.typed" in CONFIG["package-data"]["speculate"]


def test_nothing_imports_a_top_level_domains_package():
    """Run from the repository root, ``import domains`` would work by accident (the folder is on
    sys.path) and fail for every installed user: only ``speculate.domains`` may be used."""
    bad = []
    for folder in ("speculate", "domains", "tests", "proofs", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "domains"]
    assert not bad, f"imports of the top-level name 'domains': {bad}"


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_with_its_data(tmp_path):
    """Build the wheel (no network: this environment's setuptools) and read what it would install."""
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("speculate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"speculate"}, tops
    for must in ("speculate/py.typed", "speculate/domains/text/examples/weights/target/model.safetensors",
                 "speculate/domains/diffusion/models/digits_target.safetensors",
                 "speculate/domains/diffusion/models/digits.json",
                 "speculate/domains/rl/snapshots/check.py", "speculate/testing/exact/kernels.py"):
        assert must in names, must


def test_the_core_imports_without_torch():
    """torch is an extra (text, rl, physics, diffusion): the engine, the verification core and the
    testing helpers import without it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import speculate, speculate.verify, speculate.testing, speculate.rounds, speculate.chain\n"
            "from speculate.verify import verify_round\n"
            "assert 'torch' not in sys.modules, 'the core imported torch'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def _ranges() -> dict[str, list]:
    """Every dependency pyproject.toml declares (extras included), by canonical name: its specifiers."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith("speculate[")]
    out: dict[str, list] = {}
    for r in map(Requirement, reqs):
        out.setdefault(canonicalize_name(r.name), []).extend(r.specifier)
    return out


def _pins(name: str) -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            pkg, version = line.split("==")
            pins[canonicalize_name(pkg)] = version.split("+")[0]
    return pins


def test_every_range_has_a_tested_floor():
    """Each declared range has a floor (>=), pinned in constraints-floor.txt (run by .ci/floor), and
    the pinned working set (constraints.txt) lies inside every range."""
    from packaging.version import Version

    floors, pinned = _pins("constraints-floor.txt"), _pins("constraints.txt")
    for name, specs in _ranges().items():
        lower = sorted({s.version for s in specs if s.operator == ">="})
        assert len(lower) == 1, f"{name}: declare one floor (>=), got {[str(s) for s in specs]}"
        assert floors.get(name) == lower[0], f"{name}: floor {lower[0]}, constraints-floor.txt: {floors.get(name)}"
        for s in specs:
            assert s.contains(Version(pinned[name])), f"{name}: constraints.txt pins {pinned[name]}, outside {s}"


def test_the_text_domain_names_the_tested_transformers_floor():
    from speculate.domains.text.models.transformers_api import TESTED

    assert TESTED["floor"] == _pins("constraints-floor.txt")["transformers"]
    assert TESTED["pinned"] == _pins("constraints.txt")["transformers"]
