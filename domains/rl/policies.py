"""The policy protocol: a batch of observations in, one action distribution per observation out.

A policy is any callable (a function, an object with ``__call__``, a ``torch.nn.Module``) that takes
the observations of ``N`` environments in ONE call and returns their action distributions:

- observations are batched the way a gymnasium vector environment batches them: int64 ``[N]`` for a
  ``Discrete`` space, an array ``[N, *shape]`` for a ``Box``, a tuple / dict of such arrays for
  ``Tuple`` / ``Dict`` spaces. A ``torch.nn.Module`` receives a tensor (float32 for real-valued
  observations, int64 for integer ones) on the device of its first parameter, and runs under
  ``torch.inference_mode()``;
- for a ``Discrete`` action space it returns a :class:`speculate.Categorical` with batch shape
  ``(N,)``, a ``torch.distributions.Categorical``, or an array / tensor of logits ``[N, n_actions]``;
- for a ``Box`` action space it returns a :class:`speculate.Normal` with batch shape ``(N,)``
  (``batch_ndims=1``) and event shape equal to the action shape, a ``torch.distributions.Normal``
  (or ``Independent(Normal)``) of that shape, or a pair ``(mean, std)`` of arrays / tensors
  ``[N, *action_shape]``. When the draft and the target have the same std, verification is by
  reflection maximal coupling (exact, constant time); otherwise by the general rejection rule.
- a list of ``N`` unbatched distributions is accepted too.

Sampling is done by the library with its own seeded generator; a policy must be a deterministic
function of the observations (no dropout or batch-norm in training mode).

>>> import numpy as np, gymnasium as gym
>>> from speculate.domains.rl.policies import TabularPolicy, action_distributions
>>> env = gym.make("FrozenLake-v1")
>>> pi = TabularPolicy(np.full((16, 4), 0.25))
>>> d = action_distributions(pi, np.array([0, 5]), env.action_space)
>>> d.batch_shape, d.num_outcomes
((2,), 4)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from speculate.distributions import Categorical, Normal, as_distribution
from speculate.errors import add_note

__all__ = [
    "Prepared",
    "TabularPolicy",
    "action_arrays",
    "action_distributions",
    "batch_observations",
    "policy_calls",
    "policy_name",
    "prepare",
]


class TabularPolicy:
    """A stochastic policy over a ``Discrete`` observation space: ``probs[s]`` is pi(. | s).

    >>> import numpy as np
    >>> pi = TabularPolicy([[0.5, 0.5], [1.0, 0.0]])
    >>> pi(np.array([1, 0])).probs.tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """

    def __init__(self, probs: Any) -> None:
        self.probs = Categorical(probs=np.asarray(probs, dtype=np.float64)).probs  # [S, A], validated
        if self.probs.ndim != 2:
            raise ValueError(f"TabularPolicy needs probs of shape [n_states, n_actions], got {self.probs.shape}")

    def __call__(self, observations: np.ndarray) -> Categorical:
        obs = np.asarray(observations)
        if not np.issubdtype(obs.dtype, np.integer) or obs.ndim != 1:
            raise TypeError(f"TabularPolicy takes int observations [N], got {obs.dtype}{obs.shape}")
        if obs.size and (obs.min() < 0 or obs.max() >= len(self.probs)):
            raise ValueError(f"TabularPolicy has {len(self.probs)} states, got observation {obs.max()}")
        return Categorical(probs=self.probs[obs], validate=False)  # [N, A]


def policy_name(policy: Any) -> str:
    return getattr(policy, "__qualname__", None) or type(policy).__qualname__


def batch_observations(space: Any, observations: Sequence[Any]) -> Any:
    """Stack single observations the way a gymnasium vector environment would."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return np.asarray(observations, dtype=np.int64)  # [N]
    if isinstance(space, gym.spaces.Box):
        return np.stack([np.asarray(o) for o in observations]).astype(space.dtype, copy=False)
    from gymnasium.vector.utils import concatenate, create_empty_array

    out = create_empty_array(space, n=len(observations))
    return concatenate(space, observations, out)


def _torch_module(policy: Any) -> Any:
    try:
        import torch
    except ImportError:  # torch is optional: without it nothing is a module
        return None
    return policy if isinstance(policy, torch.nn.Module) else None


_STOCHASTIC_IN_TRAINING = ("Dropout", "BatchNorm", "AlphaDropout", "FeatureAlphaDropout")


def _check_eval(module: Any, name: str) -> None:
    for sub in module.modules():
        if sub.training and any(t in type(sub).__name__ for t in _STOCHASTIC_IN_TRAINING):
            raise ValueError(
                f"policy {name} has {type(sub).__name__} in training mode, which makes its output "
                "random or batch-dependent: call .eval() on it first"
            )


def _to_torch(obs: Any, device: Any) -> Any:
    import torch

    if isinstance(obs, dict):
        return {k: _to_torch(v, device) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_to_torch(v, device) for v in obs)
    a = np.asarray(obs)
    dtype = torch.int64 if a.dtype.kind in "iu" else torch.float32
    return torch.as_tensor(a, dtype=dtype, device=device)


def _numpy(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        t = x.detach().to("cpu")
        return t.numpy() if t.is_complex() else t.double().numpy()  # complex: refused by the caller
    return np.asarray(x)


class Prepared:
    """A policy ready to be called many times: torch modules are checked once (eval mode) and get
    numpy observations as tensors on their device, under ``torch.inference_mode()``."""

    def __init__(self, policy: Callable) -> None:
        if isinstance(policy, Prepared):
            policy = policy.policy
        self.policy = policy
        self.name = policy_name(policy)
        self.module = _torch_module(policy)
        if self.module is not None:
            _check_eval(self.module, self.name)
            p = next(self.module.parameters(), None)
            self.device = p.device if p is not None else None

    def __call__(self, obs: Any) -> Any:
        if self.module is None:
            return self.policy(obs)
        import torch

        with torch.inference_mode():
            return self.module(_to_torch(obs, self.device))


def prepare(policy: Callable) -> Prepared:
    """Wrap ``policy`` for repeated calls (raises ValueError for a module with dropout in training mode)."""
    return policy if isinstance(policy, Prepared) else Prepared(policy)


def action_distributions(policy: Callable, observations: Any, action_space: Any, n: int | None = None) -> Any:
    """Call ``policy`` once on a batch and return a batched Categorical ``[n, A]`` or Normal ``(n,) x shape``.

    Raises ValueError / TypeError naming the policy when it returns the wrong number of
    distributions, the wrong kind for the action space, or non-finite values.
    """
    import gymnasium as gym

    if n is None:
        n = len(observations)
    policy = prepare(policy)
    name = policy.name
    out = policy(observations)
    if isinstance(action_space, gym.spaces.Discrete):
        return _categorical(out, n, int(action_space.n), name)
    if isinstance(action_space, gym.spaces.Box):
        return _normal(out, n, tuple(action_space.shape), name)
    raise TypeError(
        f"speculative rollouts support Discrete and Box action spaces, got {type(action_space).__name__}"
    )


def _rows_text(rows: Sequence[int]) -> str:
    ids = [int(r) for r in dict.fromkeys(rows)]  # distinct, in order
    text = ", ".join(map(str, ids[:8]))
    return text + (f", ... ({len(ids)} environments)" if len(ids) > 8 else "")



def policy_calls(
    policies: Sequence[Callable],
    rows: Sequence[int],
    observations: Sequence[Any],
    obs_space: Any,
    action_space: Any,
    role: str = "policy",
) -> list[tuple[list[int], Any]]:
    """Observation ``i`` scored by ``policies[rows[i]]``, with ONE call per distinct policy object.

    Returns ``(positions, distribution)`` per policy, in order of first appearance: the positions
    ``i`` of its observations and their batched action distribution (a Categorical ``[n, A]`` or a
    Normal ``(n,) x shape``). An exception raised by a policy (or by the check of its output) gets a
    note naming ``role`` (``"policy"`` or ``"draft policy"``), the policy and the environments
    (``rows``) whose observations it was scoring.

    >>> import gymnasium as gym
    >>> a, b = TabularPolicy(np.full((16, 4), 0.25)), TabularPolicy(np.eye(4)[np.zeros(16, int)])
    >>> env = gym.make("FrozenLake-v1")
    >>> calls = policy_calls([a, b, a], [0, 1, 2, 1], [3, 4, 5, 6], env.observation_space, env.action_space)
    >>> [(idx, d.batch_shape) for idx, d in calls]
    [([0, 2], (2,)), ([1, 3], (2,))]
    """
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(id(policies[r]), []).append(i)
    out = []
    for idx in groups.values():
        policy = policies[rows[idx[0]]]
        try:
            batch = batch_observations(obs_space, [observations[i] for i in idx])
            out.append((idx, action_distributions(policy, batch, action_space, len(idx))))
        except BaseException as err:  # KeyboardInterrupt too: say which policy and environments
            name = policy_name(getattr(policy, "policy", policy))
            add_note(err, f"speculate.domains.rl: raised by the {role} {name} scoring {len(idx)} observations "
                          f"of environments {_rows_text([rows[i] for i in idx])}")
            raise
    return out


def action_arrays(
    policies: Sequence[Callable],
    rows: Sequence[int],
    observations: Sequence[Any],
    obs_space: Any,
    action_space: Any,
    role: str = "policy",
) -> Any:
    """:func:`policy_calls` gathered in the order of the observations: probabilities ``[M, A]``
    (Discrete actions) or ``(loc, scale)`` ``[M, *shape]`` (Box actions)."""
    calls = policy_calls(policies, rows, observations, obs_space, action_space, role)
    discrete = isinstance(calls[0][1], Categorical)
    if len(calls) == 1:
        d = calls[0][1]
        return d.probs if discrete else (d.loc, np.broadcast_to(d.scale, d.loc.shape))
    M = len(observations)
    out: Any = None
    for idx, d in calls:
        if discrete:
            if out is None:
                out = np.empty((M, d.num_outcomes), np.float64)
            out[idx] = d.probs
        else:
            if out is None:
                out = (np.empty((M, *d.event_shape)), np.empty((M, *d.event_shape)))
            out[0][idx], out[1][idx] = d.loc, np.broadcast_to(d.scale, d.loc.shape)
    return out


def _is_list_of_dists(out: Any) -> bool:
    """A list of distribution objects (a list of numbers or of rows of numbers is an array)."""
    numbers = (int, float, np.number, list, tuple, np.ndarray)
    return isinstance(out, list) and bool(out) and not isinstance(out[0], numbers)


def _unbatched(out: list, n: int, kind: type, name: str, space: str) -> list:
    """A policy's list of n unbatched distributions, each of ``kind``; errors name the first bad one."""
    if len(out) != n:
        raise ValueError(f"policy {name} returned {len(out)} distributions for {n} observations")
    dists = [as_distribution(d) for d in out]
    bad = next((d for d in dists if not (isinstance(d, kind) and d.batch_shape == ())), None)
    if bad is not None:
        raise TypeError(
            f"policy {name} must return {kind.__name__} distributions for a {space} action space, "
            f"got {type(bad).__name__}"
        )
    return dists


def _real_array(x: Any, name: str, what: str) -> np.ndarray:
    """``x`` (array, tensor, nested list) as a real numpy array; a TypeError naming the policy otherwise."""
    try:
        a = _numpy(x)
    except (TypeError, ValueError, RuntimeError) as err:  # ragged lists, odd tensors
        raise TypeError(f"policy {name} returned {what} that is not an array of numbers ({err})") from None
    if a.dtype.kind not in "biuf":
        raise TypeError(f"policy {name} returned {what} of dtype {a.dtype}; expected real numbers (float or int)")
    return a


def _checked_probs(probs: Any, name: str) -> Categorical:
    """A policy's probabilities validated (finite, >= 0, rows summing to 1 within the dtype's tolerance,
    then renormalised): a Categorical built with ``validate=False`` is checked here, never trusted."""
    try:
        return Categorical(probs=probs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"policy {name} returned invalid action probabilities: {err}") from None


def _categorical(out: Any, n: int, A: int, name: str) -> Categorical:
    mod = type(out).__module__ or ""
    finite = False  # probabilities already checked to be finite
    if isinstance(out, tuple):
        raise TypeError(
            f"policy {name} returned a tuple (a (mean, std) pair?); a Discrete action space needs a "
            "Categorical (or logits [N, n_actions])"
        )
    if _is_list_of_dists(out):
        dists = _unbatched(out, n, Categorical, name, "Discrete")
        sizes = {d.num_outcomes for d in dists}
        if len(sizes) != 1:
            raise ValueError(f"policy {name} returned distributions over different numbers of actions {sorted(sizes)}")
        out = _checked_probs(np.stack([d.probs for d in dists]), name)
    elif mod.startswith("torch.distributions"):
        import torch.distributions as td

        if not isinstance(out, td.Categorical):
            raise TypeError(
                f"policy {name} returned a torch {type(out).__name__}; a Discrete action space needs "
                "a Categorical"
            )
        out = _logits(_real_array(out.logits, name, "a torch Categorical with logits"), name)
    elif isinstance(out, Normal) or (mod.startswith("torch") and not hasattr(out, "shape")):
        raise TypeError(
            f"policy {name} returned {type(out).__name__}; a Discrete action space needs a Categorical "
            "(or logits [N, n_actions])"
        )
    elif mod.startswith("torch") and getattr(out, "ndim", 0) == 2 and out.dtype.is_floating_point:
        import torch  # logits tensor: softmax in torch

        probs = torch.softmax(out.detach().double(), dim=-1).cpu().numpy()  # [N, A]
        if not np.isfinite(probs).all():
            raise ValueError(f"policy {name} returned logits with NaN or +inf (or a row of -inf only)")
        out, finite = Categorical._of(probs), True
    elif isinstance(out, Categorical):
        out = _checked_probs(out.probs, name)  # validate=False objects are not trusted
    else:
        logits = _real_array(out, name, f"{type(out).__name__} logits")
        if logits.ndim != 2:
            raise TypeError(
                f"policy {name} returned {type(out).__name__} of shape {logits.shape}; "
                f"expected a Categorical or logits [{n}, {A}]"
            )
        out = _logits(logits, name)
    if out.batch_shape != (n,):
        raise ValueError(
            f"policy {name} returned distributions of batch shape {out.batch_shape} for {n} "
            f"observations (expected ({n},): one per observation)"
        )
    if out.num_outcomes != A:
        raise ValueError(f"policy {name} gives {out.num_outcomes} action probabilities; the space has {A}")
    if not finite and not np.all(np.isfinite(out.probs)):
        raise ValueError(f"policy {name} returned non-finite action probabilities")
    return out


def _logits(logits: np.ndarray, name: str) -> Categorical:
    try:
        return Categorical(logits=logits)
    except (TypeError, ValueError) as err:  # NaN, +inf, a row of -inf only
        raise ValueError(f"policy {name} returned invalid logits: {err}") from None


def _normal(out: Any, n: int, shape: tuple[int, ...], name: str) -> Normal:
    mod = type(out).__module__ or ""
    if _is_list_of_dists(out):
        dists = _unbatched(out, n, Normal, name, "Box")
        shapes = {d.loc.shape for d in dists}
        if len(shapes) != 1:
            raise ValueError(f"policy {name} returned Normals of different shapes {sorted(shapes)}")
        loc = np.stack([d.loc for d in dists])
        scale = np.stack([np.broadcast_to(d.scale, d.loc.shape) for d in dists])
        out = Normal(loc, scale, batch_ndims=1, validate=False)
    elif mod.startswith("torch.distributions"):
        out = as_distribution(out)
        if not isinstance(out, Normal):
            raise TypeError(
                f"policy {name} returned a torch distribution that is not a Normal; a Box action "
                "space needs Normal (or Independent(Normal)) actions"
            )
    elif isinstance(out, tuple) and len(out) == 2:
        loc = _real_array(out[0], name, "a mean")
        scale = _real_array(out[1], name, "a std")
        try:
            scale = np.broadcast_to(scale, loc.shape)
        except ValueError:
            raise ValueError(f"policy {name} returned a std of shape {scale.shape} for a mean of shape "
                             f"{loc.shape}") from None
        if loc.ndim == 0:
            raise TypeError(f"policy {name} returned a (mean, std) pair that is not two arrays [N, *shape]")
        out = Normal(loc.astype(np.float64), scale.astype(np.float64), batch_ndims=1, validate=False)
    elif isinstance(out, Categorical):
        raise TypeError(f"policy {name} returned a Categorical; a Box action space needs a Normal")
    elif not isinstance(out, Normal):
        raise TypeError(
            f"policy {name} returned {type(out).__name__}; a Box action space needs a speculate.Normal "
            "(batch_ndims=1), a torch Normal, or a pair (mean, std)"
        )
    if out.loc.shape == (n, *shape) and out.batch_ndims != 1:  # e.g. a torch Normal over [N, D]
        out = Normal(out.loc, np.broadcast_to(out.scale, out.loc.shape), batch_ndims=1, validate=False)
    if out.batch_shape != (n,):
        raise ValueError(
                f"policy {name} returned Normals of batch shape {out.batch_shape} and event shape "
                f"{out.event_shape} for {n} observations (expected batch ({n},), event {shape})"
            )
    if out.event_shape != shape:
        raise ValueError(f"policy {name} returned actions of shape {out.event_shape}; the space has {shape}")
    loc = out.loc.astype(np.float64, copy=False)
    scale = np.broadcast_to(out.scale, out.loc.shape).astype(np.float64, copy=False)
    if not (np.all(np.isfinite(loc)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
        raise ValueError(f"policy {name} returned a non-finite mean or a std that is not > 0")
    coarse = scale < _MIN_ULPS * np.spacing(np.abs(loc))
    if coarse.any():
        i = tuple(int(j) for j in np.argwhere(coarse)[0])
        raise ValueError(
            f"policy {name} returned a std of {scale[i]:.3g} at a mean of {loc[i]:.6g} (index {i}): below "
            f"{_MIN_ULPS} float64 steps of the mean, its samples would round to a handful of values and "
            "the residual of verification could not be sampled; rescale the actions or raise the std"
        )
    return Normal(loc, scale, batch_ndims=1, validate=False)


_MIN_ULPS = 64  #: a Normal's std must span at least this many float64 steps at its mean
