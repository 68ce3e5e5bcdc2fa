"""Randomness in the RL domain: every public function takes ``rng=``, an int seed, a
``numpy.random.Generator`` or None (SPEC 7).

- Rollouts (:func:`rollout_seeds`): with an int, ``SeedSequence(rng).spawn(2)`` gives the N reset
  seeds of the environments (32-bit, from the first child) and the generator of the draft and the
  verifier (the second child); with a Generator, the N reset seeds are drawn from it first
  (``rng.integers(2**32, size=N)``) and the Generator itself then draws the actions and the
  uniforms; with None the environments reset unseeded and a fresh generator is used.
- Functions that use their seed as a number (to seed torch, or one rollout call after another)
  take an int as it is and draw one from a Generator (:func:`int_seed`).

>>> seeds, gen = rollout_seeds(0, 2)
>>> seeds == rollout_seeds(0, 2)[0], isinstance(gen, np.random.Generator)
(True, True)
>>> int_seed(7), int_seed(np.random.default_rng(0)) == int_seed(np.random.default_rng(0))
(7, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["int_seed", "rollout_seeds"]


def _check(rng: Any) -> None:
    if isinstance(rng, (bool, np.bool_)) or not (
        rng is None or isinstance(rng, (int, np.integer, np.random.Generator))
    ):
        raise TypeError(f"rng must be an int seed, a numpy Generator or None, got {type(rng).__name__}")
    if isinstance(rng, (int, np.integer)) and rng < 0:
        raise ValueError(f"rng (a seed) must be a non-negative int, got {rng}")


def rollout_seeds(rng: int | np.random.Generator | None, n_envs: int) -> tuple[list, np.random.Generator]:
    """The reset seeds of ``n_envs`` environments and the generator of the draft and the verifier."""
    _check(rng)
    if rng is None:
        return [None] * n_envs, np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return [int(s) for s in rng.integers(2**32, size=n_envs)], rng
    env_ss, rng_ss = np.random.SeedSequence(int(rng)).spawn(2)
    return [int(s) for s in env_ss.generate_state(n_envs, dtype=np.uint32)], np.random.default_rng(rng_ss)


def int_seed(rng: int | np.random.Generator | None) -> int:
    """An int seed: ``rng`` itself when it is one, else drawn from it (from fresh entropy for None)."""
    _check(rng)
    if isinstance(rng, (int, np.integer)):
        return int(rng)
    gen = np.random.default_rng() if rng is None else rng
    return int(gen.integers(2**32))
