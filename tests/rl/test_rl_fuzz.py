"""Fuzzing ``speculative_rollouts`` / ``speculative_rollout`` (Hypothesis, derandomized).

Every call must either return well-formed, exactly distributed episodes or raise a clear
``ValueError`` / ``TypeError`` (naming the bad argument, or the policy that returned bad output) -
never a NaN or an out-of-range action passed to an environment, a hang, or an error from deep inside
a kernel. The environments themselves check every action they receive (:class:`BadAction` fails the
test).

What is drawn: environments (a toy environment with Discrete or Box observations and actions of
several shapes and dtypes, ``Discrete(n, start)`` included, random transitions and termination,
optionally a TimeLimit; or slippery FrozenLake), 0 to 3 of them; policies and drafts in every output
format of the policy protocol (logits arrays, speculate / torch distributions, (mean, std) pairs,
lists of unbatched distributions, several dtypes), deterministic or stochastic, optionally corrupted
from their n-th call on (NaN, +inf, a row of -inf, negative or unnormalised probabilities, a batch
too small or too large, the wrong number of actions or action shape, complex / string / object
dtypes, the wrong kind of distribution, std <= 0, a mean that overflows the action dtype); and the
arguments ``max_steps`` (0, 1, small, at and beyond the TimeLimit, huge, or bad), ``lookahead``
(0..16, "auto", or bad), ``verify``, ``max_lookahead``, ``cost_ratio`` and ``rng`` (good and bad).

The oracle: an argument error must raise before any environment is reset or any policy called; a
corrupted output that was actually returned must raise an error naming the policy; anything else
must succeed, and then the episodes are checked for shape, range and finiteness, and for exactness
where it is a deterministic property: with a deterministic policy, or with ``verify="greedy"``, the
speculative episodes must equal plain rollouts (of the argmax policy) bit for bit.

Case counts are reported by ``pytest --hypothesis-show-statistics`` (one ``event`` per outcome).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from speculate.domains.rl import rollouts, speculative_rollout, speculative_rollouts
from speculate.domains.rl.policies import action_distributions

import speculate

CALLS: list[str] = []  #: resets and steps of every toy environment (module level: snapshots do not rewind it)


class BadAction(AssertionError):
    """An environment received an action outside its space (or NaN): the fuzz test fails."""


class ToyBase(gym.Env):
    """A small random environment; spaces, end probability and observation kind set per subclass."""

    p_end = 0.1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        CALLS.append("reset")
        self.x = self.np_random.normal(size=3)
        return self._obs(), {}

    def _obs(self):
        space = self.observation_space
        if isinstance(space, gym.spaces.Discrete):
            return int(space.start + int(abs(self.x[0]) * 7) % space.n)
        v = np.resize(np.clip(self.x, -5, 5), int(np.prod(space.shape, dtype=np.int64))).reshape(space.shape)
        return (np.round(v) if space.dtype.kind in "iu" else v).astype(space.dtype)

    def step(self, action):
        CALLS.append("step")
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            if not isinstance(action, (int, np.integer)) or isinstance(action, bool) or not space.contains(action):
                raise BadAction(f"action {action!r} outside {space}")
            u = float(int(action) - space.start) / space.n
        else:
            a = np.asarray(action)
            if a.shape != space.shape or a.dtype != space.dtype or not np.all(np.isfinite(a)):
                raise BadAction(f"action {action!r} (dtype {a.dtype}) does not fit {space}")
            u = float(np.tanh(np.clip(a, -1e6, 1e6).astype(np.float64)).mean())
        self.x = 0.8 * self.x + u + self.np_random.normal(size=3)
        terminated = bool(self.np_random.random() < self.p_end)
        return self._obs(), float(self.x[0]), terminated, False, {"u": u}


def toy_class(obs_space, act_space, p_end):
    return type("Toy", (ToyBase,), {"observation_space": obs_space, "action_space": act_space, "p_end": p_end})


# ----------------------------------------------------------------------------------------------
# policies


def _features(obs) -> np.ndarray:
    a = np.asarray(obs, dtype=np.float64)
    return a.reshape(len(a), -1) if a.ndim > 1 else a[:, None]


class Fuzzy:
    """A policy: a deterministic function of the observations, in output format ``fmt``, corrupted by
    ``bad`` from call ``bad_call`` on (``emitted`` records whether a corrupted output went out)."""

    def __init__(self, act_space, seed, fmt, bad=None, bad_call=1, one_row=False, deterministic=False,
                 std=0.5, scale=1.0) -> None:
        self.space, self.seed, self.fmt, self.bad, self.bad_call = act_space, seed, fmt, bad, bad_call
        self.one_row, self.deterministic, self.std, self.scale = one_row, deterministic, std, scale
        self.calls, self.emitted = 0, False

    def clean(self) -> Fuzzy:
        return Fuzzy(self.space, self.seed, self.fmt, None, 1, False, self.deterministic, self.std, self.scale)

    def __call__(self, obs):
        self.calls += 1
        x = _features(obs)
        w = np.random.default_rng(self.seed).normal(size=(x.shape[1], 8))
        z = np.sin(x @ w + self.seed)  # [N, 8]
        bad = self.bad if self.bad is not None and self.calls >= self.bad_call else None
        try:
            out, is_bad = (self._discrete if isinstance(self.space, gym.spaces.Discrete) else self._box)(z, bad)
        except (ValueError, TypeError):  # building the corrupted output failed in the policy itself
            self.emitted |= bad is not None
            raise
        self.emitted |= is_bad
        return out

    def _rows(self, a):
        return a[:1] if self.one_row else a

    def _discrete(self, z, bad):
        A = int(self.space.n)
        logits = 3.0 * z[:, np.arange(A) % z.shape[1]]  # row by row: the policy is a function of one observation
        if self.deterministic:
            logits = 60.0 * np.eye(A)[np.argmax(logits, axis=1)]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        fmt, is_bad = self.fmt, bad is not None
        if bad == "nan":
            self._rows(logits)[:] = np.nan
            self._rows(probs)[:] = np.nan
        elif bad == "posinf":
            self._rows(logits)[:, 0] = np.inf
            self._rows(probs)[:, 0] = np.inf
        elif bad == "all_neginf":
            self._rows(logits)[:] = -np.inf
            self._rows(probs)[:] = 0.0
        elif bad == "negative":  # only probabilities can be negative: logits may be anything finite
            self._rows(probs)[:] = 0.0
            self._rows(probs)[:, 0] = -0.25
            self._rows(probs)[:, -1] += 1.25 if A > 1 else 0.0
            self._rows(logits)[:] -= 5.0
            is_bad = fmt in ("categorical", "list")
        elif bad == "unnormalised":
            self._rows(probs)[:] *= 1.5
            self._rows(logits)[:] *= 1.5
            is_bad = fmt in ("categorical", "list")
        elif bad == "fewer":
            logits, probs = logits[:-1], probs[:-1]
        elif bad == "more":
            logits, probs = np.concatenate([logits, logits[:1]]), np.concatenate([probs, probs[:1]])
        elif bad == "wrong_n":
            logits = np.concatenate([logits, logits[:, :1]], axis=1)
            probs = np.concatenate([probs, probs[:, :1]], axis=1) / 2
        elif bad in ("complex", "strings", "objects", "ndim3", "tuple", "normal", "none"):
            fmt = bad
        if fmt == "logits":
            return logits, is_bad
        if fmt == "logits32":
            return logits.astype(np.float32), is_bad
        if fmt == "logits_int":
            return np.round(logits).astype(np.int64) if np.all(np.isfinite(logits)) else logits, is_bad
        if fmt == "categorical":
            return speculate.Categorical(probs=probs, validate=False), is_bad
        if fmt == "list":
            return [speculate.Categorical(probs=p, validate=False) for p in probs], is_bad
        if fmt == "torch_logits":
            return torch.as_tensor(logits), is_bad
        if fmt == "torch_categorical":
            if not np.all(np.isfinite(logits)) or logits.shape[0] == 0:
                return torch.as_tensor(logits), is_bad
            return torch.distributions.Categorical(logits=torch.as_tensor(logits)), is_bad
        if fmt == "complex":
            return logits.astype(np.complex128), True
        if fmt == "strings":
            return logits.astype(str), True
        if fmt == "objects":
            return np.array([object()] * len(logits), dtype=object), True
        if fmt == "ndim3":
            return logits[:, :, None], True
        if fmt == "tuple":
            return (logits, logits), True
        if fmt == "normal":
            return speculate.Normal(logits, 1.0, batch_ndims=1), True
        return None, True

    def _box(self, z, bad):
        n, shape = len(z), tuple(self.space.shape)
        D = int(np.prod(shape, dtype=np.int64))
        mean = self.scale * z[:, np.arange(D) % z.shape[1]].reshape(n, *shape)
        std = np.full((n, *shape), self.std)
        fmt, is_bad = self.fmt, bad is not None
        if bad == "nan_mean":
            self._rows(mean)[:] = np.nan
        elif bad == "inf_mean":
            self._rows(mean)[:] = np.inf
        elif bad == "nan_std":
            self._rows(std)[:] = np.nan
        elif bad == "zero_std":
            self._rows(std)[:] = 0.0
        elif bad == "neg_std":
            self._rows(std)[:] = -1.0
        elif bad == "huge_mean":  # overflows float32 and float16 actions only
            self._rows(mean)[:] = 1e39
            is_bad = self.space.dtype.itemsize < 8
        elif bad == "fewer":
            mean, std = mean[:-1], std[:-1]
        elif bad == "more":
            mean, std = np.concatenate([mean, mean[:1]]), np.concatenate([std, std[:1]])
        elif bad == "wrong_shape":
            mean, std = mean[..., None], std[..., None]
        elif bad == "std_shape":
            std = np.ones((n + 1, 7))
        elif bad in ("complex", "categorical", "none", "triple"):
            fmt = bad
        if std.shape == mean.shape and np.any(std < 64 * np.spacing(np.abs(mean))):  # below float64 resolution
            is_bad = True
        if fmt == "pair":
            return (mean, std), is_bad
        if fmt == "pair_scalar_std":
            return (mean, std.flat[0] if std.size and bad != "std_shape" else std), is_bad
        if fmt == "normal":
            return speculate.Normal(mean, std, batch_ndims=1, validate=False), is_bad
        if fmt == "list":
            return [speculate.Normal(m, s, validate=False) for m, s in zip(mean, std, strict=False)], is_bad
        if fmt == "torch":
            if not (np.all(np.isfinite(std)) and np.all(std > 0)) or std.shape != mean.shape:
                return (torch.as_tensor(mean), torch.as_tensor(std)), is_bad
            return torch.distributions.Normal(torch.as_tensor(mean), torch.as_tensor(std)), is_bad
        if fmt == "complex":
            return (mean.astype(np.complex128), std), True
        if fmt == "categorical":
            return speculate.Categorical(logits=np.zeros((n, 2))), True
        if fmt == "triple":
            return (mean, std, std), True
        return None, True


DISCRETE_FORMATS = ["logits", "logits32", "logits_int", "categorical", "list", "torch_logits", "torch_categorical"]
DISCRETE_BAD = ["nan", "posinf", "all_neginf", "negative", "unnormalised", "fewer", "more", "wrong_n", "complex",
                "strings", "objects", "ndim3", "tuple", "normal", "none"]
BOX_FORMATS = ["pair", "pair_scalar_std", "normal", "list", "torch"]
BOX_BAD = ["nan_mean", "inf_mean", "nan_std", "zero_std", "neg_std", "huge_mean", "fewer", "more", "wrong_shape",
           "std_shape", "complex", "categorical", "none", "triple"]


# ----------------------------------------------------------------------------------------------
# the strategy

BAD_ARGS = {
    "max_steps": [-1, 2.5, True, "3", None, 2**70],
    "lookahead": [-1, 1.5, True, "fast", None, np.array([2, 3])],
    "verify": ["typical", None, 3, ("token",)],
    "max_lookahead": [0, -2, 2.5, True, "8"],
    "cost_ratio": [-1.0, float("nan"), float("inf"), "0.1", True],
    "rng": [-1, 1.5, "0", np.random.RandomState(0)],
}


@st.composite
def fuzz_cases(draw):
    box = draw(st.booleans())
    c: dict = {"box": box}
    if box:
        dtype = draw(st.sampled_from([np.float32, np.float64]))
        shape = draw(st.sampled_from([(1,), (3,), (2, 2), ()]))
        act = gym.spaces.Box(-2.0, 2.0, shape, dtype)
        frozen = False
    else:
        frozen = draw(st.booleans())
        n = 4 if frozen else draw(st.integers(1, 5))
        act = gym.spaces.Discrete(n, start=0 if frozen else draw(st.sampled_from([0, 0, 1, -2])))
    c["frozen"] = frozen
    if frozen:
        c["obs"] = None
    else:
        c["obs"] = draw(st.sampled_from([
            gym.spaces.Discrete(6), gym.spaces.Discrete(5, start=3), gym.spaces.Box(-5, 5, (3,), np.float32),
            gym.spaces.Box(-5, 5, (2, 3), np.float64), gym.spaces.Box(-5, 5, (2,), np.int64)]))
    c["act"] = act
    c["p_end"] = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    c["time_limit"] = draw(st.sampled_from([None, 1, 3, 9]))
    c["n_envs"] = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 3, 3]))
    c["single"] = c["n_envs"] == 1 and draw(st.booleans())
    c["container"] = draw(st.sampled_from(["list", "fns", "vector"])) if c["n_envs"] else "list"
    c["per_env"] = draw(st.booleans())  # one policy object per environment (the same function)
    formats, bads = (BOX_FORMATS, BOX_BAD) if box else (DISCRETE_FORMATS, DISCRETE_BAD)
    for role, seed in (("policy", 1), ("draft", 2)):
        bad = draw(st.sampled_from([None, None, None, *bads]))
        c[role] = {
            "seed": seed if role == "policy" or not draw(st.booleans()) else 1,  # sometimes the draft = the policy
            "fmt": draw(st.sampled_from(formats)),
            "bad": bad,
            "bad_call": draw(st.sampled_from([1, 2, 4])),
            "one_row": draw(st.booleans()),
            "deterministic": not box and draw(st.integers(0, 2)) > 0,
            "std": draw(st.sampled_from([0.5, 0.5, 1e-3, 3.0])),
            "scale": draw(st.sampled_from([1.0, 1.0, 1e6, 1e30])) if box else 1.0,
        }
    if c["time_limit"] is not None or c["p_end"] >= 0.3:
        max_steps = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 10, 40, 10**6, 2**62]))
    else:
        max_steps = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 12]))
    c["args"] = {
        "max_steps": max_steps,
        "lookahead": draw(st.one_of(st.integers(0, 16), st.just("auto"))),
        "verify": draw(st.sampled_from(["auto", "token"] if box else ["auto", "token", "block", "greedy"])),
        "max_lookahead": draw(st.sampled_from([1, 4, 16])),
        "cost_ratio": draw(st.sampled_from([None, 0.0, 0.05, 2.0])),
        "rng": draw(st.sampled_from(["int", "int", "generator", "generator", "none"])),
    }
    c["bad_arg"] = None
    if box and draw(st.integers(0, 9)) == 0:  # block and greedy need Discrete actions
        c["bad_arg"] = "verify"
        c["args"]["verify"] = draw(st.sampled_from(["block", "greedy"]))
    elif draw(st.integers(0, 7)) == 0:
        name = draw(st.sampled_from(sorted(BAD_ARGS)))
        c["bad_arg"] = name
        c["args"][name] = draw(st.sampled_from(BAD_ARGS[name]))
    return c


def _make(c):
    def make():
        if c["frozen"]:
            env = gym.make("FrozenLake-v1", is_slippery=True).unwrapped
        else:
            env = toy_class(c["obs"], c["act"], c["p_end"])()
        return gym.wrappers.TimeLimit(env, c["time_limit"]) if c["time_limit"] is not None else env
    return make


def _rng(kind, seed=3):
    if kind == "int":
        return seed
    if kind == "generator":
        return np.random.default_rng(seed)
    if kind == "none":
        return None
    return kind  # a bad value


def _check_episodes(out, c, n_envs):
    act, max_steps = c["act"], c["args"]["max_steps"]
    assert len(out) == n_envs
    for t in out:
        assert len(t.actions) == len(t.rewards) == len(t.infos) == len(t.observations) - 1 <= max_steps
        assert np.all(np.isfinite(t.rewards))
        if isinstance(act, gym.spaces.Discrete):
            assert t.actions.dtype == np.int64
            assert np.all((t.actions >= act.start) & (t.actions < act.start + act.n))
        else:
            assert t.actions.shape == (len(t), *act.shape) and t.actions.dtype == act.dtype
            assert np.all(np.isfinite(t.actions))
        if max_steps > 0:
            assert t.terminated or t.truncated
    s = out.stats
    assert s.emitted == out.steps
    assert 0 <= s.accepted <= s.proposed
    if s.proposed:
        assert 0.0 <= s.acceptance_rate <= 1.0


def _same(a, b, max_steps) -> None:
    for ta, tb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ta.observations, tb.observations)
        np.testing.assert_array_equal(ta.actions, tb.actions)
        np.testing.assert_array_equal(ta.rewards, tb.rewards)
        assert (ta.terminated, ta.truncated) == (tb.terminated, tb.truncated)


class ArgmaxOf:
    """The argmax (first maximum) of a policy in any output format, as one-hot logits."""

    def __init__(self, policy, space) -> None:
        self.policy, self.space = policy, space

    def __call__(self, obs):
        probs = action_distributions(self.policy, obs, self.space).probs
        return 60.0 * np.eye(self.space.n)[np.argmax(probs, axis=-1)]


@settings(max_examples=500)
@given(c=fuzz_cases())
def test_fuzz_speculative_rollouts(c) -> None:
    args = dict(c["args"])
    args["rng"] = _rng(args["rng"])
    make = _make(c)
    n_envs = c["n_envs"]
    if c["container"] == "fns":
        envs = [make] * n_envs
    elif c["container"] == "vector":
        envs = gym.vector.SyncVectorEnv([make] * n_envs)
    else:
        envs = [make() for _ in range(n_envs)]
    policy = Fuzzy(c["act"], **c["policy"])
    draft = Fuzzy(c["act"], **c["draft"])
    pol, dr = ([policy] + [policy.clean() for _ in range(n_envs - 1)], draft) if c["per_env"] else (policy, draft)
    expect_arg_error = c["bad_arg"] is not None or n_envs == 0
    CALLS.clear()
    if c["container"] == "vector":
        CALLS.clear()  # building the vector env resets nothing, but be explicit
    try:
        if c["single"]:
            one = speculative_rollout(make(), pol[0] if c["per_env"] else pol, dr, **args)
            out = type("One", (), {"episodes": [one], "stats": one.stats, "steps": len(one),
                                   "__len__": lambda self: 1, "__iter__": lambda self: iter(self.episodes)})()
        else:
            out = speculative_rollouts(envs, pol, dr, **args)
    except (ValueError, TypeError) as err:
        text = str(err) + "\n".join(getattr(err, "__notes__", []))
        assert text.strip(), "an error without a message"
        if expect_arg_error:
            event("argument error (raised before any reset or policy call)")
            assert not CALLS and policy.calls == 0 and draft.calls == 0, f"work was done before: {err!r}"
            return
        assert policy.emitted or draft.emitted, f"unexpected error: {err!r}"
        assert "Fuzzy" in text, f"the error does not name the policy: {text}"
        event(f"bad policy output refused ({'policy' if policy.emitted else 'draft'})")
        return
    assert not expect_arg_error, f"bad argument {c['bad_arg']} accepted"
    assert not (policy.emitted or draft.emitted), "a corrupted policy output was accepted"
    _check_episodes(out, c, n_envs)
    event("returned")
    # exactness, where it is a deterministic property: plain rollouts with the same reset seeds
    discrete = not c["box"]
    if discrete and c["args"]["rng"] != "none" and (c["policy"]["deterministic"] or args["verify"] == "greedy"):
        reference = policy.clean()
        if args["verify"] == "greedy":
            reference = ArgmaxOf(reference, c["act"])
        plain = rollouts([make() for _ in range(n_envs)], reference, max_steps=args["max_steps"],
                         rng=_rng(c["args"]["rng"]))
        _same(out, plain, args["max_steps"])
        event("returned, checked equal to plain rollouts")


@settings(max_examples=100)
@given(name=st.sampled_from(sorted(BAD_ARGS)), data=st.data())
def test_fuzz_bad_arguments_of_plain_and_speculative(name, data) -> None:
    """Every bad argument of the table, alone, raises ValueError / TypeError naming it, before any
    environment is reset or policy called, in speculative and (for its arguments) plain rollouts."""
    value = data.draw(st.sampled_from(BAD_ARGS[name]))
    c = {"frozen": False, "obs": gym.spaces.Discrete(6), "act": gym.spaces.Discrete(3), "p_end": 0.2,
         "time_limit": None}
    policy = Fuzzy(c["act"], 1, "logits")
    kwargs = {name: value}
    CALLS.clear()
    with pytest.raises((ValueError, TypeError), match=name.split("_")[0]):
        speculative_rollouts([_make(c)() for _ in range(2)], policy, policy, **kwargs)
    assert not CALLS and policy.calls == 0
    if name in ("max_steps", "rng"):
        with pytest.raises((ValueError, TypeError), match=name.split("_")[0]):
            rollouts([_make(c)() for _ in range(2)], policy, **kwargs)
        assert not CALLS and policy.calls == 0
    event(f"bad {name}")
