"""`speculate generate`: runs on the embedded pair, --json parses, --stream prints the same text,
statistics go to standard error, bad arguments give a message and exit status 2; `speculate --help`
lists every command."""

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
    cap = capsys.readouterr()
    assert cap.out.splitlines()[0] == "def fib(n):" and "tokens/s" not in cap.out  # the text alone
    err = cap.err.strip()
    assert "tokens/s" in err and "alpha" in err and "tokens per target call" in err and "nan" not in err


def test_json_and_stream_agree(capsys, monkeypatch):
    args = ["--max-new-tokens", "20", "--seed", "3", "--top-k", "20", "--lookahead", "3"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("import os\n"))
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"texts", "stats", "tokens_per_second"} and data["new_tokens"] == 20
    assert main([*args, "--prompt", "import os\n", "--stream"]) == 0
    cap = capsys.readouterr()
    assert "\x1b[" not in cap.out  # no colour when stdout is not a terminal
    assert cap.out == "import os\n" + data["texts"][0] + "\n" and "tokens/s" in cap.err
    assert main([*args, "--prompt", "import os\n"]) == 0  # the same text without --stream
    assert capsys.readouterr().out == cap.out


def test_several_prompts_sequences_and_stop(capsys):
    args = ["--max-new-tokens", "12", "--seed", "1", "--prompt", "def a(", "--prompt", "class B",
            "--num-return-sequences", "2", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prompts"] == ["def a(", "class B"] and len(data["texts"]) == 4
    assert main([*args[:-1]]) == 0
    blocks = capsys.readouterr().out.rstrip("\n").split("\n---\n")
    assert [b[:6] for b in blocks] == ["def a(", "def a(", "class ", "class "]
    assert main(["--prompt", "import os\n", "--max-new-tokens", "40", "--stop", "\n", "--seed", "0", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["texts"][0]
    assert text.count("\n") <= 1 and (not text or "\n" not in text[:-1])


def test_version_and_threads(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("speculate 0.")
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["--prompt", "x", "--max-new-tokens", "2", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("argv,msg", [
    (["--prompt", "x", "--top-p", "3"], "top_p"),
    (["--prompt", "x", "--draft", "bogus"], "unknown draft"),
    (["--prompt", "x", "--target", "/nonexistent/model"], "error"),
    (["--prompt", "x", "--lookahead", "many"], "lookahead"),
    (["--bogus"], "unrecognized"),
    pytest.param(["--prompt", "x", "--device", "cuda"], "CUDA", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="a CUDA device is present")),
    (["--prompt", "x", "--device", "potato"], "not a torch device"),
    (["--prompt", "x", "--threads", "0"], "--threads"),
    (["--prompt", "x", "--prompt", "y", "--stream"], "--stream prints one sequence"),
])
def test_bad_arguments(capsys, argv, msg):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert msg in capsys.readouterr().err
