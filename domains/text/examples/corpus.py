"""The offline corpus: the Python standard library's own ``.py`` sources.

Every machine that runs Python has this text, so models can be trained and evaluated without
downloading anything. The split is deterministic: a file is held out when the SHA-256 of its
path relative to the standard library root falls in the lowest ``heldout_fraction`` of the hash
range, so the same file lands in the same split on every machine and Python version that has it.
The corpus itself depends on the Python version (``Corpus.python_version`` records it).

Excluded: ``site-packages``/``dist-packages``, test suites (any directory named ``test``,
``tests`` or ``idle_test``) and ``pydoc_data`` (documentation text, not code).

>>> from speculate.domains.text.examples.corpus import load_corpus
>>> heldout = load_corpus("heldout")
>>> heldout.split, len(heldout.documents) > 0
('heldout', True)
>>> stream = heldout.token_stream()        # BOS doc EOS BOS doc EOS ... as int64 byte ids
>>> int(stream[0]) == 256
True
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from speculate.domains.text.examples.tokenizer import BOS_ID, EOS_ID

HELDOUT_FRACTION = 0.05
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                           "pydoc_data", "__pycache__"})
SPLITS = ("train", "heldout")


def stdlib_root() -> Path:
    """The directory holding the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Relative POSIX paths of the corpus files under ``root``, sorted.

    >>> files = stdlib_files()
    >>> "os.py" in files and all(f.endswith(".py") for f in files)
    True
    """
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(f"standard library directory {str(base)!r} does not exist")
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                out.append(Path(dirpath, name).relative_to(base).as_posix())
    return sorted(out)


def split_of(relpath: str, heldout_fraction: float = HELDOUT_FRACTION) -> str:
    """``"heldout"`` or ``"train"``: a pure function of the relative path.

    >>> split_of("os.py") in ("train", "heldout")
    True
    """
    h = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h < heldout_fraction * 2.0**64 else "train"


@dataclass(frozen=True)
class Corpus:
    """One split of the corpus: raw file contents (bytes) in sorted path order."""

    split: str
    paths: tuple[str, ...]
    documents: tuple[bytes, ...]
    python_version: str
    root: str

    @property
    def n_bytes(self) -> int:
        return sum(len(d) for d in self.documents)

    def digest(self) -> str:
        """SHA-256 over paths and contents: identifies the exact text trained or evaluated on."""
        h = hashlib.sha256()
        for p, d in zip(self.paths, self.documents, strict=True):
            h.update(p.encode() + b"\0" + len(d).to_bytes(8, "big") + d)
        return h.hexdigest()

    def token_stream(self) -> np.ndarray:
        """All documents as one int64 id stream ``[N]``: ``BOS bytes EOS`` per document."""
        parts = []
        for d in self.documents:
            parts.append(np.array([BOS_ID], np.int64))
            parts.append(np.frombuffer(d, np.uint8).astype(np.int64))
            parts.append(np.array([EOS_ID], np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def texts(self) -> list[str]:
        """The documents decoded as UTF-8 (undecodable bytes replaced)."""
        return [d.decode("utf-8", errors="replace") for d in self.documents]


def load_corpus(split: str = "train", root: str | os.PathLike[str] | None = None,
                heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
    """Load one split (``"train"`` or ``"heldout"``) of the standard-library corpus.

    Raises ``FileNotFoundError`` when the interpreter ships no ``.py`` sources (some minimal
    distributions keep only bytecode).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    base = Path(root) if root is not None else stdlib_root()
    files = stdlib_files(base)
    if not files:
        raise FileNotFoundError(f"no .py sources under {str(base)!r}: this Python ships without "
                                "its standard library sources, so the offline corpus is missing")
    chosen = [f for f in files if split_of(f, heldout_fraction) == split]
    docs = tuple((base / f).read_bytes() for f in chosen)
    return Corpus(split=split, paths=tuple(chosen), documents=docs,
                  python_version=platform.python_version(), root=str(base))
