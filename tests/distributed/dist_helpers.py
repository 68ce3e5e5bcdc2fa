"""Models shared by the distributed tests: a second-order chain, RL policies, a Langevin model, a text
generator; all picklable (this module is registered with cloudpickle by value for Dask and Ray,
whose workers do not have tests/ on their path)."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np

import speculate as sp

V = 3
_rng = np.random.default_rng(7)
T = _rng.dirichlet(np.full(V, 0.6), (2, V + 1, V + 1))  # per context c and the last two outcomes
Q = _rng.dirichlet(np.full(V, 0.6), (2, V + 1, V + 1))
T[0, V, V] = [0.7, 0.0, 0.3]  # a zero in the target and a one-hot draft
Q[1, V, V] = [0.0, 1.0, 0.0]


def _ctx(states):
    s = np.asarray(states, dtype=np.int64).reshape(len(states), 3)
    return s[:, 0], s[:, 1], s[:, 2]


def target(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=T[c, a, b], validate=False)


@sp.batched
def draft(states):
    c, a, b = _ctx(states)
    return sp.Categorical(probs=Q[c, a, b], validate=False)


def step(state, x):
    return (state[0], state[2], int(x))


def starts(rows: int) -> list:
    """Rows alternate between the two contexts."""
    return [(i % 2, V, V) for i in range(rows)]


def joint_law(c: int, length: int = 3) -> dict:
    import itertools

    law = {}
    for seq in itertools.product(range(V), repeat=length):
        pr, a, b = 1.0, V, V
        for x in seq:
            pr *= T[c, a, b][x]
            a, b = b, x
        law[seq] = pr
    return law


class SlowTarget:
    """``target`` that sleeps ``delay`` seconds per call and writes its process id into ``pid_dir`` on
    its first call in a process (so a test can kill a worker that is running a shard), and a line per
    call into ``calls.log`` (a re-run shard shows as more calls than the undisturbed run makes)."""

    def __init__(self, delay: float, pid_dir: str | None = None) -> None:
        self.delay, self.pid_dir = delay, pid_dir

    def __call__(self, states):
        if self.pid_dir is not None:
            mark = Path(self.pid_dir) / str(os.getpid())
            if not mark.exists():
                mark.write_text(str(time.time()))
            with open(Path(self.pid_dir) / "calls.log", "a") as f:  # one line per call, every attempt
                f.write(f"{os.getpid()}\n")
        time.sleep(self.delay)
        return target(states)


class Boom:
    """``target`` that raises once a chain of context 1 has drawn an outcome."""

    def __call__(self, states):
        c, _, b = _ctx(states)
        if (c == 1).any() and (b != V).any():
            raise RuntimeError("user's target failed")
        return target(states)


def frozenlake_policies():
    """(policy, draft) tabular policies for FrozenLake-v1 (16 states, 4 actions)."""
    from speculate.domains.rl import TabularPolicy

    rng = np.random.default_rng(0)
    pol = TabularPolicy(rng.dirichlet(np.ones(4), size=16))
    return pol, TabularPolicy(0.8 * pol.probs + 0.05)


def frozenlake():
    import gymnasium as gym

    return gym.make("FrozenLake-v1")


def cartpole():
    import gymnasium as gym

    return gym.make("CartPole-v1")


def langevin():
    from speculate.domains.physics import DoubleWell, Langevin

    return Langevin(force=DoubleWell(), draft_force=DoubleWell(tilt=0.5), dt=1e-2)


@functools.lru_cache(maxsize=1)
def _pair():
    from speculate.domains.text.examples.pair import load_pair

    return load_pair()


def text_generator(lookahead: int = 3):
    """A SpeculativeGenerator over the embedded pair (with its byte tokenizer)."""
    import torch
    from speculate.domains.text import SpeculativeGenerator

    torch.set_num_threads(1)  # the same float reductions in every process
    t, d, tok = _pair()
    return SpeculativeGenerator(t, d, lookahead=lookahead, tokenizer=tok)


def same_episodes(a, b) -> None:
    """Two sets of episodes are identical step by step (as tests/rl/rl_helpers.same_episodes)."""
    assert len(a) == len(b)
    for ta, tb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ta.observations, tb.observations)
        np.testing.assert_array_equal(ta.actions, tb.actions)
        np.testing.assert_array_equal(ta.rewards, tb.rewards)
        assert (ta.terminated, ta.truncated) == (tb.terminated, tb.truncated)


PROMPTS = ["def ", "import os\n", "class A:\n    ", "x = [", "for i in ", "return "]
