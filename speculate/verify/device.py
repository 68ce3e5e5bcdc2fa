"""Token, block and greedy verification as tensor operations, for probabilities that live on an
accelerator.

The rules of ``token.py``, ``block.py`` and ``greedy.py`` (same inputs: the uniforms are inputs, so
these are pure functions; the same law), batched over rows with torch operations: no loop over
rows, no transfer to the host. Results stay on ``p``'s device with a per-row flag ``ok`` (False
where the row read NaN, inf or a negative probability, drafted an outcome with q = 0, or drew from
a row without mass), so a caller synchronises once per round, when it reads the counts. Draws are
inverse-CDF searches (``torch.searchsorted``) over float64 cumulative sums, where an outcome of zero
mass is never found; the residual's mass below ``tiny`` means p and q are equal up to rounding, and
the draw is from the target's row, as in the Numba kernels.

Only the draws' floating-point order differs from the Numba kernels (a running sum instead of
blocked sums), so outputs may differ in the last bit of a threshold, never in law:
:func:`verify_token_device`, :func:`verify_block_device` and :func:`verify_greedy_device` take and
return NumPy arrays like ``verify_token`` & co. (checked the same way) and run the tensor code on
the CPU, and tests/core/test_core_kernel_laws.py holds them to the rules' exact laws with the
enumerator that checks the Numba kernels.

>>> import torch
>>> p = torch.tensor([[[0.6, 0.4], [0.5, 0.5]]], dtype=torch.float64)   # [B=1, K+1=2, V=2]
>>> q = torch.tensor([[[0.8, 0.2]]], dtype=torch.float64)               # [B=1, K=1, V=2]
>>> n, nxt, ok = token_device(p, q, torch.tensor([[0]]), None, torch.tensor([[0.1]]), torch.tensor([0.3]))
>>> n.tolist(), nxt.tolist(), ok.tolist()
([1], [0], [True])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["DeviceCategorical", "block_device", "draw", "greedy_device", "token_device", "verify_block_device",
           "verify_device_round", "verify_greedy_device", "verify_token_device"]

Tensor = torch.Tensor


class DeviceCategorical:
    """Categorical distributions whose probabilities ``probs`` ``[*batch, V]`` are a tensor on some
    device: what a process hands the round loop (target scores, draft laws) so that verification
    runs where they are (:func:`verify_device_round`), with no copy to the host."""

    on_device = True  #: what the round loop looks for (it does not import torch for an isinstance check)

    def __init__(self, probs: Tensor) -> None:
        if not isinstance(probs, torch.Tensor) or probs.ndim < 1:
            raise TypeError(f"probs must be a torch.Tensor [..., V], got {type(probs).__name__}")
        self.probs = probs

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.probs.shape[:-1])

    @property
    def num_outcomes(self) -> int:
        return int(self.probs.shape[-1])


def verify_device_round(
    target: DeviceCategorical, proposal: Any, rule: str, branches: int, k: int, R: int, lengths: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """One round of the loop (``one_round.verify_round``) on the target's device: the drafts,
    lengths and the round's uniforms (drawn from ``rng`` in the order of the CPU route) go to the
    device, and the accepted counts and next outcomes come back in ONE transfer."""
    if branches != 1:
        raise ValueError("verification on the device takes one draft branch (branches=1)")
    shape = (R, k + 1)
    if target.batch_shape != shape:
        raise ValueError(f"target must score {shape} states (rows, k+1 positions) in one call, got a "
                         f"DeviceCategorical with batch shape {target.batch_shape}")
    p = target.probs
    dev, V = p.device, target.num_outcomes
    outcomes = np.zeros((R, k), np.int64) if k == 0 else np.asarray(proposal.outcomes, np.int64)
    if outcomes.shape != (R, k):
        raise ValueError(f"drafted outcomes must have shape {(R, k)}, got {outcomes.shape}")
    if outcomes.size and (outcomes.min() < 0 or outcomes.max() >= V):
        raise ValueError(f"drafted outcome outside 0..{V - 1}")
    drafts = torch.from_numpy(outcomes).to(dev)
    lens = torch.from_numpy(np.ascontiguousarray(lengths, np.int64)).to(dev)
    if rule == "greedy":
        n, nxt, ok = greedy_device(p, drafts, lens)
    else:
        d = proposal.dists
        if d is None:  # deterministic drafts: point masses at the outcomes
            q = torch.zeros((R, k, V), dtype=p.dtype, device=dev).scatter_(-1, drafts[..., None], 1.0)
        elif isinstance(d, DeviceCategorical):
            q = d.probs.to(dev)
        else:  # a host Categorical
            q = torch.from_numpy(np.ascontiguousarray(d.probs)).to(dev)
        if tuple(q.shape) != (R, k, V):
            raise ValueError(f"draft distributions must be [R, k, V] = {(R, k, V)}, got {tuple(q.shape)}")
        u = torch.from_numpy(rng.random(R + R * k)).to(dev)  # one copy; the CPU route's order: u_next, u_accept
        u_next, u_accept = u[:R], u[R:].view(R, k)
        fn = token_device if rule == "token" else block_device
        n, nxt, ok = fn(p, q, drafts, lens, u_accept, u_next)
    out = torch.stack([n, nxt, ok.to(torch.int64)]).cpu().numpy()  # the round's one transfer
    _raise_bad(out[2])
    return out[0], out[1], np.zeros(R, np.int64), f"{rule}-device"


def _raise_bad(ok: np.ndarray) -> None:
    """``ValueError`` naming the first row whose ``ok`` flag is off."""
    if not ok.all():
        b = int(np.flatnonzero(~ok.astype(bool))[0])
        raise ValueError(f"row {b}: probabilities contain NaN, inf or a negative value, a drafted outcome "
                         "has q = 0, or a row drawn from has no positive mass")


def draw(w: Tensor, u: Tensor) -> Tensor:
    """One outcome per row of the weights ``w`` ``[B, V]`` (>= 0, float64) by inverse CDF at the
    uniforms ``u`` ``[B]``: the first ``j`` whose running sum exceeds ``u * total`` (never an outcome
    of zero weight; ``u * total`` rounded up to the total gives the last outcome with weight)."""
    c = torch.cumsum(w, dim=-1)  # [B, V]
    j = torch.searchsorted(c, (u * c[:, -1])[:, None], right=True)[:, 0]  # [B]
    last = w.shape[-1] - 1 - torch.argmax(torch.flip(w > 0, [-1]).to(torch.uint8), dim=-1)  # [B]
    return torch.minimum(j, last)


def _tiny(dtype: torch.dtype) -> float:
    """Residual mass below which p and q are equal up to rounding: ``_inverse_cdf.tiny_for`` of the
    type the Numba kernels compute in (float32 stays float32; every other type becomes float64)."""
    from .._inverse_cdf import tiny_for

    return tiny_for(np.float32 if dtype == torch.float32 else np.float64)


def _leading(keep: Tensor) -> Tensor:
    """Per row of ``keep`` ``[B, K]`` (bool), the number of leading True values: ``[B]`` int64."""
    return keep.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _usable(row: Tensor) -> Tensor:
    """Rows ``[B, V]`` with no NaN, inf or negative entry."""
    return (torch.isfinite(row) & (row >= 0)).all(dim=-1)


def _inputs(p: Tensor, q: Tensor | None, drafts: Tensor, lengths: Tensor | None):
    B, K1, _ = p.shape
    K = K1 - 1
    dev = p.device
    drafts = drafts.to(dev, torch.int64)
    lengths = torch.full((B,), K, dtype=torch.int64, device=dev) if lengths is None else lengths.to(dev, torch.int64)
    valid = torch.arange(K, device=dev)[None, :] < lengths[:, None]  # [B, K]
    inside = (drafts >= 0) & (drafts < p.shape[-1])
    x = drafts.clamp(0, p.shape[-1] - 1)[..., None]  # [B, K, 1] (a bad index is reported, not read)
    px = p[:, :K].gather(-1, x)[..., 0].double()  # [B, K]
    qx = None if q is None else q.gather(-1, x)[..., 0].double()
    return K, lengths, valid, inside, px, qx


def _drafts_ok(valid: Tensor, inside: Tensor, px: Tensor, qx: Tensor, read: Tensor) -> Tensor:
    """Rows whose drafts read (``read`` [B, K]: the positions the rule looks at) are usable."""
    good = inside & torch.isfinite(px) & torch.isfinite(qx) & (px >= 0) & (qx > 0)
    return ~(valid & read & ~good).any(dim=1)


def _next(p_row: Tensor, q_row: Tensor, resid: Tensor, use_p: Tensor, u: Tensor,
          tiny: float) -> tuple[Tensor, Tensor]:
    """The next outcome per row: from ``p_row`` where ``use_p``, else from the residual weights
    ``resid`` (from ``p_row`` when their mass is <= ``tiny``); and whether the row drawn was usable,
    as ``_inverse_cdf.draw_residual`` judges it: a residual that is not finite, and a residual draw
    whose outcome has q < 0 (mass that comes from a negative q, not from p), are bad; ``q_row`` of a
    row that draws from ``p_row`` is never read."""
    total = resid.sum(dim=-1)
    from_p = use_p | (total <= tiny)
    w = torch.where(from_p[:, None], p_row, resid)
    ok = (use_p | torch.isfinite(total)) & (w.sum(dim=-1) > 0) & torch.where(from_p, _usable(p_row), True)
    nxt = draw(torch.where(ok[:, None], w, torch.ones_like(w)), u)
    return nxt, ok & (from_p | (q_row.gather(-1, nxt[:, None])[:, 0] >= 0))


def token_device(p: Tensor, q: Tensor, drafts: Tensor, lengths: Tensor | None, u_accept: Tensor,
                 u_next: Tensor, tiny: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Token-wise verification (``token.py``) of ``p`` ``[B, K+1, V]``, ``q`` ``[B, K, V]``:
    ``(n_accepted [B], next_outcome [B], ok [B])`` on ``p``'s device."""
    tiny = _tiny(p.dtype) if tiny is None else tiny
    K, lengths, valid, inside, px, qx = _inputs(p, q, drafts, lengths)
    dev = p.device
    keep = valid & (u_accept.to(dev, torch.float64) * qx < px)  # u q(x) < p(x): probability min(1, p/q)
    n = _leading(keep)  # [B]
    read = torch.arange(K, device=dev)[None, :] <= n[:, None]  # the rule reads positions 0..n
    ar = torch.arange(p.shape[0], device=dev)
    p_row = p[ar, n].double()  # [B, V]
    q_row = q[ar, n.clamp(max=max(K - 1, 0))].double() if K else torch.zeros_like(p_row)
    resid = (p_row - q_row).clamp(min=0)  # norm(max(p - q, 0)); NaN stays NaN
    nxt, ok = _next(p_row, q_row, resid, n == lengths, u_next.to(dev, torch.float64), tiny)
    return n, nxt, ok & _drafts_ok(valid, inside, px, qx, read) & (lengths >= 0) & (lengths <= K)


def block_device(p: Tensor, q: Tensor, drafts: Tensor, lengths: Tensor | None, u_accept: Tensor,
                 u_next: Tensor, tiny: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Block verification (``block.py``, Sun et al. 2025), every position at once:
    ``P_i = min(P_{i-1} p_i(X_i) / q_i(X_i), 1)``, ``h_i = R_i / (R_i + 1 - P_i)`` (``h_L = P_L``,
    1 where ``P_i = 1``), tau = the last ``i <= L`` with ``P_i > 0`` and ``U_i < h_i``; then the
    bonus from ``p_{L+1}`` or a draw from ``norm(max(P_tau p - q, 0))`` at ``tau``."""
    tiny = _tiny(p.dtype) if tiny is None else tiny
    K, lengths, valid, inside, px, qx = _inputs(p, q, drafts, lengths)
    dev = p.device
    B = p.shape[0]
    Ps = [torch.ones(B, dtype=torch.float64, device=dev)]
    for i in range(K):  # P_i = min(P_{i-1} p / q, 1), in the kernel's order of operations (K small steps)
        Ps.append(torch.clamp(Ps[-1] * px[:, i] / torch.where(valid[:, i], qx[:, i], 1.0), max=1.0))
    P = torch.stack(Ps, dim=1)  # [B, K+1]
    upto = torch.arange(K + 1, device=dev)[None, :] <= lengths[:, None]  # [B, K+1]: P_0 .. P_L
    P = torch.where(upto, P, 0.0)  # past L: unused
    i = torch.arange(1, K + 1, device=dev)[None, :]  # [1, K]
    Pi = P[:, 1:]  # [B, K]
    if K > 1:  # R_i = sum_x max(P_i p_i(x) - q_i(x), 0) at positions 1..K-1 (p row i, q row i)
        R = (Pi[:, :-1, None] * p[:, 1:K].double() - q[:, 1:K].double()).clamp(min=0).sum(dim=-1)  # [B, K-1]
        R = torch.cat([R, torch.zeros_like(R[:, :1])], dim=1)  # [B, K]
    else:
        R = torch.zeros_like(Pi)
    h = torch.where(i == lengths[:, None], Pi, torch.where(Pi >= 1.0, 1.0, R / (R + 1.0 - Pi)))
    hit = (i <= lengths[:, None]) & (Pi > 0) & (u_accept.to(dev, torch.float64) < h)  # [B, K]
    tau = (hit.to(torch.int64) * i).amax(dim=1) if K else torch.zeros(B, dtype=torch.int64, device=dev)
    ar = torch.arange(B, device=dev)
    p_row = p[ar, tau].double()
    q_row = q[ar, tau.clamp(max=max(K - 1, 0))].double() if K else torch.zeros_like(p_row)
    resid = (P[ar, tau][:, None] * p_row - q_row).clamp(min=0)
    nxt, ok = _next(p_row, q_row, resid, tau == lengths, u_next.to(dev, torch.float64), tiny)
    read = torch.ones_like(valid)  # the rule reads every draft of the block
    used = (i >= tau[:, None]) & (i < lengths[:, None]) & (Pi > 0) & (Pi < 1)  # where the scan computed R_i
    R_ok = ~(used & ~torch.isfinite(R)).any(dim=1)
    return tau, nxt, ok & R_ok & _drafts_ok(valid, inside, px, qx, read) & (lengths >= 0) & (lengths <= K)


def greedy_device(p: Tensor, drafts: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification (``greedy.py``): keep drafts while equal to the first argmax of ``p``;
    the next outcome is the first argmax at the first mismatch (or the bonus)."""
    K, lengths, valid, inside, _, _ = _inputs(p, None, drafts, lengths)
    dev = p.device
    top = p.argmax(dim=-1)  # [B, K+1]: the first index of the largest value
    n = _leading(valid & (drafts.to(dev) == top[:, :K]))
    ar = torch.arange(p.shape[0], device=dev)
    read = torch.arange(K + 1, device=dev)[None, :] <= n[:, None]  # rows 0..n
    rows_ok = _usable(p) & (p.amax(dim=-1) > 0)  # [B, K+1]
    ok = ~(read & ~rows_ok).any(dim=1) & ~(valid & read[:, :K] & ~inside).any(dim=1)
    return n, top[ar, n], ok & (lengths >= 0) & (lengths <= K)


# --------------------------------------------------------------------------------------------
# NumPy in and out (checked as verify_token & co.): the exactness tests run these on the CPU


def _numpy(fn: Any, *arrays: Any, tiny: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    t = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    out = fn(*t) if tiny is None else fn(*t, tiny)
    n, nxt, ok = (x.cpu().numpy() for x in out)
    _raise_bad(ok)
    return n.astype(np.int64), nxt.astype(np.int64)


def verify_token_device(p: Any, q: Any, drafts: Any, lengths: Any = None, u_accept: Any = None,
                        u_next: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_device` with the inputs and outputs of ``speculate.verify.verify_token``."""
    from .kernels import _check_categorical

    p, q, drafts, lengths, u_accept, u_next, tiny = _check_categorical(p, q, drafts, lengths, u_accept, u_next)
    return _numpy(token_device, p, q, drafts, lengths, u_accept, u_next, tiny=tiny)


def verify_block_device(p: Any, q: Any, drafts: Any, lengths: Any = None, u_accept: Any = None,
                        u_next: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`block_device` with the inputs and outputs of ``speculate.verify.verify_block``."""
    from .kernels import _check_categorical

    p, q, drafts, lengths, u_accept, u_next, tiny = _check_categorical(p, q, drafts, lengths, u_accept, u_next)
    return _numpy(block_device, p, q, drafts, lengths, u_accept, u_next, tiny=tiny)


def verify_greedy_device(p: Any, drafts: Any, lengths: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`greedy_device` with the inputs and outputs of ``speculate.verify.verify_greedy``."""
    from .kernels import _check_greedy

    p, drafts, lengths = _check_greedy(p, drafts, lengths)
    return _numpy(greedy_device, p, drafts, lengths)
