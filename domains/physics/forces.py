"""Calling a force: the signature every force and draft force follows, and the checks of its output.

A force is any function ``force(X[B, N, d]) -> [B, N, d]`` (NumPy or torch output) that scores a
batch of configurations in one call. :func:`evaluate_force` calls it once and checks the shape;
finiteness is returned per configuration, not raised, because a non-finite force at a drafted
configuration the chain never reaches must not stop a run; :func:`nonfinite_error` names the step,
row and particle when the chain does reach one.

>>> import numpy as np
>>> F, finite = evaluate_force(lambda X: -X, np.ones((2, 3, 1)), who="force", steps=0)
>>> F.shape, finite.tolist()
((2, 3, 1), [True, True])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ForceFn", "evaluate_force", "nonfinite_error", "to_numpy"]

ForceFn = Callable[[np.ndarray], Any]
"""force(X[B, N, d]) -> forces [B, N, d] (NumPy array or torch tensor), one call for the batch."""


def to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):             # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def evaluate_force(
    fn: ForceFn, X: np.ndarray, *, who: str, steps: np.ndarray | int, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Call ``fn(X[B, N, d])`` once; check its shape; return (forces [B, N, d], finite [B]).

    ``steps[b]`` is the step of the chain that configuration b belongs to and ``rows[b]`` its row:
    both only name the problem in error messages. Finiteness is returned, not raised, because a
    non-finite force at a drafted configuration that is never reached must not stop the run.
    """
    out = fn(X)
    F = to_numpy(out)
    if F.shape != X.shape:
        raise ValueError(
            f"{who} returned shape {tuple(F.shape)} for configurations of shape {tuple(X.shape)} "
            "(expected the same shape [B, N, d])"
        )
    finite = np.isfinite(F).reshape(F.shape[0], -1).all(axis=1)         # [B]
    return F, finite


def nonfinite_error(who: str, F: np.ndarray, b: int, step: int, row: int | None) -> ValueError:
    """A ValueError naming the step, row and first bad particle of a non-finite force."""
    bad = np.argwhere(~np.isfinite(F[b]))[0]
    where = f"row {row}, " if row is not None else ""
    return ValueError(
        f"{who} is not finite at step {step} ({where}particle {bad[0]}, coordinate {bad[1]}: "
        f"{F[b][tuple(bad)]}); the configuration has left the region where the force is defined"
    )
