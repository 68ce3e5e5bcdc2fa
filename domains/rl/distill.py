"""distill_policy: train a cheap draft policy to agree with the expensive one where it acts.

The speed of speculative rollouts is set by the acceptance rate alpha = E_s[1 - TV(pi(.|s),
pi_draft(.|s))] over the states the expensive policy visits. ``distill_policy`` collects those states
(plain rollouts of ``policy``; optionally of the draft too, as DistillSpec does), labels them with
the policy's action distributions (one batched call per chunk), and fits the draft by minimising a
divergence, then reports alpha before and after on held-out states of fresh policy rollouts.

>>> import gymnasium as gym, torch
>>> from speculate.domains.rl import distill_policy
>>> from speculate.domains.rl.models import MLPPolicy
>>> _ = torch.manual_seed(0)
>>> teacher = MLPPolicy(4, 2, hidden=(32,)).eval()
>>> student = MLPPolicy(4, 2, hidden=(8,))
>>> rep = distill_policy(teacher, student, lambda: gym.make("CartPole-v1"), episodes=4, steps=200, rng=0)
>>> rep.acceptance_after > rep.acceptance_before
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speculate import theory

from .api import rollouts
from .policies import action_distributions, batch_observations
from .seeding import int_seed

__all__ = ["DistillReport", "acceptance", "distill_policy"]


@dataclass
class DistillReport:
    """What :func:`distill_policy` did: alpha on held-out policy states before and after training."""

    acceptance_before: float
    acceptance_after: float
    train_states: int
    heldout_states: int
    steps: int
    loss: str
    history: list = field(default_factory=list, repr=False)  #: (step, loss) every 10% of steps


def acceptance(policy: Callable, draft: Callable, observations: Any, action_space: Any,
               rng: int | np.random.Generator | None = 0) -> float:
    """Mean acceptance E_s[1 - TV(policy(.|s), draft(.|s))] over a batch of observations.

    Categorical actions: :func:`speculate.theory.acceptance_rate`; Normal actions:
    :func:`speculate.theory.normal_acceptance` (the closed form 2 Phi(-delta/2) for equal stds, a
    Monte Carlo estimate drawn with ``rng`` otherwise).
    """
    p = action_distributions(policy, observations, action_space)
    q = action_distributions(draft, observations, action_space)
    if hasattr(p, "probs"):
        return float(np.mean(theory.acceptance_rate(p.probs, q.probs)))
    acc = theory.normal_acceptance(p.loc, p.scale, q.loc, q.scale, batch_ndims=1, rng=rng)
    return float(np.mean(acc))


def _states(env: Any, policy: Callable, episodes: int, max_steps: int, seed: int) -> list:
    """The observations at which ``policy`` acted in ``episodes`` plain rollouts."""
    import gymnasium as gym

    if isinstance(env, gym.Env):
        runs = [rollouts(env, policy, max_steps=max_steps, rng=seed + i) for i in range(episodes)]
    elif callable(env):
        runs = [rollouts([env] * episodes, policy, max_steps=max_steps, rng=seed)]
    else:
        reps = -(-episodes // len(env))
        runs = [rollouts(env, policy, max_steps=max_steps, rng=seed + i) for i in range(reps)]
    return [o for out in runs for t in out for o in list(t.observations[: len(t)])]


def _spaces(env: Any) -> tuple[Any, Any]:
    import gymnasium as gym

    e = env if isinstance(env, (gym.Env, list, tuple)) else env()
    first = e[0] if isinstance(e, (list, tuple)) else e
    made = not isinstance(first, gym.Env)
    if made:
        first = first()
    spaces = first.observation_space, first.action_space
    if made or e is not env:
        first.close()
    return spaces


def _draft_outputs(draft: Any, obs: Any, discrete: bool) -> Any:
    """The draft module's differentiable output: logits [B, A], or (mean, std) [B, *shape]."""
    import torch
    import torch.distributions as td

    out = draft(obs)
    if discrete:
        if isinstance(out, td.Categorical):
            return out.logits
        if isinstance(out, torch.Tensor):
            return out
        raise TypeError(f"the draft must return logits or a torch Categorical, got {type(out).__name__}")
    if isinstance(out, td.Independent):
        out = out.base_dist
    if isinstance(out, td.Normal):
        return out.loc, out.scale
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], torch.as_tensor(out[1]).expand_as(out[0])
    raise TypeError(f"the draft must return (mean, std) or a torch Normal, got {type(out).__name__}")


def distill_policy(
    policy: Callable,
    draft: Any,
    env: Any,
    *,
    episodes: int = 20,
    max_steps: int = 500,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 3e-3,
    loss: str = "kl",
    on: str = "policy",
    heldout_episodes: int | None = None,
    rng: int | np.random.Generator | None = 0,
) -> DistillReport:
    """Train the torch module ``draft`` (in place) to match ``policy``; report acceptance before/after.

    ``env``: a gymnasium Env (episodes run one after the other), an env constructor, or a list of
    envs / constructors (one episode each per pass). ``episodes`` rollouts of ``policy``
    (``on="draft"``: of the draft; ``"both"``: both) of at most ``max_steps`` steps give the
    training states; ``heldout_episodes`` (default ``max(2, episodes // 4)``) fresh rollouts of
    ``policy`` give the held-out states on which
    acceptance is measured. ``loss``: ``"kl"`` = KL(policy || draft) or ``"tv"`` = total variation
    (1 - acceptance, the quantity that sets the speedup); for Normal actions, the Gaussian KL.
    ``steps`` Adam steps of ``batch_size`` states at learning rate ``lr``. The draft is left in
    eval mode. ``rng``: an int seed (or a Generator or None, from which one is drawn); the seeds of
    the training, draft and held-out rollouts and of torch's batch sampling are spawned from it.
    """
    import gymnasium as gym
    import torch

    if loss not in ("kl", "tv"):
        raise ValueError(f"loss must be 'kl' or 'tv', got {loss!r}")
    if on not in ("policy", "draft", "both"):
        raise ValueError(f"on must be 'policy', 'draft' or 'both', got {on!r}")
    if not isinstance(draft, torch.nn.Module) or not any(p.requires_grad for p in
    draft.parameters()):
        raise TypeError("distill_policy trains the draft: give a torch.nn.Module with trainable parameters")
    obs_space, act_space = _spaces(env)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    ss = np.random.SeedSequence(int_seed(rng))
    s_train, s_draft, s_held, s_torch = (int(s.generate_state(1)[0]) for s in ss.spawn(4))

    draft.eval()
    train: list = []
    if on in ("policy", "both"):
        train += _states(env, policy, episodes, max_steps, s_train)
    if on in ("draft", "both"):
        train += _states(env, draft, episodes, max_steps, s_draft)
    held = _states(env, policy, heldout_episodes or max(2, episodes // 4), max_steps, s_held)
    if not train or not held:
        raise ValueError("the rollouts produced no states: check env and max_steps")
    x_train = batch_observations(obs_space, train)
    x_held = batch_observations(obs_space, held)
    before = acceptance(policy, draft, x_held, act_space)

    target = action_distributions(policy, x_train, act_space)  # labels, ONE call
    gen = torch.Generator().manual_seed(s_torch)
    x_np = np.asarray(x_train)
    x_dtype = torch.int64 if np.issubdtype(x_np.dtype, np.integer) else torch.float32
    x = torch.as_tensor(x_np, dtype=x_dtype)  # [M, *obs_shape]
    if discrete:
        p = torch.as_tensor(target.probs, dtype=torch.float32)  # [M, A]
    else:
        mu_p = torch.as_tensor(target.loc, dtype=torch.float32)  # [M, *shape]
        sd_p = torch.as_tensor(np.broadcast_to(target.scale, target.loc.shape).copy(), dtype=torch.float32)
    opt = torch.optim.Adam([q for q in draft.parameters() if q.requires_grad], lr=lr)
    history = []
    draft.train()
    for it in range(steps):
        idx = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen)
        if discrete:
            logq = torch.log_softmax(_draft_outputs(draft, x[idx], True).float(), dim=-1)  # [B, A]
            pb = p[idx]
            if loss == "kl":
                val = (pb * (torch.log(pb.clamp_min(1e-12)) - logq)).sum(-1).mean()
            else:  # TV = 1 - acceptance: theory.acceptance_rate's formula, in torch for the gradient
                val = 0.5 * (pb - logq.exp()).abs().sum(-1).mean()
        else:
            mu_q, sd_q = _draft_outputs(draft, x[idx], False)
            mp, sp_ = mu_p[idx], sd_p[idx]
            if loss == "kl":
                val = (torch.log(sd_q / sp_) + (sp_**2 + (mp - mu_q) ** 2) / (2 * sd_q**2) - 0.5)
                val = val.reshape(len(idx), -1).sum(-1).mean()
            else:  # 1 - 2 Phi(-delta/2), delta whitened by the policy's std: theory.normal_acceptance's
                # equal-std form, in torch for the gradient
                delta = (((mp - mu_q) / sp_) ** 2).reshape(len(idx), -1).sum(-1).clamp_min(1e-12).sqrt()
                val = (1 - 2 * torch.distributions.Normal(0.0, 1.0).cdf(-delta / 2)).mean()
        opt.zero_grad()
        val.backward()
        opt.step()
        if it % max(1, steps // 10) == 0 or it == steps - 1:
            history.append((it, val.item()))
    draft.eval()
    after = acceptance(policy, draft, x_held, act_space)
    return DistillReport(before, after, len(train), len(held), steps, loss, history)
