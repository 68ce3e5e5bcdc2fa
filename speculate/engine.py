"""speculate(f, f_star, g, x): speculative sampling of a pipeline ``Y ~ f(X); Z = g(Y)``.

The cheap ``f_star(x)`` proposes a guess; ``g(guess)`` starts in an executor while the slow ``f(x)``
runs; the guess is kept with probability min(1, p/q), otherwise replaced by a draw from the residual,
and ``g`` is computed again on the replacement. The returned value is distributed exactly as
``g(y)`` with ``y ~ f(x)`` (proofs/01, proofs/09).

Contract on ``g``: it is called on the guess before the guess is verified, so it must have no side
effects that matter when its result is thrown away (or the caller accepts them). On rejection,
``g(guess)``'s result or exception is discarded (a running call cannot be interrupted; it finishes
in its worker). Exceptions from ``f`` or ``f_star`` propagate; an exception from ``g`` propagates
only when it is the result of ``g`` on the final sample.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from .distributions import as_distribution
from .rng import as_rng
from .verify import DEFAULT_MAX_TRIES, verify_one

__all__ = ["SpeculationResult", "speculate", "speculative_sample"]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _default_executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(4, os.cpu_count() or 1), thread_name_prefix="speculate")
            atexit.register(_pool.shutdown, wait=False)
        return _pool


class SpeculationResult(NamedTuple):
    """What :func:`speculate` returns."""

    value: Any  #: g(sample)
    sample: Any  #: the sample y, distributed exactly as f(x)
    accepted: bool  #: whether the draft's guess was kept (then g ran concurrently with f)


def speculative_sample(
    p: Any,
    q: Any,
    rng: int | np.random.Generator | None = None,
    *,
    draft: Any = None,
    max_tries: int = DEFAULT_MAX_TRIES,
) -> tuple[Any, Any]:
    """One exact draw from ``p`` that reuses one draft drawn from ``q``.

    Returns ``(y, accepted)``: ``y ~ p`` exactly; ``accepted`` tells whether ``y`` is the draft
    (probability sum(min(p, q)) = 1 - TV(p, q)). Pass ``draft=`` when the draft outcome was already
    drawn from ``q`` (it must have been, for the result to be exact); otherwise one is drawn here.
    Batched Categorical or Normal pairs give arrays of outcomes and of acceptance flags.

    >>> import speculate as sp
    >>> y, kept = sp.speculative_sample(sp.Categorical(probs=[0.6, 0.4]), sp.Categorical(probs=[0.8, 0.2]), rng=0)
    >>> y in (0, 1), isinstance(kept, bool)
    (True, True)
    """
    rng = as_rng(rng)
    p, q = as_distribution(p), as_distribution(q)
    x = q.sample(rng) if draft is None else draft
    return verify_one(p, q, x, rng, max_tries)


def speculate(
    f: Callable[[Any], Any],
    f_star: Callable[[Any], Any],
    g: Callable[[Any], Any],
    x: Any,
    *,
    rng: int | np.random.Generator | None = None,
    executor: Executor | None = None,
    max_tries: int = DEFAULT_MAX_TRIES,
) -> SpeculationResult:
    """Compute ``g(y)`` with ``y ~ f(x)``, overlapping ``g`` with ``f`` through a guess from ``f_star``.

    ``f(x)`` and ``f_star(x)`` return distributions (:class:`Categorical`, :class:`Normal`,
    :class:`PointMass`, ``from_scipy``/``from_torch`` adapters, or any object with ``sample(rng)``
    and ``log_prob(y)``); a plain value means a point mass, and then this is classic speculative
    execution (keep the guess iff it equals f's value). ``g`` runs in ``executor`` (default: a
    shared thread pool; any ``concurrent.futures.Executor`` works, e.g. a ProcessPoolExecutor for
    CPU-bound Python ``g``) while ``f`` runs in the calling thread. Same ``rng`` seed, same result.

    >>> import time, speculate as sp
    >>> def f(x):  time.sleep(0.01); return sp.Categorical(probs=[0.5, 0.3, 0.2])
    >>> def f_star(x): return sp.Categorical(probs=[0.4, 0.4, 0.2])
    >>> def g(y):  time.sleep(0.01); return 10 * y
    >>> res = sp.speculate(f, f_star, g, x=None, rng=0)
    >>> res.value == 10 * res.sample
    True
    """
    rng = as_rng(rng)
    q = as_distribution(f_star(x))
    guess = q.sample(rng)
    pool = executor if executor is not None else _default_executor()
    future: Future = pool.submit(g, guess)
    try:
        p = as_distribution(f(x))
        y, kept = verify_one(p, q, guess, rng, max_tries)
    except BaseException:
        future.cancel()
        raise
    accepted = bool(np.all(kept))
    if accepted:
        return SpeculationResult(future.result(), y, True)
    future.cancel()
    return SpeculationResult(g(y), y, False)
