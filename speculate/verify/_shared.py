"""What every verification kernel shares: its status codes and messages, the drafted entries it
reads, and its output arrays. The inverse-CDF draws live in speculate/_inverse_cdf.py (shared with
Categorical.sample).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .._inverse_cdf import EMPTY, NEGATIVE, NOT_FINITE, OK

# status codes returned by the kernels (0 = ok; NOT_FINITE, EMPTY and NEGATIVE come from the draws)
BAD_INDEX, Q_ZERO, BAD_LENGTH = 1, 2, 5
MESSAGES = {
    BAD_LENGTH: "lengths must lie in 0..K (the number of drafts per row)",
    BAD_INDEX: "drafted outcome is outside 0..V-1",
    Q_ZERO: "drafted outcome has draft probability q = 0 (it cannot have been drawn from q)",
    NOT_FINITE: "probabilities contain NaN or inf, or a negative value in a row drawn from",
    EMPTY: "a probability row has no positive mass",
    NEGATIVE: "probabilities contain a negative value",
}


@nb.njit(nogil=True, cache=True, inline="always")
def draft_probs(p, q, drafts, b, i):
    """(p_i(x_i), q_i(x_i), status) for row b's i-th draft x_i; status is OK or why they are unusable.

    Shared by the token and block kernels and, through ``draft_probs.py_func``, their NumPy twins.
    """
    x = drafts[b, i]
    if x < 0 or x >= p.shape[2]:
        return 0.0, 0.0, BAD_INDEX
    px, qx = np.float64(p[b, i, x]), np.float64(q[b, i, x])
    if not (np.isfinite(qx) and np.isfinite(px)):
        return 0.0, 0.0, NOT_FINITE
    if px < 0.0 or qx < 0.0:
        return 0.0, 0.0, NEGATIVE
    if qx == 0.0:
        return 0.0, 0.0, Q_ZERO
    return px, qx, OK


def outputs(B: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fresh (n_accepted, next_outcome, status, where) arrays for B rows, as every kernel returns."""
    out = np.zeros((4, B), np.int64)  # one allocation, four contiguous rows
    out[1] = -1
    return out[0], out[1], out[2], out[3]
