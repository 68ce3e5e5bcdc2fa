"""Conformance cases of the RL domain: speculative rollouts on slippery FrozenLake vs the exact law.

Each case draws ``n`` independent episodes from :func:`speculate.domains.rl.speculative_rollouts` in
batches whose rows alternate between two **configurations** (:class:`Config`): two maps (the
standard 4x4 and :data:`MAP_B`) and two (policy, draft) pairs, so rows of one batch follow
different laws and one policy call per round serves both policies. An episode is reduced to its
configuration and its first three (action, observation) pairs, ``(c, o_0, a_1, o_1, a_2, o_2, a_3,
o_3)`` (shorter when it falls in a hole or reaches the goal); the law of that outcome is computed
exactly from the policies and ``env.unwrapped.P`` (:func:`mixed_law`, from
:func:`speculate.domains.rl.trajectory_law.trajectory_law`).

The inputs are chosen to matter: the environment is random (each move slips with probability 2/3,
so restoring its RNG with the snapshot is tested), episodes end inside drafted blocks, the policies
put zero mass on two or three of the four actions in every state while the drafts propose them
(always rejected), the drafts never propose one of the policy's actions in some states (only the
residual produces it), alpha is about 0.6, and the three steps always span at least two rounds
with ``lookahead=1`` (the token case) and do on every rejection with ``lookahead=2`` (the block
case).

Power: with ``n = 100_000`` each case catches a total-variation deviation of 0.02 (over its
cells) with probability 0.99 at level ``speculate.testing.DEFAULT_ALPHA``
(``ConformanceCase.detectable_tv``; tests/rl/test_rl_exactness.py asserts it).

>>> cases = conformance_cases()
>>> [c.name for c in cases]
['rl: slippery FrozenLake, token, k=1, two maps and policies in one batch', \
'rl: slippery FrozenLake, block, k=2, two maps and policies in one batch']
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .api import speculative_rollouts
from .policies import TabularPolicy
from .seeding import int_seed
from .trajectory_law import trajectory_key, trajectory_law

__all__ = [
    "MAP_B",
    "Config",
    "conformance_cases",
    "default_configs",
    "frozenlake_pair",
    "mixed_law",
    "sample_keys",
    "sample_mixed",
    "sparse_pair",
]

MAP_B = ["SFHF", "FFFF", "HFFF", "FFFG"]  #: a second 4x4 map (holes near the start), so rows of one batch differ
N_CASE = 100_000  #: samples per conformance case: TV 0.02 at level 1e-6 with power 0.99


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


def sparse_pair(rng: int | np.random.Generator | None, n_states: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A policy ``P`` [S, 4] that takes one or two of the four actions in each state (zeros elsewhere)
    and a draft ``Q`` that mixes it half and half with a random table over all four actions, and in
    about 40% of the two-action states never proposes one of the policy's actions.

    So the draft proposes actions the policy never takes (q > 0 = p: always rejected) and misses
    actions it takes (p > 0 = q: only the residual produces them).

    >>> P, Q = sparse_pair(rng=1)
    >>> bool(((P > 0).sum(axis=1) <= 2).all()), bool(((P > 0) & (Q == 0)).any()), bool(((Q > 0) & (P == 0)).any())
    (True, True, True)
    """
    rng = np.random.default_rng(rng)
    P, Q = np.zeros((n_states, 4)), np.zeros((n_states, 4))
    for s in range(n_states):
        m = int(rng.integers(1, 3))
        acts = rng.choice(4, m, replace=False)
        P[s, acts] = rng.dirichlet(np.full(m, 1.5))
        q = 0.5 * P[s] + 0.5 * rng.dirichlet(np.full(4, 0.7))
        if m == 2 and rng.random() < 0.4:
            q[rng.choice(acts)] = 0.0
        Q[s] = q / q.sum()
    return P, Q


@dataclass(frozen=True)
class Config:
    """One kind of row: a slippery FrozenLake map, the policy ``P`` and the draft ``Q`` (tables [S, 4])."""

    desc: Sequence[str] | None  #: the map (None: the standard 4x4)
    P: np.ndarray
    Q: np.ndarray
    name: str = "4x4"  #: FrozenLake's map_name when desc is None

    def make(self) -> Any:
        """The environment without gymnasium's wrappers (TimeLimit, order and passive checkers): the
        law of the first steps is the same, and sampling is about 15% faster (the bit-exact tests of
        tests/rl cover the wrappers)."""
        import gymnasium as gym

        return gym.make("FrozenLake-v1", desc=None if self.desc is None else list(self.desc),
                        map_name=self.name, is_slippery=True).unwrapped


def default_configs() -> list[Config]:
    """The two configurations of the conformance cases (alpha about 0.6 each; 51 and 66 cells of
    three steps)."""
    return [Config(None, *sparse_pair(1)), Config(MAP_B, *sparse_pair(3))]


def mixed_law(configs: Sequence[Config], steps: int) -> dict[tuple, float]:
    """The exact law of ``(c, o_0, a_1, o_1, ...)`` (first ``steps`` steps) when the rows alternate
    between ``configs`` (configuration ``c`` with probability 1 / len(configs)).

    >>> law = mixed_law(default_configs(), steps=3)
    >>> round(sum(law.values()), 12), len(law)
    (1.0, 117)
    """
    law: dict[tuple, float] = {}
    for c, cfg in enumerate(configs):
        for key, p in trajectory_law(cfg.make(), cfg.P, steps).items():
            law[(c, *key)] = p / len(configs)
    return law


@contextmanager
def _frozen_gc() -> Iterator[None]:
    """Sampling makes many short-lived objects next to the long-lived ones of a test process; moving
    those to the permanent generation (``gc.freeze``) spares the full collections from scanning them
    again and again (about 1.5x faster). The samples are the same."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def sample_mixed(
    configs: Sequence[Config],
    n: int,
    *,
    steps: int,
    max_steps: int,
    lookahead: int | str,
    verify: str,
    rng: int | np.random.Generator | None,
    batch: int = 1000,
    cost_ratio: float | None = None,
) -> list[tuple]:
    """``n`` outcomes ``(c, o_0, a_1, o_1, ...)`` of independent speculative episodes, exactly
    ``n / len(configs)`` of each configuration (``n`` must be a multiple of it).

    Each call of ``speculative_rollouts`` runs ``batch`` environments whose rows alternate between
    the configurations (environment i has configuration i % len(configs)), with a fresh seed per call
    (``seed * 1_000_003 + call``, ``seed`` = ``rng`` when it is an int, else an int drawn from it).
    ``lookahead="auto"`` needs ``cost_ratio`` here: with measured timings the chosen k, and so the
    samples, would depend on the machine and not be reproducible from the seed (the law would be
    the same).
    """
    C = len(configs)
    if n % C:
        raise ValueError(f"n={n} must be a multiple of the number of configurations ({C})")
    if lookahead == "auto" and cost_ratio is None:
        raise ValueError("lookahead='auto' needs cost_ratio= here, so that the seeded samples are reproducible")
    seed = int_seed(rng)
    batch = max(C, batch - batch % C)
    envs = [configs[i % C].make() for i in range(min(batch, n))]
    policies = [TabularPolicy(cfg.P) for cfg in configs]
    drafts = [TabularPolicy(cfg.Q) for cfg in configs]
    keys: list[tuple] = []
    call = 0
    with _frozen_gc():
        while len(keys) < n:
            m = min(len(envs), n - len(keys))
            out = speculative_rollouts(envs[:m], [policies[i % C] for i in range(m)],
                                       [drafts[i % C] for i in range(m)], max_steps=max_steps,
                                       lookahead=lookahead, verify=verify, rng=seed * 1_000_003 + call,
                                       cost_ratio=cost_ratio)
            keys += [(i % C, *trajectory_key(t, steps)) for i, t in enumerate(out)]
            call += 1
    return keys


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
    cost_ratio: float | None = None,
) -> list[tuple]:
    """``n`` outcomes ``(o_0, a_1, o_1, ...)`` (first ``pairs`` steps) of independent speculative episodes.

    Runs ``speculative_rollouts`` on ``batch`` environments at a time (rows are independent chains),
    with a fresh seed per call (``seed * 1_000_003 + call``, ``seed`` = ``rng`` when it is an int,
    else an int drawn from it). ``policy``/``draft`` may be lists, one per environment of a batch.
    ``lookahead="auto"`` needs ``cost_ratio`` (reproducible samples; see :func:`sample_mixed`).
    """
    if lookahead == "auto" and cost_ratio is None:
        raise ValueError("lookahead='auto' needs cost_ratio= here, so that the seeded samples are reproducible")
    seed = int_seed(rng)
    envs = [make_env() for _ in range(min(batch, n))]
    keys: list[tuple] = []
    call = 0
    with _frozen_gc():
        while len(keys) < n:
            m = min(len(envs), n - len(keys))
            pol = policy[:m] if isinstance(policy, list) else policy
            dr = draft[:m] if isinstance(draft, list) else draft
            out = speculative_rollouts(envs[:m], pol, dr, max_steps=max_steps, lookahead=lookahead,
                                       verify=verify, rng=seed * 1_000_003 + call, cost_ratio=cost_ratio)
            keys += [trajectory_key(t, pairs) for t in out]
            call += 1
    return keys


def _case(verify: str, lookahead: int, n: int) -> Any:
    from speculate.testing import ConformanceCase

    configs = default_configs()
    law = mixed_law(configs, steps=3)

    def sample(n: int, seed: int) -> list:
        return sample_mixed(configs, n, steps=3, max_steps=3, lookahead=lookahead, verify=verify, rng=seed)

    name = f"rl: slippery FrozenLake, {verify}, k={lookahead}, two maps and policies in one batch"
    return ConformanceCase(name, sample, law, n=n)


def conformance_cases() -> list:
    """The RL cases of the shared conformance suite (each catches TV 0.02; about 10 s each on one
    CPU core)."""
    return [_case("token", 1, N_CASE), _case("block", 2, N_CASE)]
