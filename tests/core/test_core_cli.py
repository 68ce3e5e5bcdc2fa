import subprocess
import sys

import pytest

from speculate.cli import main


def test_engine_demo_runs_and_reports_theory(capsys):
    assert main(["demo", "engine", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "theory" in out and "outcomes per target call" in out


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "speculate", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "demo" in r.stdout


def test_unknown_demo_is_rejected():
    r = subprocess.run([sys.executable, "-m", "speculate", "demo", "nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "invalid choice" in r.stderr


def test_a_demos_help_shows_its_own_flags(capsys):
    """Regression: `speculate demo text --help` showed only the demo chooser's flags."""
    with pytest.raises(SystemExit) as e:
        main(["demo", "text", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "speculate demo text" in out and "--prompt" in out and "--new-tokens" in out
