"""The benchmarks' run record (benchmarks/report.py) must not change what it records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
torch.get_num_threads()  # torch's OpenMP pool in use, as after a benchmark's runs
from report import machine
m = machine()
print(m["torch_threads"], torch.get_num_threads())
"""


def test_machine_leaves_torch_threads_as_the_benchmark_set_them():
    """numba.get_num_threads() starts numba's OpenMP layer, which resets the thread count of a torch
    already in use: in a fresh process (as a benchmark runs), the record says 1 thread and torch
    still runs 1."""
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "benchmarks")], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.split()
    assert out == ["1", "1"]


def test_describe_says_when_the_tree_had_uncommitted_changes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report import describe

    m = {"cpu": "x86_64", "cpu_count": 2, "load_average_at_start": (0.5, 0, 0), "python": "3.11",
         "git_commit": "abc1234"}
    assert describe(m).endswith("commit abc1234")
    assert describe({**m, "git_dirty": True}).endswith("commit abc1234 with uncommitted changes")


def test_ab_helpers_order_name_and_locate():
    """The A/B scripts' shared pieces: the alternating order, the short revision, the versions
    line, a path inside the repository."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report import alternating, relative, short_rev, versions_line

    assert list(alternating(3)) == [(0, "before"), (0, "after"), (1, "after"), (1, "before"),
                                    (2, "before"), (2, "after")]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert head.startswith(short_rev("HEAD")) and 4 <= len(short_rev("HEAD")) < len(head)
    env = {"git_commit": "abc1234"}
    assert versions_line("def5678", env) == "Before: def5678; after: the working tree at abc1234."
    assert versions_line("def5678", {**env, "git_dirty": True}).endswith("abc1234 (with uncommitted changes).")
    assert relative(ROOT / "benchmarks" / "report.py") == "benchmarks/report.py"
    assert relative("/tmp") == str(Path("/tmp").resolve())


def test_device_rules_ab_runs_against_a_revision(tmp_path):
    """bench_device_rules end to end on a tiny shape against HEAD: a result with both versions."""
    import json
    import os

    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_device_rules.py"), "--before", "HEAD", "--shape",
           "2", "2", "2", "8", "--rounds", "2", "--repeat", "1", "--name", "smoke"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "SPECULATE_BENCH_RESULTS": str(tmp_path)})
    res = json.loads((tmp_path / "smoke.json").read_text())
    assert set(res["median_s"]) == {"token_device", "block_device", "multi_device"}
    assert all(set(v) == {"before", "after"} for v in res["median_s"].values())
