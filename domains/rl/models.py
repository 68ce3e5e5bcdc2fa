"""Small torch policy networks that follow the policy protocol (speculate.domains.rl.policies).

>>> import torch
>>> from speculate.domains.rl.models import MLPPolicy, GaussianMLPPolicy
>>> pi = MLPPolicy(obs_dim=4, n_actions=2, hidden=(32, 32))
>>> pi(torch.zeros(5, 4)).shape                  # logits [N, n_actions]
torch.Size([5, 2])
>>> mean, std = GaussianMLPPolicy(obs_dim=3, act_dim=1, hidden=(16,), std=0.3)(torch.zeros(5, 3))
>>> tuple(mean.shape), tuple(std.shape)
((5, 1), (5, 1))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["GaussianMLPPolicy", "MLPPolicy", "mlp"]


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """Linear layers of the given sizes with ``activation`` between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class MLPPolicy(nn.Module):
    """Categorical policy: observations [N, obs_dim] -> logits [N, n_actions] (divided by ``temperature``).

    ``obs_scale`` (optional, one number per observation coordinate) divides the observations first.
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        temperature: float = 1.0,
        activation: type[nn.Module] = nn.Tanh,
        obs_scale: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.net = mlp([obs_dim, *hidden, n_actions], activation)
        self.temperature = float(temperature)
        scale = torch.ones(obs_dim) if obs_scale is None else torch.as_tensor(obs_scale, dtype=torch.float32)
        self.register_buffer("obs_scale", scale)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / self.obs_scale) / self.temperature  # [N, n_actions]


class GaussianMLPPolicy(nn.Module):
    """Normal policy with a state-independent std: observations [N, obs_dim] -> (mean, std) [N, act_dim].

    The std is a fixed buffer (not trained), so a draft and a target built with the same ``std`` are
    verified by reflection maximal coupling.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        std: float = 0.5,
        activation: type[nn.Module] = nn.Tanh,
    ) -> None:
        super().__init__()
        if std <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        self.net = mlp([obs_dim, *hidden, act_dim], activation)
        self.register_buffer("std", torch.full((act_dim,), float(std)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.net(obs.float())  # [N, act_dim]
        return mean, self.std.expand_as(mean)
