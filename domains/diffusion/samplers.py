"""The samplers of the diffusion domain: DDPM ancestral sampling, stochastic DDIM and VP-SDE
Euler-Maruyama, all over one discrete noise schedule, all as one list of Gaussian steps.

A noise schedule is ``betas[0 .. T-1]`` in (0, 1); the model time t runs over 1..T (Ho et al.'s
convention: x_T is noise, x_0 the sample, ``alpha_bar[t] = prod_{s <= t} (1 - beta_s)``,
``alpha_bar[0] = 1``). A model trained with diffusers' 0..T-1 indexing is called at ``t - 1``
(wrap it: ``lambda x, t: unet(x, t - 1).sample``).

Every sampler turns into a :class:`Plan`: S steps, step i going from x at model time
``times[i]`` to the next state, as

    x' = a[i] x + b[i] eps + sigma[i] z,   z ~ N(0, I),   eps = p[i] x + q[i] out

where ``out`` is the denoiser's output at (x, times[i]) (an eps, x_0 or v prediction, turned into
eps by the affine map (p, q)). ``sigma[i] = 0`` marks a deterministic step (the last step of
every sampler, as in Ho et al.'s Algorithm 2; every step of DDIM with eta = 0).

Example:
    >>> from speculate.domains.diffusion import DDIM, DDPM, VPSDE
    >>> plan = DDPM(timesteps=1000).plan()
    >>> plan.times[:3].tolist(), int(plan.times[-1]), float(plan.sigma[-1]), len(DDIM(steps=50).plan().times)
    ([1000, 999, 998], 1, 0.0, 50)
    >>> bool(VPSDE(timesteps=100, steps=20, denoise=False).plan().sigma.min() > 0)
    True
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = ["DDIM", "DDPM", "PREDICTIONS", "VPSDE", "Plan", "Sampler", "cosine_betas", "linear_betas"]

PREDICTIONS = ("eps", "x0", "v")
"""What a denoiser may predict: the noise eps, the clean sample x_0, or v = sqrt(ab) eps - sqrt(1 - ab) x_0."""


class Plan(NamedTuple):
    """The steps of a sampler (S steps, from noise to sample); every array has length S."""

    times: np.ndarray  #: int64: the model time t of the state each step starts from (decreasing)
    a: np.ndarray  #: float64: the step's mean is a x + b eps
    b: np.ndarray
    sigma: np.ndarray  #: float64 >= 0: the step's noise scale (0: deterministic)
    p: np.ndarray  #: float64: eps = p x + q out (the denoiser's output out turned into eps)
    q: np.ndarray
    alpha_bar: np.ndarray  #: float64: alpha_bar at times[i]

    @property
    def labels(self) -> np.ndarray:
        """The time label of every state of the chain: times[0] .. times[S-1], then 0 (the sample)."""
        return np.append(self.times, 0)


def linear_betas(timesteps: int) -> np.ndarray:
    """Ho et al.'s linear schedule, 1e-4 to 0.02 at T = 1000 (both scaled by 1000 / T, as in
    improved DDPM, so that other T keep the same total noise)."""
    scale = 1000.0 / timesteps
    return np.linspace(scale * 1e-4, min(scale * 0.02, 0.999), timesteps)


def cosine_betas(timesteps: int, s: float = 0.008) -> np.ndarray:
    """Nichol & Dhariwal's cosine schedule: alpha_bar(t) = cos^2(((t / T + s) / (1 + s)) pi / 2),
    betas clipped to 0.999."""
    t = np.arange(timesteps + 1, dtype=np.float64) / timesteps
    f = np.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return np.clip(1.0 - f[1:] / f[:-1], 1e-8, 0.999)


SCHEDULES = {"linear": linear_betas, "cosine": cosine_betas}


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class Sampler:
    """A discrete noise schedule and a way to walk it backwards (the base of DDPM, DDIM, VPSDE).

    Args:
        betas: the schedule, T numbers in (0, 1) (``None``: the named ``schedule`` with ``timesteps``).
        timesteps: T, when ``betas`` is None (an int >= 1; it must equal len(betas) when both are given).
        schedule: "linear" (Ho et al.) or "cosine" (Nichol & Dhariwal), when ``betas`` is None.
        prediction: what the denoiser predicts, "eps", "x0" or "v".
    """

    def __init__(
        self, betas: Any = None, timesteps: int | None = None, schedule: str = "linear", prediction: str = "eps"
    ) -> None:
        if prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        if betas is None:
            timesteps = 1000 if timesteps is None else timesteps
            if not _is_int(timesteps) or timesteps < 1:
                raise ValueError(f"timesteps must be an int >= 1, got {timesteps!r}")
            if schedule not in SCHEDULES:
                raise ValueError(f"schedule must be one of {tuple(SCHEDULES)}, got {schedule!r}")
            betas = SCHEDULES[schedule](int(timesteps))
        b = np.asarray(betas)
        if b.dtype.kind not in "iuf" or b.ndim != 1 or b.size == 0:
            raise ValueError(f"betas must be a non-empty 1-D array of real numbers, got {b.dtype} of shape {b.shape}")
        b = b.astype(np.float64)
        bad = ~((b > 0) & (b < 1))  # NaN is bad too
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"every beta must lie in (0, 1): beta at t = {i + 1} is {b[i]!r}")
        if timesteps is not None and timesteps != b.size:
            raise ValueError(f"timesteps={timesteps!r} but betas has {b.size} entries")
        self.betas = b
        self.alpha_bar = np.concatenate([[1.0], np.cumprod(1.0 - b)])  # [T+1]: alpha_bar[t], alpha_bar[0] = 1
        if not self.alpha_bar[-1] > 0:
            raise ValueError("alpha_bar underflows to 0 at t = T: the schedule adds more noise than float64 can follow")
        self.prediction = prediction

    @property
    def timesteps(self) -> int:
        """T: the model times are 1..T."""
        return int(self.betas.size)

    def _to_eps(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ab = self.alpha_bar[times]
        if self.prediction == "eps":
            return np.zeros_like(ab), np.ones_like(ab), ab
        if self.prediction == "x0":  # eps = (x - sqrt(ab) x0) / sqrt(1 - ab)
            return 1.0 / np.sqrt(1.0 - ab), -np.sqrt(ab) / np.sqrt(1.0 - ab), ab
        return np.sqrt(1.0 - ab), np.sqrt(ab), ab  # v: eps = sqrt(1 - ab) x + sqrt(ab) v

    def _steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def plan(self) -> Plan:
        """The steps of this sampler (see the module docstring)."""
        times, a, b, sigma = self._steps()
        p, q, ab = self._to_eps(times)
        return Plan(times.astype(np.int64), a, b, sigma, p, q, ab)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(T={self.timesteps}, prediction={self.prediction!r})"


def _strided(T: int, steps: Any) -> np.ndarray:
    """``steps`` model times from T down to 1, evenly spaced (both ends included)."""
    if steps is None:
        return np.arange(T, 0, -1)
    if not _is_int(steps) or not 1 <= steps <= T:
        raise ValueError(f"steps must be an int in 1..T = {T}, got {steps!r}")
    if steps == 1:
        return np.array([T])
    return np.unique(np.round(np.linspace(1, T, int(steps))).astype(np.int64))[::-1]


class DDPM(Sampler):
    """Ancestral sampling (Ho et al. 2020, Algorithm 2), one step per model time T..1:
    x_{t-1} = (x_t - beta_t / sqrt(1 - ab_t) eps) / sqrt(alpha_t) + sigma_t z, with z = 0 at t = 1.

    ``variance``: "beta" (sigma_t^2 = beta_t) or "posterior" (beta_t (1 - ab_{t-1}) / (1 - ab_t)).
    """

    def __init__(self, betas: Any = None, timesteps: int | None = None, schedule: str = "linear",
                 variance: str = "beta", prediction: str = "eps") -> None:
        super().__init__(betas, timesteps, schedule, prediction)
        if variance not in ("beta", "posterior"):
            raise ValueError(f"variance must be 'beta' or 'posterior', got {variance!r}")
        self.variance = variance

    def _steps(self):
        t = np.arange(self.timesteps, 0, -1)
        beta, ab, ab_prev = self.betas[t - 1], self.alpha_bar[t], self.alpha_bar[t - 1]
        a = 1.0 / np.sqrt(1.0 - beta)
        b = -beta / (np.sqrt(1.0 - beta) * np.sqrt(1.0 - ab))
        var = beta if self.variance == "beta" else beta * (1.0 - ab_prev) / (1.0 - ab)
        sigma = np.sqrt(var)
        sigma[-1] = 0.0  # t = 1: the mean, no noise
        return t, a, b, sigma


class DDIM(Sampler):
    """DDIM (Song, Meng & Ermon 2021) over ``steps`` evenly spaced model times, with noise ``eta``:
    x_s = sqrt(ab_s) x0_hat + sqrt(1 - ab_s - sigma^2) eps + sigma z, sigma = eta sqrt((1 - ab_s) /
    (1 - ab_t)) sqrt(1 - ab_t / ab_s). eta = 1 with every time is DDPM with the posterior variance;
    eta = 0 is deterministic (every step is a point mass: nothing to speculate on unless the draft
    is exact, so ``speculative_sample`` then runs it step by step). The last step (to ab = 1) is
    deterministic for every eta.
    """

    def __init__(self, betas: Any = None, timesteps: int | None = None, schedule: str = "linear",
                 steps: int | None = 50, eta: float = 1.0, prediction: str = "eps") -> None:
        super().__init__(betas, timesteps, schedule, prediction)
        if isinstance(eta, bool) or not isinstance(eta, (int, float, np.integer, np.floating)) or not 0 <= eta < 1e6:
            raise ValueError(f"eta must be a real number >= 0, got {eta!r}")
        self.eta = float(eta)
        self.grid = _strided(self.timesteps, steps)

    def _steps(self):
        t = self.grid
        prev = np.append(t[1:], 0)
        ab, ab_s = self.alpha_bar[t], self.alpha_bar[prev]
        sigma = self.eta * np.sqrt((1.0 - ab_s) / (1.0 - ab)) * np.sqrt(np.maximum(1.0 - ab / ab_s, 0.0))
        a = np.sqrt(ab_s) / np.sqrt(ab)
        b = np.sqrt(np.maximum(1.0 - ab_s - sigma**2, 0.0)) - np.sqrt(ab_s) * np.sqrt(1.0 - ab) / np.sqrt(ab)
        sigma[-1] = 0.0  # ab_s = 1: exactly 0 already; no rounding residue either
        return t, a, b, sigma


class VPSDE(Sampler):
    """Euler-Maruyama on the reverse VP-SDE (Song et al. 2021) with beta(t / T) = T beta_t, over
    ``steps`` evenly spaced model times (None: every time): from t to s, with h = (t - s) / T,
    x_s = x + h (beta x / 2 + beta score) + sqrt(beta h) z, score = -eps / sqrt(1 - ab_t).
    ``denoise=True`` (Song et al.'s noise removal) takes the mean in the last step, to t = 0.
    """

    def __init__(self, betas: Any = None, timesteps: int | None = None, schedule: str = "linear",
                 steps: int | None = None, denoise: bool = True, prediction: str = "eps") -> None:
        super().__init__(betas, timesteps, schedule, prediction)
        self.grid = _strided(self.timesteps, steps)
        self.denoise = bool(denoise)

    def _steps(self):
        t = self.grid
        prev = np.append(t[1:], 0)
        bh = self.betas[t - 1] * (t - prev)  # beta(t / T) h = T beta_t (t - s) / T
        a = 1.0 + 0.5 * bh
        b = -bh / np.sqrt(1.0 - self.alpha_bar[t])
        sigma = np.sqrt(bh)
        if self.denoise:
            sigma[-1] = 0.0
        return t, a, b, sigma
