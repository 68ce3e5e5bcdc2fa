"""One-step verification of a drafted outcome, for any pair of distributions.

Given the target p, the draft q and an outcome x already drawn from q, return (y, accepted) with
y ~ p exactly: keep x with probability min(1, p(x)/q(x)), otherwise draw from the residual
norm(max(p - q, 0)). The residual is drawn exactly for every kind:

- Categorical/Categorical: the shared token kernel (normalised (p - q)+, inverse CDF);
- Normal/Normal with equal scale: reflection maximal coupling (constant time);
- PointMass target: speculative execution (keep x iff it equals the target's value);
- anything else: rejection from p with acceptance (1 - q(y)/p(y))+, at most ``max_tries`` tries
  (expected 1/TV(p, q) tries, and a residual is needed only with probability TV(p, q), so the
  expected work per call is one draw from p). Past the bound a ResidualSamplingError is raised:
  never a wrong sample. The chance of that, per call, is at most 1/(e * max_tries).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..distributions import Categorical, Normal, PointMass
from .kernels import verify_gaussian, verify_token

DEFAULT_MAX_TRIES = 100_000


class ResidualSamplingError(RuntimeError):
    """Rejection sampling of the residual exceeded its bound on tries (see ``max_tries``)."""


def verify_one(p: Any, q: Any, x: Any, rng: np.random.Generator, max_tries: int = DEFAULT_MAX_TRIES) -> tuple[Any, Any]:
    """Keep ``x ~ q`` or replace it so that the result is distributed as ``p``."""
    if isinstance(p, PointMass):
        kept = p.log_prob(x) == 0.0
        return (x if kept else p.value), kept
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        return _categorical(p, q, x, rng)
    if isinstance(p, Normal) and isinstance(q, Normal):
        _check_normal_pair(p, q)
        if _same_scale(p, q):
            return _reflection(p, q, x, rng)
        if p.batch_ndims:
            return _batched_general(p, q, x, rng, max_tries)
    _check_kinds(p, q)
    if isinstance(q, PointMass) and getattr(p, "discrete", None) is False:
        return p.sample(rng), False  # a continuous target puts no mass on the drafted point
    return _general(p, q, x, rng, max_tries)


def _check_kinds(p: Any, q: Any) -> None:
    dp, dq = getattr(p, "discrete", None), getattr(q, "discrete", None)
    if dp is not None and dq is not None and dp != dq:
        kind = {True: "discrete", False: "continuous"}
        raise ValueError(
            f"target is {kind[dp]} but draft is {kind[dq]}: they must be distributions on the same "
            "kind of space (both mass functions or both densities)"
        )


def _categorical(p: Categorical, q: Categorical, x: Any, rng: np.random.Generator):
    if p.num_outcomes != q.num_outcomes:
        raise ValueError(f"vocabulary mismatch: target has {p.num_outcomes} outcomes, draft has {q.num_outcomes}")
    if p.batch_shape != q.batch_shape:
        raise ValueError(f"batch shapes differ: target {p.batch_shape}, draft {q.batch_shape}")
    shape, V = p.batch_shape, p.num_outcomes
    xs = np.asarray(x)
    if xs.shape != shape:
        raise ValueError(f"drafted outcome has shape {xs.shape}, expected the batch shape {shape}")
    dtype = np.result_type(p.dtype, q.dtype)
    pp = p.probs.reshape(-1, 1, V).astype(dtype, copy=False)
    p2 = np.concatenate([pp, pp], axis=1)  # [B, 2, V]: the kernel also wants a bonus row
    q1 = q.probs.reshape(-1, 1, V).astype(dtype, copy=False)  # [B, 1, V]
    B = p2.shape[0]
    u_accept = rng.random((B, 1))
    u_next = rng.random(B)
    n, nxt = verify_token(p2, q1, xs.reshape(B, 1), None, u_accept, u_next)
    kept = n == 1
    y = np.where(kept, xs.reshape(B), nxt)
    if not shape:
        return int(y[0]), bool(kept[0])
    return y.reshape(shape), kept.reshape(shape)


def _check_normal_pair(p: Normal, q: Normal) -> None:
    if p.loc.shape != q.loc.shape or p.batch_ndims != q.batch_ndims:
        raise ValueError(
            f"target Normal (loc {p.loc.shape}, batch_ndims {p.batch_ndims}) and draft Normal "
            f"(loc {q.loc.shape}, batch_ndims {q.batch_ndims}) must have the same shapes"
        )


def _same_scale(p: Normal, q: Normal) -> bool:
    return bool(np.array_equal(np.broadcast_to(p.scale, p.loc.shape), np.broadcast_to(q.scale, q.loc.shape)))


def _reflection(p: Normal, q: Normal, x: Any, rng: np.random.Generator):
    shape = p.loc.shape
    xs = np.asarray(x, dtype=np.float64)
    if xs.shape != shape:
        raise ValueError(f"drafted outcome has shape {xs.shape}, expected {shape}")
    B = int(np.prod(p.batch_shape, dtype=np.int64))
    D = int(np.prod(p.event_shape, dtype=np.int64))
    lp = p.loc.reshape(B, 1, D)
    loc_p = np.concatenate([lp, lp], axis=1)  # [B, 2, D]
    scale = np.broadcast_to(p.scale, shape).reshape(B, 1, D)
    scale = np.concatenate([scale, scale], axis=1)
    u_accept = rng.random((B, 1))
    z_next = rng.standard_normal((B, D))
    n, nxt = verify_gaussian(loc_p, q.loc.reshape(B, 1, D), scale, xs.reshape(B, 1, D), None, u_accept, z_next)
    kept = n == 1
    y = np.where(kept[:, None], xs.reshape(B, D), nxt).reshape(shape)
    if not p.batch_shape:
        return y, bool(kept[0])
    return y, kept.reshape(p.batch_shape)


def _batched_general(p: Normal, q: Normal, x: Any, rng: np.random.Generator, max_tries: int):
    xs = np.asarray(x, dtype=np.float64)
    flat_p = p.loc.reshape(-1, *p.event_shape)
    ys, kept = np.empty(flat_p.shape, np.float64), np.empty(len(flat_p), bool)  # float64, as the kernel route
    sp = np.broadcast_to(p.scale, p.loc.shape).reshape(flat_p.shape)
    sq = np.broadcast_to(q.scale, q.loc.shape).reshape(flat_p.shape)
    lq = q.loc.reshape(flat_p.shape)
    for i, xi in enumerate(xs.reshape(flat_p.shape)):
        ys[i], kept[i] = _general(Normal(flat_p[i], sp[i]), Normal(lq[i], sq[i]), xi, rng, max_tries)
    return ys.reshape(p.loc.shape), kept.reshape(p.batch_shape)


def _log_prob(d: Any, y: Any, who: str) -> float:
    lp = d.log_prob(y)
    if np.ndim(lp) != 0:
        raise ValueError(f"{who}.log_prob returned shape {np.shape(lp)}; it must return one number")
    lp = float(lp)
    if math.isnan(lp) or lp == math.inf:
        raise ValueError(f"{who}.log_prob({y!r}) is {lp}: log probabilities must be finite or -inf")
    return lp


def _general(p: Any, q: Any, x: Any, rng: np.random.Generator, max_tries: int):
    lq = _log_prob(q, x, "draft")
    if lq == -math.inf:
        raise ValueError(f"drafted outcome {x!r} has draft probability q = 0: it cannot have been drawn from q")
    lp = _log_prob(p, x, "target")
    u = rng.random()
    if lp >= lq or u < math.exp(lp - lq):
        return x, True
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    for _ in range(max_tries):
        y = p.sample(rng)
        lpy = _log_prob(p, y, "target")
        lqy = _log_prob(q, y, "draft")
        keep = 1.0 if lqy == -math.inf else max(0.0, 1.0 - math.exp(lqy - lpy))
        if rng.random() < keep:
            return y, False
    raise ResidualSamplingError(
        f"no residual sample in {max_tries} tries of rejection from the target: the target and the "
        "draft are nearly equal (total variation below about 1/max_tries) or the draft puts more "
        "mass than the target almost everywhere; raise max_tries, or use distributions with a "
        "closed-form residual (Categorical, equal-scale Normal)"
    )
