"""What every benchmark records with its numbers, and where it writes them.

``machine(device)`` describes the run (the exact command, date, commit, CPU, threads, load average,
library versions, the GPU when one is used); ``write(name, payload, markdown, figure=None)``
writes ``benchmarks/results/<name>.json`` (the payload with ``machine`` added), ``<name>.md`` and,
given a matplotlib figure, ``<name>.png`` (``folder=`` writes elsewhere). Scripts in subfolders
put this folder on ``sys.path`` and ``from report import machine, write``. A trial run can write elsewhere:
``SPECULATE_BENCH_RESULTS=/tmp/trial python benchmarks/...``.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SPECULATE_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def relative(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the repository when it lies inside it, else as given (resolved)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def command(argv: list[str] | None = None, script: str | None = None) -> str:
    """The command line that ran this script, with the script's path relative to the repository
    (``argv``, ``script``: the arguments a script's ``main(argv)`` was called with and its
    ``__file__``, in place of the process's)."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", relative(script if script is not None else sys.argv[0]), *map(shlex.quote, args)])


def machine(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (the machine may be shared: the load average is included)."""
    import numba
    import numpy as np

    torch = sys.modules.get("torch")  # only when the benchmark uses torch: importing it costs seconds
    torch_threads = torch.get_num_threads() if torch is not None else None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False, cwd=ROOT).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                     ":!benchmarks/results"],  # results written but not committed: not the code
                                    capture_output=True, text=True, check=False, cwd=ROOT).stdout.strip())
    except OSError:
        commit, dirty = "", False
    out: dict[str, Any] = {
        "command": command(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": commit,
        "git_dirty": dirty,  # uncommitted changes to tracked files: the numbers are of the working tree
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "device": device,
    }
    if torch is not None:
        # numba.get_num_threads() starts numba's OpenMP threading layer, which sets the process's
        # OpenMP thread count and with it torch's: give torch back the count the benchmark chose
        torch.set_num_threads(torch_threads)
        out.update(torch=torch.__version__, torch_threads=torch_threads)
        if device.startswith("cuda"):
            out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """An earlier revision checked out in a temporary git worktree (removed after), for scripts
    that run two versions alternately: run its code with ``PYTHONPATH=<the worktree>``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True,
                       capture_output=True)
        # the editable install maps speculate.domains to THIS tree's domains/: give the old revision's
        # speculate package its own (a link), found first on its import path
        if (path / "domains").is_dir() and not (path / "speculate" / "domains").exists():
            (path / "speculate" / "domains").symlink_to("../domains", target_is_directory=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def short_rev(rev: str) -> str:
    """The short hash of a git revision (any name git understands)."""
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def alternating(rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, version)`` of an A/B run in the order before, after, after, before, ... (each
    version first in every other round, so a drift of the machine's speed falls on both)."""
    for r in range(rounds):
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            yield r, v


def versions_line(rev: str, env: dict[str, Any]) -> str:
    """The A/B report's line naming the two versions (``env``: :func:`machine`'s record)."""
    dirty = " (with uncommitted changes)" if env.get("git_dirty") else ""
    return f"Before: {rev}; after: the working tree at {env['git_commit']}{dirty}."


def short_error(err: str, n: int = 400) -> str:
    """An error message on one line, cut to ``n`` characters (for a Markdown table or note)."""
    err = " ".join(err.split())
    return err if len(err) <= n else err[: n - 3] + "..."


def describe(m: dict[str, Any]) -> str:
    """One line for a Markdown report: the machine in words."""
    threads = f", {m['torch_threads']} torch thread(s)" if "torch_threads" in m else ""
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (f"{m['cpu']}, {m['cpu_count']} CPUs (load average at start {m['load_average_at_start'][0]:.2f})"
            f"{threads}{gpu}, Python {m['python']}, commit {m['git_commit'] or 'unknown'}"
            f"{' with uncommitted changes' if m.get('git_dirty') else ''}")


def write(name: str, payload: dict[str, Any], markdown: str, figure: Any = None, *,
          folder: str | Path | None = None, **savefig: Any) -> list[Path]:
    """Write ``results/<name>.json`` (payload plus ``machine`` unless given), ``.md`` and ``.png``.

    ``folder`` replaces ``results/`` (a script's own output option); ``savefig`` goes to the figure.
    """
    out = Path(folder) if folder is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    payload = payload if "machine" in payload else {**payload, "machine": machine()}
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(payload, indent=2, default=float) + "\n")
    paths[1].write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    if figure is not None:
        paths.append(out / f"{name}.png")
        figure.savefig(paths[-1], **({"dpi": 110} | savefig))
    return paths
