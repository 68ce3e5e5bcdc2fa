"""benchmarks/gpu/check.py, the budgeted GPU check, rehearsed on the CPU (``--device cpu --dry-run``:
tiny shapes) so that the first call on a lent GPU is not also the script's first run: every step
runs and writes its files, the results come back in three files, the budget holds (a step that
would run past it is cut and recorded, the rest skipped), and --unpack restores each step's files."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_rehearsal_runs_every_step_and_writes_its_files(check, tmp_path):
    before = set(check.RESULTS.glob("*"))
    t = time.monotonic()
    code = check.main(["--device", "cpu", "--dry-run", "--budget", "300", "--out", str(tmp_path)])
    took = time.monotonic() - t
    rec = json.loads((tmp_path / "gpu_check.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    assert [s["name"] for s in rec["steps"]] == [name for name, _, _ in check.STEPS]
    for s in rec["steps"]:
        if s["name"] == "rl" and not (check.ROOT / "benchmarks" / "rl" / "cache").is_dir():
            assert s["status"] == "skipped" and "train" in s["tail"]  # no trained policies: said, not run
            continue
        assert s["status"] == "ok", (s["name"], s["status"], s["tail"][-1500:])
        assert s["files"], f"{s['name']} wrote no result file"
    assert code == 0 and rec["seconds"] <= took + 1 and rec["seconds"] <= rec["budget"]
    assert rec["device_info"]["device"] == "cpu" and "torch" in rec["device_info"]
    assert "| text | ok |" in (tmp_path / "gpu_check.md").read_text()
    assert set(check.RESULTS.glob("*")) == before  # files benchmarks wrote there were moved into the record
    unpacked = check.unpack(tmp_path / "gpu_check.json", tmp_path)
    assert {p.name for p in unpacked} >= {"text_generate_dry.json", "gpu_speed_model.md", "gpu_host_syncs.json"}


def test_the_budget_holds_and_cut_steps_are_recorded(check, tmp_path):
    """A budget too short for the text step: it is cut at its share, recorded, and the steps after it
    are skipped once too little is left; the record is written all the same."""
    t = time.monotonic()
    code = check.main(["--device", "cpu", "--dry-run", "--budget", "22", "--steps", "device", "text", "speed",
                       "physics", "--out", str(tmp_path)])
    took = time.monotonic() - t
    rec = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in rec["steps"]}
    assert list(status) == ["device", "text", "speed", "physics"]
    assert all(v in ("ok", "skipped") or v.startswith("timed out") for v in status.values()), status
    assert any(v == "skipped" or v.startswith("timed out") for v in status.values()), status
    assert took <= 22 + 3, f"the check took {took:.1f} s on a budget of 22 s"
    assert code == (0 if all(v in ("ok", "skipped") for v in status.values()) else 1)


def test_bad_arguments_are_refused(check):
    for argv in (["--budget", "3"], ["--dry-run"], ["--steps", "nope"]):
        with pytest.raises(SystemExit):
            check.main(argv)
