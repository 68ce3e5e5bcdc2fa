"""`speculate demo physics` runs (the quick exactness part by default; all parts when slow)."""

from __future__ import annotations

import pytest
from speculate.domains.physics.demo import demo


def test_demo_exactness_part(capsys):
    assert demo(["--part", "1", "--replicas", "3000"]) == 0
    out = capsys.readouterr().out
    assert "vs exact law p =" in out and "vs plain simulate p =" in out


@pytest.mark.slow
def test_demo_all_parts(capsys):
    assert demo(["--lj-steps", "30", "--nn-steps", "300", "--train-steps", "100"]) == 0
    out = capsys.readouterr().out
    assert "Lennard-Jones" in out and "MLP potential" in out


def test_demo_accepts_quick(capsys):
    # `speculate demo all --quick` forwards --quick to every domain's demo
    assert demo(["--quick", "--part", "1"]) == 0
    assert "4000 replicas" in capsys.readouterr().out
