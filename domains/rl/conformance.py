"""Conformance cases of the RL domain: speculative rollouts on slippery FrozenLake vs the exact law.

Each case draws ``n`` independent episodes from :func:`speculate.domains.rl.speculative_rollouts` (a random
stochastic tabular policy, a perturbed draft, the environment's own slippery transitions) and
reduces each to its first two (action, observation) pairs ``(o_0, a_1, o_1, a_2, o_2)``; the law of
that outcome is computed exactly from the policy and ``env.unwrapped.P``
(:func:`speculate.domains.rl.trajectory_law.trajectory_law`). With ``max_steps=3`` and ``lookahead=2`` the first round
drafts two steps, so the outcome covers a full round's decision (both drafts, the verifier's draw and
its environment step) and the start of the next round.

>>> cases = conformance_cases()
>>> [c.name for c in cases]
['rl: slippery FrozenLake, token, k=2', 'rl: slippery FrozenLake, block, k=2']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .api import speculative_rollouts
from .policies import TabularPolicy
from .seeding import int_seed
from .trajectory_law import trajectory_key, trajectory_law

__all__ = ["conformance_cases", "frozenlake_pair", "sample_keys"]


def frozenlake_pair(
    rng: int | np.random.Generator | None, n_states: int = 16, mix: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """A random stochastic tabular policy ``P`` [S, 4] and a draft ``Q`` that mixes it with noise,
    drawn with ``rng`` (an int seed, a Generator or None).

    ``mix`` is the weight of an independent random table in the draft (0: the draft equals the policy).

    >>> P, Q = frozenlake_pair(rng=11)
    >>> P.shape, bool(np.allclose(Q.sum(axis=1), 1.0))
    ((16, 4), True)
    """
    rng = np.random.default_rng(rng)
    P = rng.dirichlet(np.full(4, 0.7), size=n_states)
    Q = (1 - mix) * P + mix * rng.dirichlet(np.full(4, 0.7), size=n_states)
    return P, Q


def sample_keys(
    make_env: Callable[[], Any],
    policy: Any,
    draft: Any,
    n: int,
    *,
    pairs: int,
    max_steps: int,
    lookahead: int | str,
    verify: str,
    rng: int | np.random.Generator | None,
    batch: int = 500,
) -> list[tuple]:
    """``n`` outcomes ``(o_0, a_1, o_1, ...)`` (first ``pairs`` steps) of independent speculative episodes.

    Runs ``speculative_rollouts`` on ``batch`` environments at a time (rows are independent chains),
    with a fresh seed per call (``seed * 1_000_003 + call``, ``seed`` = ``rng`` when it is an int,
    else an int drawn from it). ``policy``/``draft`` may be lists, one per environment of a batch.
    """
    seed = int_seed(rng)
    envs = [make_env() for _ in range(min(batch, n))]
    keys: list[tuple] = []
    call = 0
    while len(keys) < n:
        m = min(len(envs), n - len(keys))
        pol = policy[:m] if isinstance(policy, list) else policy
        dr = draft[:m] if isinstance(draft, list) else draft
        out = speculative_rollouts(envs[:m], pol, dr, max_steps=max_steps, lookahead=lookahead,
                                   verify=verify, rng=seed * 1_000_003 + call)
        keys += [trajectory_key(t, pairs) for t in out]
        call += 1
    return keys


def _case(verify: str, n: int) -> Any:
    import gymnasium as gym

    from speculate.testing import ConformanceCase

    P, Q = frozenlake_pair(rng=11)

    def make() -> Any:
        return gym.make("FrozenLake-v1", is_slippery=True)

    law = trajectory_law(make(), P, steps=2)

    def sample(n: int, seed: int) -> list:
        return sample_keys(make, TabularPolicy(P), TabularPolicy(Q), n, pairs=2, max_steps=3,
                           lookahead=2, verify=verify, rng=seed)

    return ConformanceCase(f"rl: slippery FrozenLake, {verify}, k=2", sample, law, n=n)


def conformance_cases() -> list:
    """The RL cases of the shared conformance suite (about 10 s together on one CPU core)."""
    return [_case("token", 5000), _case("block", 5000)]
