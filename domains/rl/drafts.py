"""The draft of speculative rollouts: a cheap policy per environment, sampled with the round's fresh rng.

:class:`PolicyDraft` holds the draft policy of each environment. At every drafted step the process
asks it for the draft's action distributions at the current observations of the rows still
drafting (ONE call per distinct policy object) and then for one action per row, drawn from those
distributions with the round's ``rng``. Verification is done by the round loop, never here.

The draws must be fresh: replaying earlier randomness here (for instance sampling with the
environment's generator, which restoring a snapshot rewinds) would bias block verification
(proofs/05-chains.md, statement 4); tests/rl/test_rl_noise.py overrides :meth:`PolicyDraft.sample`
with such a replay to show that its checks catch it.

>>> import gymnasium as gym, numpy as np
>>> from speculate.domains.rl.policies import TabularPolicy, prepare
>>> env = gym.make("FrozenLake-v1")
>>> draft = PolicyDraft([prepare(TabularPolicy(np.full((16, 4), 0.25)))], env.observation_space, env.action_space)
>>> dist = draft.distributions([0], [5])
>>> dist.probs.tolist(), draft.sample(dist, np.array([0]), np.array([3]), np.random.default_rng(0)).shape
([[0.25, 0.25, 0.25, 0.25]], (1,))
>>> greedy = PolicyDraft(draft.policies, env.observation_space, env.action_space, greedy=True)
>>> greedy.sample(dist, np.array([0]), np.array([3]), None).tolist()   # the first maximum
[0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from speculate.distributions import Categorical, Normal

from .policies import action_arrays

__all__ = ["PolicyDraft"]


class PolicyDraft:
    """The draft policies of N environments (``policies[r]`` drafts for environment r).

    ``greedy=True`` (greedy verification, Discrete actions): the drafted action is the argmax (first
    maximum) of the draft's distribution instead of a draw from it. Greedy verification keeps a
    drafted action while it equals the policy's argmax, so a sampled draft would throw away most of
    its agreement (a draft equal to the policy kept 0.34 of its drafts); the argmax keeps all of them.
    """

    def __init__(
        self, policies: Sequence[Callable], obs_space: Any, action_space: Any, *, greedy: bool = False
    ) -> None:
        self.policies = list(policies)
        self.obs_space, self.action_space = obs_space, action_space
        self.discrete = hasattr(action_space, "n")
        if greedy and not self.discrete:
            raise ValueError("greedy drafting (the argmax action) needs a Discrete action space")
        self.greedy = bool(greedy)

    def distributions(self, rows: Sequence[int], observations: Sequence[Any]) -> Categorical | Normal:
        """The draft's action distributions at ``observations[i]`` of environment ``rows[i]``:
        a Categorical ``[M, A]`` or a Normal ``(M,) x shape``."""
        d = action_arrays(self.policies, rows, observations, self.obs_space, self.action_space, "draft policy")
        if self.discrete:
            return Categorical(probs=d, validate=False)
        return Normal(d[0], d[1], batch_ndims=1, validate=False)

    def sample(self, dist: Categorical | Normal, rows: np.ndarray, steps: np.ndarray, rng: np.random.Generator) -> Any:
        """One drafted action per row: fresh draws from ``dist`` with the round's ``rng`` (the argmax,
        first maximum, when ``greedy``; ``rng`` is then not used).

        ``rows``: the environments; ``steps``: the step of its episode each action is drafted for
        (0 for the first action after reset). A correct draft ignores both; a draft that replayed
        randomness would key it on them.
        """
        if self.greedy:
            return np.argmax(dist.probs, axis=-1)
        return dist.sample(rng)
