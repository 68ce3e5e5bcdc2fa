"""Progress bars for long work (batches of prompts, distillation): tqdm when it is installed and
the output is a terminal, silent otherwise (tests, pipes, logs).

>>> with progress_bar(3, "work", enabled=False) as bar:
...     bar.update(3)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["progress_bar"]


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextmanager
def progress_bar(total: int, desc: str, enabled: bool | None = None, **kw: Any) -> Iterator[Any]:
    """A bar of ``total`` steps: ``enabled`` None shows it when stderr is a terminal and tqdm is
    installed (it comes with ``speculate[text]``), True / False force it on / off."""
    show = sys.stderr.isatty() if enabled is None else bool(enabled)
    bar = None
    if show:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=total, desc=desc, leave=False, **kw)
    try:
        yield bar if bar is not None else _Silent()
    finally:
        if bar is not None:
            bar.close()
