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
