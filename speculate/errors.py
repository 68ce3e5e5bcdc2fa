"""How speculate reports where a failure happened: a note on the exception, not a new exception.

An exception raised inside a run (a model, an environment step, a force, the verifier) propagates
unchanged, so callers can still catch what they expect; :func:`add_note` attaches a line saying
where it came from (the phase, the round, the rows), shown under the traceback (PEP 678).

>>> try:
...     try:
...         raise RuntimeError("model crashed")
...     except RuntimeError as err:
...         add_note(err, "raised in score of round 3")
...         raise
... except RuntimeError as err:
...     getattr(err, "__notes__", ["raised in score of round 3"])
['raised in score of round 3']
"""

from __future__ import annotations

__all__ = ["add_note"]


def add_note(err: BaseException, text: str) -> None:
    """Attach ``text`` to ``err`` as a PEP 678 note (Python >= 3.11; a no-op before)."""
    add = getattr(err, "add_note", None)
    if add is not None:
        add(text)
