"""Faults in the middle of a run: an exception raised by an environment's step, the policy, the draft
or the verifier in round 3 of 10 (KeyboardInterrupt too) propagates unchanged, with the round loop's
note (phase, round, rows) and the domain's note (which environment and step, or which policy and
environments); before it leaves, every snapshot of the round is released and every environment is
back at its last committed state; and the next call on the same environment objects gives exactly
the episodes that fresh environments give with the same seed.

The schedule is exact, not statistical: the draft equals the policy (every draft is kept) and the
environment never ends, so with ``lookahead=3`` every round makes each environment take 3 drafted
steps and then 1 committed step (step calls 4r-3..4r-1 draft round r, call 4r commits it), the
policy is called once per round and the draft 3 times.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rl_helpers import same_episodes
from speculate.domains.rl import TabularPolicy, register_snapshot, rollouts, speculative_rollouts
from speculate.domains.rl import api as api_module
from speculate.domains.rl.snapshots import snapshotter as real_snapshotter

import speculate.rounds

N_ENVS, K, MAX_STEPS, SEED = 4, 3, 40, 7
P = np.random.default_rng(0).dirichlet(np.ones(4), size=16)


class Walk(gym.Env):
    """A random walk on 16 cells that never ends: position += action + a random step in {-1, 0, 1}."""

    observation_space = gym.spaces.Discrete(16)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = int(self.np_random.integers(16))
        return self.s, {}

    def step(self, a):
        self.s = (self.s + int(a) + int(self.np_random.integers(3)) - 1) % 16
        return self.s, float(self.s), False, False, {"s": self.s}


class FailOnStep(gym.Wrapper):
    """Raises ``exc`` on the ``n``-th call of ``step`` over the wrapper's life (restoring a snapshot
    does not rewind the count), then never again; ``n=None``: never."""

    def __init__(self, env, n=None, exc=RuntimeError) -> None:
        super().__init__(env)
        self.n, self.exc, self.calls = n, exc, 0

    def step(self, action):
        self.calls += 1
        if self.calls == self.n:
            raise self.exc(f"injected fault at step call {self.n}")
        return self.env.step(action)


register_snapshot(FailOnStep, lambda w: None, lambda w, state: None)  # the fault counter is not env state


class FailOnCall:
    """A policy that raises ``exc`` on its ``n``-th call, then never again."""

    def __init__(self, policy, n=None, exc=RuntimeError) -> None:
        self.policy, self.n, self.exc, self.calls = policy, n, exc, 0

    def __call__(self, obs):
        self.calls += 1
        if self.calls == self.n:
            raise self.exc(f"injected fault at policy call {self.n}")
        return self.policy(obs)


class Counting:
    """A snapshotter that counts its live snapshots and records the state at the start of each round
    (the first save while none is live)."""

    def __init__(self, env) -> None:
        self.real, self.env = real_snapshotter(env), env
        self.live: dict[int, object] = {}
        self.saves = 0
        self.round_start = None

    def _state(self):
        u = self.env.unwrapped
        return u.s, u.np_random.bit_generator.state

    def save(self):
        if not self.live:
            self.round_start = self._state()
        s = self.real.save()
        self.live[id(s)] = s
        self.saves += 1
        return s

    def restore(self, s):
        assert id(s) in self.live, "restore of a released snapshot"
        self.real.restore(s)

    def release(self, s):
        del self.live[id(s)]
        self.real.release(s)


@pytest.fixture
def counting(monkeypatch):
    made: list[Counting] = []

    def make(env):
        c = Counting(env)
        made.append(c)
        return c

    monkeypatch.setattr(api_module, "snapshotter", make)
    return made


def _envs(fail_env=None, n=None, exc=RuntimeError):
    return [FailOnStep(Walk(), n if i == fail_env else None, exc) for i in range(N_ENVS)]



def _run(envs, policy, draft, verify="block"):
    return speculative_rollouts(envs, policy, draft, max_steps=MAX_STEPS, lookahead=K, verify=verify, rng=SEED)


def _fresh():
    return _run(_envs(), TabularPolicy(P), TabularPolicy(P))


# (what fails, its n, the round loop's phase, the domain's note, which envs committed in round 3 before it)
FAULTS = [
    ("env", 10, "propose", "raised by env.step of environment 2 (Walk) at step 10 of its episode, drafting", 0),
    ("env", 12, "commit", "raised by env.step of environment 2 (Walk) at step 12 of its episode, committing", 2),
    ("policy", 3, "score", "raised by the policy FailOnCall scoring 16 observations of environments 0, 1, 2, 3", 0),
    ("draft", 8, "propose", "raised by the draft policy FailOnCall scoring 4 observations of environments 0, 1, 2, 3",
     0),
    ("verifier", 3, "verify", None, 0),
]


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize(("what", "n", "phase", "domain_note", "committed"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_in_round_3(what, n, phase, domain_note, committed, exc, counting, monkeypatch) -> None:
    envs = _envs(fail_env=2 if what == "env" else None, n=n, exc=exc)
    policy = FailOnCall(TabularPolicy(P), n if what == "policy" else None, exc)
    draft = FailOnCall(TabularPolicy(P), n if what == "draft" else None, exc)
    if what == "verifier":
        real, calls = speculate.rounds.verify_round, [0]

        def verify_round(*args):
            calls[0] += 1
            if calls[0] == n:
                raise exc("injected fault in the verifier")
            return real(*args)

        monkeypatch.setattr(speculate.rounds, "verify_round", verify_round)

    with pytest.raises(exc, match="injected fault") as info:
        _run(envs, policy, draft)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"speculate.rounds.run: raised in {phase} of round 3 (rows 0, 1, 2, 3)" in notes
    if domain_note is not None:
        assert domain_note in notes
    assert "put back to their last committed state" in notes
    # every snapshot of the round released; the environments not committed in round 3 are back at its start
    assert len(counting) == N_ENVS and all(not c.live for c in counting)
    assert all(c.saves >= 2 * K for c in counting)  # rounds 1 and 2 ran: the fault is mid-run
    for i, c in enumerate(counting):
        if i >= committed:
            state = c._state()
            assert state[0] == c.round_start[0] and state[1] == c.round_start[1], f"environment {i} not restored"

    # the faults fire once: the same objects now give exactly what fresh ones give
    monkeypatch.setattr(speculate.rounds, "verify_round", speculate.rounds.verify_round)
    again = _run(envs, policy, draft)
    same_episodes(again, _fresh())
    assert all(not c.live for c in counting)
    assert again.stats.rejections == 0 and again.stats.rounds == MAX_STEPS // (K + 1)  # the schedule above


def test_schedule_of_the_fault_tests() -> None:
    """The schedule the fault tests rely on: 10 rounds, each 3 drafted + 1 committed step per env."""
    envs = _envs(fail_env=0, n=None)
    out = _run(envs, TabularPolicy(P), TabularPolicy(P))
    assert out.stats.rounds == 10 and out.stats.rejections == 0
    assert [e.calls for e in envs] == [MAX_STEPS // (K + 1) * (K + 1)] * N_ENVS


def test_fault_in_plain_rollouts_names_the_environment() -> None:
    envs = _envs(fail_env=1, n=5)
    with pytest.raises(RuntimeError, match="injected") as info:
        rollouts(envs, TabularPolicy(P), max_steps=10, rng=0)
    assert "raised by env.step of environment 1 (Walk) at step 5 of its episode" in "\n".join(info.value.__notes__)
    again = rollouts(envs, TabularPolicy(P), max_steps=10, rng=0)
    same_episodes(again, rollouts(_envs(), TabularPolicy(P), max_steps=10, rng=0))


def test_failing_restore_is_reported_and_the_original_error_kept(counting, monkeypatch) -> None:
    """A snapshot that cannot be restored during the clean-up does not hide the original error."""
    envs = _envs()
    policy = FailOnCall(TabularPolicy(P), 2)

    def broken_restore(self, s):
        raise OSError("disk gone")

    monkeypatch.setattr(Counting, "restore", broken_restore)
    with pytest.raises(RuntimeError, match="injected fault at policy call 2") as info:
        _run(envs, policy, TabularPolicy(P))
    notes = "\n".join(info.value.__notes__)
    assert "restoring environment 0 failed: OSError: disk gone" in notes
    assert all(not c.live for c in counting)


def test_failing_reset_names_the_environment() -> None:
    class FailOnReset(Walk):
        def reset(self, *, seed=None, options=None):
            raise OSError("simulator not found")

    envs = [Walk(), FailOnReset()]
    for fn in (lambda: speculative_rollouts(envs, TabularPolicy(P), TabularPolicy(P), max_steps=4),
               lambda: rollouts(envs, TabularPolicy(P), max_steps=4)):
        with pytest.raises(OSError, match="simulator not found") as info:
            fn()
        assert "raised by env.reset of environment 1 (FailOnReset)" in "\n".join(info.value.__notes__)
