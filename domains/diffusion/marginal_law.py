"""Exact laws for diffusion sampling: data whose denoiser is a formula, and the law of x_t along the chain.

Data laws with a closed-form score (every coordinate independent given the component):

- :class:`GaussianData` ``N(m, s^2 I)``: the forward marginal is q_t = N(sqrt(ab) m, (ab s^2 + 1 - ab) I)
  and the exact denoiser is affine in x: eps*(x, t) = sqrt(1 - ab) (x - sqrt(ab) m) / (ab s^2 + 1 - ab);
- :class:`GaussianMixture` ``sum_k w_k N(m_k, s_k^2 I)``: q_t is the mixture of the components'
  marginals and eps*(x, t) = -sqrt(1 - ab) grad log q_t(x), their responsibility-weighted average.

``data.denoiser(sampler)`` is that exact denoiser as a torch module (float64; it predicts what the
sampler's ``prediction`` says: eps, x_0 or v), ``ClassConditional`` a class-conditional one (one
data law per label, the null label's for "no class"), for guided sampling.

The law of the CHAIN (not of the continuous-time SDE: the discretisation has its own error, which
speculation neither adds nor removes): when the target's eps is affine in x at every step
(Gaussian data, and any guided combination of Gaussian classes), every step x' = a x + b eps + sigma z
is affine-Gaussian, each coordinate is an independent Gaussian Markov chain, and
:func:`affine_chain_law` gives its exact law from x_T ~ N(0, I): the mean and variance of every
state and the regression of each state on an earlier one (:class:`ChainLaw`), and the law of binned
paths of one coordinate by quadrature (:meth:`ChainLaw.binned_path_law`, error below 1e-12).

Example:
    >>> from speculate.domains.diffusion import DDPM
    >>> sched = DDPM(timesteps=1000)
    >>> law = affine_chain_law(sched, GaussianData(mean=[2.0], std=0.5))
    >>> m, v = law.marginal(0)                           # x_0 along the chain vs the data: close, not equal
    >>> round(float(m[0]), 2), round(float(v), 3)
    (2.0, 0.251)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr

from speculate.testing.quadrature import panel_nodes

from .samplers import Sampler

__all__ = ["ChainLaw", "ClassConditional", "ExactDenoiser", "GaussianData", "GaussianMixture", "affine_chain_law",
           "guided"]


def _vec(v: Any, name: str) -> np.ndarray:
    a = np.atleast_1d(np.asarray(v, np.float64))
    if a.ndim != 1 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a finite 1-D vector, got {v!r}")
    return a


@dataclass(frozen=True, init=False, eq=False)
class GaussianMixture:
    """Data ``sum_k weights[k] N(means[k], stds[k]^2 I)`` in D dimensions (means [K, D])."""

    weights: np.ndarray
    means: np.ndarray
    stds: np.ndarray

    def __init__(self, weights: Any, means: Any, stds: Any) -> None:
        w = _vec(weights, "weights")
        m = np.atleast_2d(np.asarray(means, np.float64))
        s = _vec(stds, "stds")
        if np.any(w < 0) or not abs(w.sum() - 1) < 1e-9 or m.shape[0] != w.size or s.size != w.size \
                or np.any(s <= 0) or not np.all(np.isfinite(m)):
            raise ValueError("GaussianMixture: weights >= 0 summing to 1, means [K, D] finite, stds [K] > 0")
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "means", m)
        object.__setattr__(self, "stds", s)

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def sample(self, n: int, rng: Any) -> np.ndarray:
        """n draws [n, D]."""
        rng = np.random.default_rng(rng)
        k = rng.choice(len(self.weights), size=n, p=self.weights)
        return self.means[k] + self.stds[k, None] * rng.standard_normal((n, self.dim))

    def forward_marginal(self, alpha_bar: float) -> GaussianMixture:
        """q_t: the law of sqrt(ab) x_0 + sqrt(1 - ab) eps, x_0 from the data."""
        ab = float(alpha_bar)
        return GaussianMixture(self.weights, np.sqrt(ab) * self.means, np.sqrt(ab * self.stds**2 + 1 - ab))

    def eps(self, x: Any, alpha_bar: Any) -> Any:
        """The exact eps*(x, t) = -sqrt(1 - ab) grad log q_t(x) (x [N, D], ab [N]; torch or NumPy in, same out).

        With v_k = ab s_k^2 + 1 - ab and r_k the responsibilities (softmax over k of log w_k
        - |x - sqrt(ab) m_k|^2 / (2 v_k) - D log(v_k) / 2): eps* = sqrt(1 - ab) sum_k r_k (x - sqrt(ab) m_k) / v_k,
        one component at a time (K is small; no [N, K, D] temporaries)."""
        xp = _namespace(x)
        m = _like(self.means, x)  # [K, D]
        ab = alpha_bar[:, None]  # [N, 1]
        sab = xp.sqrt(ab)
        var = ab * _like(self.stds, x)[None, :] ** 2 + 1 - ab  # [N, K]
        logw = xp.log(_like(self.weights, x))
        diffs = [x - sab * m[k][None, :] for k in range(m.shape[0])]  # [N, D] each
        logp = xp.stack([-0.5 * xp.einsum("nd,nd->n", d, d) / var[:, k] for k, d in enumerate(diffs)], 1)
        logp = logp - 0.5 * self.dim * xp.log(var) + logw[None]  # [N, K]
        rv = _softmax(logp, xp) / var
        out = rv[:, :1] * diffs[0]
        for k in range(1, len(diffs)):
            out = out + rv[:, k:k + 1] * diffs[k]
        return xp.sqrt(1 - ab) * out

    def denoiser(self, sampler: Sampler) -> ExactDenoiser:
        """The exact denoiser of this data for ``sampler``'s schedule and prediction (a torch module)."""
        return ExactDenoiser(self, sampler)


class GaussianData(GaussianMixture):
    """Data ``N(mean, std^2 I)``: one component; its exact eps is affine in x (see the module docstring)."""

    def __init__(self, mean: Any, std: float) -> None:
        super().__init__([1.0], [_vec(mean, "mean")], [std])

    @property
    def mean(self) -> np.ndarray:
        return self.means[0]

    @property
    def std(self) -> float:
        return float(self.stds[0])

    def eps(self, x: Any, alpha_bar: Any) -> Any:
        """The exact eps*(x, t), affine in x (x [N, D], ab [N])."""
        xp = _namespace(x)
        ab = alpha_bar[:, None]
        c = xp.sqrt(1 - ab) / (ab * self.std**2 + 1 - ab)
        return c * (x - xp.sqrt(ab) * _like(self.mean, x)[None])

    def affine(self, alpha_bar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """eps*(x, t) = c x + d per time: c [S], d [S, D]."""
        ab = np.asarray(alpha_bar, np.float64)
        v = ab * self.std**2 + 1 - ab
        c = np.sqrt(1 - ab) / v
        return c, -(c * np.sqrt(ab))[:, None] * self.mean[None, :]


@dataclass(frozen=True)
class _Guided:
    """The guided eps out_u + w (out_c - out_u) of two affine data laws: affine too."""

    cond: GaussianData
    uncond: GaussianData
    w: float

    def affine(self, alpha_bar):
        cc, dc = self.cond.affine(alpha_bar)
        cu, du = self.uncond.affine(alpha_bar)
        return cu + self.w * (cc - cu), du + self.w * (dc - du)

    @property
    def dim(self) -> int:
        return self.cond.dim


def guided(cond: GaussianData, uncond: GaussianData, w: float) -> _Guided:
    """The guided target of Gaussian class laws (for :func:`affine_chain_law`)."""
    return _Guided(cond, uncond, float(w))


def _namespace(x: Any) -> Any:
    if hasattr(x, "detach"):
        import torch

        return torch
    return np


def _like(a: np.ndarray, x: Any) -> Any:
    if hasattr(x, "detach"):
        import torch

        return torch.as_tensor(a, dtype=x.dtype, device=x.device)
    return a


def _softmax(logp: Any, xp: Any) -> Any:
    if xp is np:
        z = logp - logp.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)
    return xp.softmax(logp, dim=1)


def _convert(eps: Any, x: Any, ab: Any, prediction: str) -> Any:
    """The exact eps as the prediction the sampler expects (NumPy: x, eps [N, D], ab [N, 1])."""
    if prediction == "eps":
        return eps
    x0 = (x - np.sqrt(1 - ab) * eps) / np.sqrt(ab)
    if prediction == "x0":
        return x0
    return np.sqrt(ab) * eps - np.sqrt(1 - ab) * x0


def _make_module():
    import torch

    class _Exact(torch.nn.Module):
        def __init__(self, laws: Mapping[int | None, GaussianMixture], sampler: Sampler) -> None:
            super().__init__()
            self.laws = dict(laws)
            self.prediction = sampler.prediction
            self.register_buffer("alpha_bar", torch.as_tensor(sampler.alpha_bar, dtype=torch.float64))
            self.calls = 0

        def forward(self, x, t, labels=None):
            """The closed form, computed in NumPy float64 (the inputs' dtype and device come back)."""
            self.calls += 1
            ab = self.alpha_bar.numpy()[t.cpu().numpy()]
            flat = x.detach().cpu().double().numpy().reshape(x.shape[0], -1)
            with np.errstate(over="ignore", invalid="ignore"):  # far-off states give inf / NaN: the caller's business
                if labels is None:
                    eps = self.laws[None].eps(flat, ab)
                else:
                    y = labels.cpu().numpy()
                    eps = np.zeros_like(flat)
                    covered = np.zeros(y.shape, bool)
                    for label, law in self.laws.items():
                        at = y == label
                        if at.any():
                            eps[at] = law.eps(flat[at], ab[at])
                            covered |= at
                    if not covered.all():
                        raise ValueError(f"no data law for label {int(y[~covered][0])}")
                out = _convert(eps, flat, ab[:, None], self.prediction)
            return torch.from_numpy(out.reshape(x.shape)).to(dtype=x.dtype, device=x.device)

    return _Exact


_MODULE: Any = None


def ExactDenoiser(data: GaussianMixture | Mapping[int, GaussianMixture], sampler: Sampler) -> Any:
    """The exact denoiser of ``data`` (a torch module with a float64 buffer, computing in NumPy float64):
    ``module(x, t)`` or, for a mapping
    {label: data law}, ``module(x, t, labels)``; it predicts eps, x_0 or v as ``sampler.prediction``
    says. Events of any shape are flattened to D = data.dim coordinates."""
    global _MODULE
    if _MODULE is None:
        _MODULE = _make_module()
    laws = dict(data) if isinstance(data, Mapping) else {None: data}
    return _MODULE(laws, sampler)


def ClassConditional(laws: Mapping[int, GaussianMixture], sampler: Sampler) -> Any:
    """The exact class-conditional denoiser ``module(x, t, labels)`` of {label: data law} (include the
    null label's law: the unconditional model of classifier-free guidance)."""
    return ExactDenoiser(dict(laws), sampler)


@dataclass(frozen=True)
class ChainLaw:
    """The exact law of an affine-Gaussian chain, per coordinate (see :func:`affine_chain_law`).

    ``labels``: the time label of every state (the sampler's times, then 0); state s has mean
    ``mean[s]`` [D] and variance ``var[s]`` (the same for every coordinate); ``gain[s]`` and
    ``offset[s]`` [D], ``noise[s]``: the step from state s is x' = gain x + offset + sqrt(noise) z.
    """

    labels: np.ndarray
    mean: np.ndarray  #: [S+1, D]
    var: np.ndarray  #: [S+1]
    gain: np.ndarray  #: [S]
    offset: np.ndarray  #: [S, D]
    noise: np.ndarray  #: [S]

    def index(self, t: int) -> int:
        hits = np.flatnonzero(self.labels == t)
        if hits.size != 1:
            raise ValueError(f"t = {t} is not a state of this chain")
        return int(hits[0])

    def marginal(self, t: int) -> tuple[np.ndarray, float]:
        """(mean [D], variance) of x_t along the chain."""
        s = self.index(t)
        return self.mean[s], float(self.var[s])

    def transition(self, t_from: int, t_to: int) -> tuple[float, np.ndarray, float]:
        """x_{t_to} = g x_{t_from} + o + sqrt(v) z (g, o [D], v) for t_to later in the chain than t_from."""
        s, u = self.index(t_from), self.index(t_to)
        if u <= s:
            raise ValueError("t_to must come after t_from in the chain (a smaller time)")
        g, o, v = 1.0, np.zeros(self.mean.shape[1]), 0.0
        for i in range(s, u):
            g, o, v = self.gain[i] * g, self.gain[i] * o + self.offset[i], self.gain[i] ** 2 * v + self.noise[i]
        return g, o, v

    def binned_path_law(self, coordinate: int, times: Sequence[int], edges: Sequence[Any],
                        order: int = 20, width: float = 0.25) -> dict[tuple[int, ...], float]:
        """P(bin(x_t[coordinate]) for t in times), times in chain order (decreasing, distinct).

        ``edges``: the inner bin edges, increasing, one sequence for every time or one per time
        (bin b is [edges[b-1], edges[b])). Nested Gauss-Legendre quadrature on panels no wider than
        ``width`` standard deviations (ending at every edge), the last state in closed form; the
        error is below 1e-12 for the default order and width.
        """
        idx = [self.index(t) for t in times]
        if any(b <= a for a, b in itertools.pairwise(idx)):
            raise ValueError("times must be in chain order (decreasing) and distinct")
        if len(edges) and np.ndim(edges[0]) == 0:
            edges = [edges] * len(idx)
        E = [np.asarray(e, np.float64) for e in edges]
        if len(E) != len(idx) or any(e.ndim != 1 or np.any(np.diff(e) <= 0) for e in E):
            raise ValueError("edges: one increasing sequence, or one per time")
        cdf_last = np.concatenate([[-np.inf], E[-1], [np.inf]])
        m0, v0 = self.mean[idx[0], coordinate], self.var[idx[0]]
        if len(idx) == 1:
            p = np.diff(ndtr((cdf_last - m0) / np.sqrt(v0)))
            return {(b,): float(v) for b, v in enumerate(p)}
        sd = np.sqrt(v0)
        x, w = panel_nodes(m0 - 9 * sd, m0 + 9 * sd, E[0], width * sd, order)
        a = w * np.exp(-0.5 * (x - m0) ** 2 / v0) / np.sqrt(2 * np.pi * v0)  # weight * density at the nodes
        label = np.searchsorted(E[0], x, side="right")
        pre = {(b,): np.where(label == b, a, 0.0) for b in range(len(E[0]) + 1)}
        for n, (s, u) in enumerate(itertools.pairwise(idx)):
            g, o, v = self.transition(int(self.labels[s]), int(self.labels[u]))
            mx = g * x + o[coordinate]
            if n == len(idx) - 2:  # the last state: closed form
                cells = np.diff(ndtr((cdf_last[None, :] - mx[:, None]) / np.sqrt(v)), axis=1)  # [M, bins]
                return {(*k, c): float(val) for k, arr in pre.items() for c, val in enumerate(arr @ cells)}
            e = E[n + 1]
            m1, v1 = self.mean[u, coordinate], self.var[u]
            y, wy = panel_nodes(m1 - 9 * np.sqrt(v1), m1 + 9 * np.sqrt(v1), e, width * np.sqrt(min(v, v1)), order)
            K = np.exp(-0.5 * (y[None, :] - mx[:, None]) ** 2 / v) / np.sqrt(2 * np.pi * v)  # [M, M']
            ly = np.searchsorted(e, y, side="right")
            pre = {(*k, b): np.where(ly == b, (arr @ K) * wy, 0.0) for k, arr in pre.items() for b in range(len(e) + 1)}
            x = y
        raise AssertionError("unreachable")


def affine_chain_law(sampler: Sampler, data: Any) -> ChainLaw:
    """The exact per-coordinate law of the chain of ``sampler`` from x_T ~ N(0, I) when the target's eps
    is affine in x: ``data`` is a :class:`GaussianData` (its exact denoiser) or ``guided(cond, uncond, w)``."""
    plan = sampler.plan()
    c, d = data.affine(plan.alpha_bar)  # eps = c x + d
    gain = plan.a + plan.b * c
    offset = plan.b[:, None] * d
    noise = plan.sigma**2
    S, D = len(plan.times), d.shape[1]
    mean = np.zeros((S + 1, D))
    var = np.ones(S + 1)
    for i in range(S):
        mean[i + 1] = gain[i] * mean[i] + offset[i]
        var[i + 1] = gain[i] ** 2 * var[i] + noise[i]
    return ChainLaw(plan.labels, mean, var, gain, offset, noise)
