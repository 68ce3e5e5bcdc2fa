"""A neural-network potential in torch: an MLP energy, forces by autograd, force-matching training.

The expensive target of the CPU wall-clock benchmark. A wide MLP's cost is dominated by reading
its weights, so scoring k+1 configurations in one call costs far less than k+1 calls: the regime
where speculative simulation pays on any hardware. ``MLPPotential`` is a per-particle energy in an
external field, E(X) = sum_i mlp((x_i - center) / spread); ``TorchForce`` turns a torch energy
module into a force function on NumPy batches (any device); ``fit_potential`` trains it to
reproduce a reference potential (energies and forces) on given configurations.

Example:
    >>> import numpy as np, torch
    >>> from speculate.domains.physics.neural import MLPPotential, TorchForce
    >>> torch.manual_seed(0) and None
    >>> force = TorchForce(MLPPotential(d=2, width=32, depth=2))
    >>> force(np.zeros((3, 1, 2))).shape                 # B=3 configurations of N=1 particle in 2-D
    (3, 1, 2)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from speculate.rng import as_rng, child_seed


class MLPPotential(nn.Module):
    """E(X[B, N, d]) = energy_scale * sum_i mlp((x_i - center) / spread): SiLU MLP, smooth forces.

    Args:
        d: coordinates per particle. width, depth: hidden width and number of hidden layers.
        center, spread: input normalisation ([d] each). energy_scale: output scale.
    """

    def __init__(
        self,
        d: int,
        width: int = 256,
        depth: int = 3,
        center: np.ndarray | None = None,
        spread: np.ndarray | None = None,
        energy_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if d < 1 or width < 1 or depth < 1:
            raise ValueError("MLPPotential: d, width and depth must be >= 1")
        layers: list[nn.Module] = []
        n_in = d
        for _ in range(depth):
            layers += [nn.Linear(n_in, width), nn.SiLU()]
            n_in = width
        layers.append(nn.Linear(n_in, 1))
        self.mlp = nn.Sequential(*layers)
        self.register_buffer("center", torch.as_tensor(np.zeros(d) if center is None else center))
        self.register_buffer("spread", torch.as_tensor(np.ones(d) if spread is None else spread))
        self.register_buffer("energy_scale", torch.tensor(float(energy_scale)))
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, N, d] -> energies [B]
        h = (x - self.center.to(x.dtype)) / self.spread.to(x.dtype)
        e = self.mlp(h).squeeze(-1)                                  # [B, N]
        return self.energy_scale.to(x.dtype) * e.sum(-1)


class TorchForce:
    """Force function F = -grad E of a torch energy module, on NumPy batches.

    ``TorchForce(module, device="cuda", dtype=torch.float32)(X[B, N, d])`` moves X to the device,
    runs one forward and one backward pass for the whole batch and returns float64 NumPy forces
    [B, N, d] (the gradient is taken with respect to X only). Device-agnostic: the same code runs
    on CPU and GPU. Note that BLAS libraries may
    round a configuration's force differently (in the last bits) depending on the batch it is in;
    the speculative chain is exact for the force as computed, so use float64 when bit-for-bit
    agreement with a plain run matters.
    """

    def __init__(self, module: nn.Module, device: str = "cpu", dtype: torch.dtype = torch.float32):
        self.module = module.to(device=device, dtype=dtype).eval()   # moves the module in place
        self.device, self.dtype = device, dtype

    def __call__(self, X: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(X), device=self.device, dtype=self.dtype)
        x.requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(self.module(x).sum(), x)      # [B, N, d]
        return (-g).detach().to("cpu", torch.float64).numpy()

    def energy(self, X: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(X), device=self.device, dtype=self.dtype)
        with torch.no_grad():
            return self.module(x).to("cpu", torch.float64).numpy()


def _torch_seed(rng: int | np.random.Generator | None) -> int:
    gen = as_rng(rng)  # checks the argument
    return int(rng) if isinstance(rng, (int, np.integer)) else child_seed(gen)


def fit_potential(
    module: nn.Module,
    energy: Callable[[np.ndarray], np.ndarray],
    force: Callable[[np.ndarray], np.ndarray],
    X: np.ndarray,
    *,
    steps: int = 2000,
    batch: int = 512,
    lr: float = 2e-3,
    force_weight: float = 1.0,
    rng: int | np.random.Generator | None = 0,
    log_every: int = 0,
) -> dict[str, float]:
    """Train ``module`` to reproduce ``energy`` and ``force`` on configurations X [M, N, d].

    Loss = mse(E) / var(E) + force_weight * mse(F) / mean(F^2), Adam with a cosine learning rate.
    Returns the final relative force RMSE on X (|F_nn - F| / |F| over all of X) and the time.
    ``rng`` (an int seed, a numpy Generator or None) draws the minibatches: an int seeds the torch
    generator directly, a Generator gives it a seed drawn from it.
    """
    X = np.asarray(X, dtype=np.float64)
    E_ref = torch.as_tensor(energy(X), dtype=torch.float32)          # [M]
    F_ref = torch.as_tensor(force(X), dtype=torch.float32)           # [M, N, d]
    Xt = torch.as_tensor(X, dtype=torch.float32)
    module = module.float().train()
    e_var = float(E_ref.var()) + 1e-12
    f_var = float((F_ref**2).mean()) + 1e-12
    gen = torch.Generator().manual_seed(_torch_seed(rng))
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    t0 = time.perf_counter()
    for s in range(steps):
        idx = torch.randint(0, X.shape[0], (batch,), generator=gen)
        x = Xt[idx].clone().requires_grad_(True)
        e = module(x)
        (g,) = torch.autograd.grad(e.sum(), x, create_graph=True)
        loss = ((e - E_ref[idx]) ** 2).mean() / e_var
        loss = loss + force_weight * ((-g - F_ref[idx]) ** 2).mean() / f_var
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if log_every and (s + 1) % log_every == 0:
            print(f"fit step {s + 1}: loss {float(loss.detach()):.3e}", flush=True)
    module.eval()
    F_nn = TorchForce(module, dtype=torch.float32)(X)
    rel = float(np.linalg.norm(F_nn - force(X)) / np.linalg.norm(force(X)))
    return {"relative_force_rmse": rel, "train_seconds": time.perf_counter() - t0}
