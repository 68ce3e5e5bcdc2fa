"""`speculate generate`: runs on the embedded pair, --json parses, --stream prints the same text,
bad arguments give a message and a non-zero exit; `speculate --help` lists every command."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from speculate.domains.text.cli import main


def test_help_lists_every_command():
    r = subprocess.run([sys.executable, "-m", "speculate", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "generate" in r.stdout and "demo" in r.stdout


def test_generate_prints_code(capsys):
    assert main(["--prompt", "def fib(n):", "--max-new-tokens", "24", "--temperature", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "def fib(n):"
    assert "tokens/s" in out[-1] and "alpha" in out[-1] and "tokens per target call" in out[-1]


def test_json_and_stream_agree(capsys, monkeypatch):
    args = ["--max-new-tokens", "20", "--seed", "3", "--top-k", "20", "--lookahead", "3"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("import os\n"))
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"texts", "stats", "tokens_per_second"} and data["new_tokens"] == 20
    assert main([*args, "--prompt", "import os\n", "--stream"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert "\x1b[" not in "".join(lines)  # no colour when stdout is not a terminal
    assert "\n".join(lines[:-2]) == data["texts"][0] and "tokens/s" in lines[-2]


@pytest.mark.parametrize("argv,msg", [
    (["--prompt", "x", "--top-p", "3"], "top_p"),
    (["--prompt", "x", "--draft", "bogus"], "unknown draft"),
    (["--prompt", "x", "--target", "/nonexistent/model"], "error"),
    (["--prompt", "x", "--lookahead", "many"], "lookahead"),
    (["--bogus"], "unrecognized"),
])
def test_bad_arguments(capsys, argv, msg):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code != 0
    assert msg in capsys.readouterr().err
