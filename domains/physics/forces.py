"""Calling a force: the signature every force and draft force follows, and the checks of its output.

A force is any function ``force(X[B, N, d]) -> [B, N, d]`` (NumPy or torch output, any real
dtype) that scores a batch of configurations in one call. :func:`evaluate_force` calls it once on
its own copy of the configurations (a force that modifies its input cannot change the chain),
converts the output to float64 and checks its type and shape; finiteness is returned per
configuration, not raised, because a non-finite force at a drafted configuration the chain never
reaches must not stop a run; :func:`nonfinite_error` names the step, row and particle when the
chain does reach one. :func:`transition_means` computes the Euler-Maruyama means and says where
they are defined (finite, within :data:`MEAN_LIMIT`); :func:`overflow_error` names the step where
the chain leaves that range.

>>> import numpy as np
>>> F, finite = evaluate_force(lambda X: -X, np.ones((2, 3, 1)), who="force", steps=0)
>>> F.shape, finite.tolist()
((2, 3, 1), [True, True])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "MEAN_LIMIT",
    "ForceFn",
    "evaluate_force",
    "nonfinite_error",
    "overflow_error",
    "to_numpy",
    "transition_means",
]

ForceFn = Callable[[np.ndarray], Any]
"""force(X[B, N, d]) -> forces [B, N, d] (NumPy array or torch tensor), one call for the batch."""

MEAN_LIMIT = float(np.finfo(np.float64).max) / 2
"""The largest |x + dt F(x) / gamma| a step may start from (half the largest float64, 9e307): beyond
it the next configuration could overflow, so both samplers raise there (the same step) instead."""


def to_numpy(value: Any, who: str = "value") -> np.ndarray:
    """``value`` (an array, a torch tensor, nested lists; any real dtype) as a float64 array.

    Raises TypeError naming ``who`` for booleans, complex numbers, strings and other non-numbers
    (a silent cast would drop an imaginary part or read True as 1), ValueError for ragged lists.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        t = value.detach().cpu()
        if t.is_complex() or str(t.dtype) == "torch.bool":
            raise TypeError(f"{who} must hold real numbers (float or int), got a torch tensor of {t.dtype}")
        value = t.double().numpy()  # any float dtype, bfloat16 included
    try:
        a = np.asarray(value)
    except (ValueError, TypeError) as err:  # ragged nested lists
        raise ValueError(f"{who} is not an array of real numbers: {err}") from None
    if a.dtype.kind == "O":  # an object array: numbers are fine, anything else is not
        try:
            a = a.astype(np.float64)
        except (ValueError, TypeError) as err:
            raise TypeError(f"{who} must hold real numbers (float or int): {err}") from None
    elif a.dtype.kind not in "iuf":
        raise TypeError(f"{who} must hold real numbers (float or int), got dtype {a.dtype}")
    return a.astype(np.float64, copy=False)


def evaluate_force(
    fn: ForceFn, X: np.ndarray, *, who: str, steps: np.ndarray | int, private: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Call ``fn(X[B, N, d])`` once; check its output; return (forces [B, N, d] float64, finite [B]).

    ``fn`` gets a copy of ``X`` (``private=True``: ``X`` is already a fresh array that the caller
    does not read again), so a force that writes into its input cannot change the chain. The returned forces may
    be the force's own array: callers do not write into them. ``steps`` (the step of each
    configuration) is for the caller's error messages. Finiteness is returned, not raised, because
    a non-finite force at a drafted configuration that is never reached must not stop the run.
    """
    out = fn(X if private else X.copy())
    F = to_numpy(out, who=f"{who} output")
    if F.shape != X.shape:
        raise ValueError(
            f"{who} returned shape {tuple(F.shape)} for configurations of shape {tuple(X.shape)} "
            "(expected the same shape [B, N, d])"
        )
    finite = np.isfinite(F).reshape(F.shape[0], -1).all(axis=1)  # [B]
    return F, finite


def transition_means(model: Any, X: np.ndarray, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Euler-Maruyama means ``X + dt F / gamma`` ([..., N, d]) and where they are defined
    (bool [...]: finite and within +-MEAN_LIMIT), without overflow warnings."""
    with np.errstate(over="ignore", invalid="ignore"):
        M = model.mean(X, F)
        ok = (np.abs(M) <= MEAN_LIMIT).reshape(*M.shape[:-2], -1).all(axis=-1)  # NaN compares False
    return M, ok


def nonfinite_error(who: str, F: np.ndarray, b: int, step: int, row: int | None) -> ValueError:
    """A ValueError naming the step, row and first bad particle of a non-finite force."""
    bad = np.argwhere(~np.isfinite(F[b]))[0]
    where = f"row {row}, " if row is not None else ""
    return ValueError(
        f"{who} is not finite at step {step} ({where}particle {bad[0]}, coordinate {bad[1]}: "
        f"{F[b][tuple(bad)]}); the configuration has left the region where the force is defined"
    )


def overflow_error(M: np.ndarray, b: int, step: int, row: int | None) -> ValueError:
    """A ValueError naming the step, row and first particle whose Euler-Maruyama mean overflows."""
    bad = np.argwhere(~(np.abs(M[b]) <= MEAN_LIMIT))[0]
    where = f"row {row}, " if row is not None else ""
    return ValueError(
        f"the Euler-Maruyama mean x + dt F / gamma overflows at step {step} ({where}particle {bad[0]}, "
        f"coordinate {bad[1]}: {M[b][tuple(bad)]}, beyond +-{MEAN_LIMIT:.3g}); the configuration has "
        "left the range float64 can follow: use a smaller dt or a bounded force"
    )
