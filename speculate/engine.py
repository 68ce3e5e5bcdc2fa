"""speculate(f, f_star, g, x): speculative sampling of a pipeline ``Y ~ f(X); Z = g(Y)``.

The cheap ``f_star(x)`` proposes a guess; ``g(guess)`` starts in an executor while the slow ``f(x)``
runs; the guess is kept with probability min(1, p/q), otherwise replaced by a draw from the residual,
and ``g`` is computed again on the replacement. The returned value is distributed exactly as
``g(y)`` with ``y ~ f(x)`` (proofs/01, proofs/09).

Contract on ``g``: it is called on the guess before the guess is verified, so it must have no side
effects that matter when its result is thrown away (or the caller accepts them). ``g`` always runs
in the executor the caller gave: on the guess, and again on the replacement after a rejection, so
a ``g`` that the executor cannot run (an unpicklable function with a ProcessPoolExecutor) fails the
same way whatever the seed (with the default shared thread pool, ``g`` on a replacement runs in the
calling thread). On rejection, ``g(guess)``'s result or exception is discarded (a running call
cannot be interrupted; it finishes in its worker). Exceptions from ``f`` or ``f_star`` propagate
(KeyboardInterrupt too); an exception from ``g`` propagates only when it is the result of ``g`` on
the final sample. Every exception that propagates carries a note (PEP 678) naming the call it came
from.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from .distributions import Categorical, PointMass, as_distribution, plain_outcome
from .errors import add_note
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
    Batched Categorical or Normal pairs give arrays of outcomes and of acceptance flags. Outcomes are
    Python ``int`` / ``float`` for a scalar draw (a 0-d array or a torch scalar is converted), NumPy
    arrays for draws with batch or event axes, and a point mass's value as given
    (:func:`~speculate.distributions.plain_outcome`).

    >>> import speculate as sp
    >>> y, kept = sp.speculative_sample(sp.Categorical(probs=[0.6, 0.4]), sp.Categorical(probs=[0.8, 0.2]), rng=0)
    >>> y in (0, 1), isinstance(kept, bool)
    (True, True)
    """
    rng = as_rng(rng)
    _check_max_tries(max_tries)
    p, q = as_distribution(p, "p"), as_distribution(q, "q")
    if draft is not None and isinstance(q, Categorical):
        draft = _outcome_ids(draft)
    x = q.sample(rng) if draft is None else draft
    y, kept = verify_one(p, q, x, rng, max_tries)
    kept = kept.item() if isinstance(kept, np.generic) else kept
    return (y if isinstance(p, PointMass) else plain_outcome(y)), kept


def _outcome_ids(draft: Any) -> Any:
    """A Categorical's drafted outcomes as integers (an empty list or array becomes int64)."""
    if isinstance(draft, (int, np.integer)) and not isinstance(draft, (bool, np.bool_)):
        return draft
    arr = np.asarray(draft)
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"draft= for a Categorical must be outcome ids (integers), got dtype {arr.dtype}: pass the "
            "outcome that was drawn from q, e.g. q.sample(rng)"
        )
    return draft


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
    CPU-bound Python ``g``) while ``f`` runs in the calling thread; after a rejection ``g`` runs
    again on f's sample in the same executor. Same ``rng`` seed, same result. The arguments are
    checked before anything runs; an exception from a call propagates with a note naming the call.

    >>> import time, speculate as sp
    >>> def f(x):  time.sleep(0.01); return sp.Categorical(probs=[0.5, 0.3, 0.2])
    >>> def f_star(x): return sp.Categorical(probs=[0.4, 0.4, 0.2])
    >>> def g(y):  time.sleep(0.01); return 10 * y
    >>> res = sp.speculate(f, f_star, g, x=None, rng=0)
    >>> res.value == 10 * res.sample
    True
    """
    rng = as_rng(rng)
    for name, fn in (("f", f), ("f_star", f_star), ("g", g)):
        if not callable(fn):
            raise TypeError(f"speculate: {name} must be callable, got {type(fn).__name__}")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise TypeError(
            f"speculate: executor must be a concurrent.futures.Executor (an object with submit(fn, *args) "
            f"returning a Future), or None for the shared thread pool; got {type(executor).__name__}"
        )
    _check_max_tries(max_tries)
    phase = "f_star(x)"
    future: Future | None = None
    try:
        q = as_distribution(f_star(x), "f_star(x)")
        phase = "sampling the guess from f_star(x)"
        guess = q.sample(rng)
        pool = executor if executor is not None else _default_executor()
        phase = "the executor's submit(g, guess)"
        future = pool.submit(g, guess if isinstance(q, PointMass) else plain_outcome(guess))
        phase = "f(x)"
        p = as_distribution(f(x), "f(x)")
        phase = "the verification of f_star's guess against f(x)"
        y, kept = verify_one(p, q, guess, rng, max_tries)
        y = y if isinstance(p, PointMass) else plain_outcome(y)
        accepted = bool(np.all(kept))
        if accepted:
            phase = "g on the kept guess (run in the executor)"
            return SpeculationResult(future.result(), y, True)
        future.cancel()  # its result or exception is discarded
        future = None
        if executor is None:
            phase = "g on f's sample after the guess was rejected"
            return SpeculationResult(g(y), y, False)
        phase = "g on f's sample after the guess was rejected (run in the executor)"
        future = executor.submit(g, y)
        return SpeculationResult(future.result(), y, False)
    except BaseException as err:  # KeyboardInterrupt too: say where it came from, then let it go
        if future is not None:
            future.cancel()
        add_note(err, f"speculate.engine.speculate: raised in {phase}")
        raise


def _check_max_tries(max_tries: Any) -> None:
    if isinstance(max_tries, bool) or not isinstance(max_tries, (int, np.integer)):
        raise TypeError(f"max_tries must be an int >= 1, got {type(max_tries).__name__}")
    if max_tries < 1:
        raise ValueError(f"max_tries (tries of rejection sampling for a residual) must be >= 1, got {max_tries}")


