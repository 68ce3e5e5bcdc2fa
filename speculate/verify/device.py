"""Token, block, greedy and multi-draft verification as tensor operations, for probabilities that
live on an accelerator.

The rules of ``token.py``, ``block.py``, ``greedy.py`` and ``multi.py`` (same inputs: the uniforms
are inputs, so these are pure functions; the same law), batched over rows with torch operations: no
loop over rows (multi-draft loops over its K+1 depths and m branches, every row at once), no
transfer to the host. Results stay on ``p``'s device with a per-row flag ``ok`` (False
where the row read NaN, inf or a negative probability, drafted an outcome with q = 0, or drew from
a row without mass), so a caller synchronises once per round, when it reads the counts. Draws are
inverse-CDF searches (``torch.searchsorted``) over float64 cumulative sums, where an outcome of zero
mass is never found; the residual's mass below ``tiny`` means p and q are equal up to rounding, and
the draw is from the target's row, as in the Numba kernels.

Only the floating-point order of sums differs from the Numba kernels (a running sum instead of
blocked sums, in a draw and in multi-draft's residual totals), so outputs may differ in the last
bit of a threshold, never in law: :func:`verify_token_device`, :func:`verify_block_device`,
:func:`verify_greedy_device` and :func:`verify_multi_device` take and return NumPy arrays like
``verify_token`` & co. (checked the same way) and run the tensor code on the CPU, and
tests/core/test_core_kernel_laws.py holds them to the rules' exact laws with the enumerator that
checks the Numba kernels.

The tensors these rules read and the helpers that move and draw them (``DeviceCategorical``,
``upload``, ``draw``) are ``speculate/device_tensors.py``'s, re-exported here; the checks a round
makes before a rule runs are ``round_checks.py``'s, shared with the host route (``one_round.py``,
which routes a round here).

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

from ..device_tensors import DeviceCategorical, draw, upload
from .round_checks import check_draft_laws, round_outcomes

__all__ = ["DeviceCategorical", "block_device", "draw", "greedy_device", "multi_device", "token_device", "upload",
           "verify_block_device", "verify_device_round", "verify_greedy_device", "verify_multi_device",
           "verify_token_device"]

Tensor = torch.Tensor


def verify_device_round(
    target: DeviceCategorical, proposal: Any, rule: str, branches: int, k: int, R: int, lengths: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """One round of the loop (``one_round.verify_round`` routes it here) on the target's device: the drafts,
    lengths and the round's uniforms (drawn from ``rng`` in the order of the CPU route: ``u_next``
    [R], then ``u_accept`` [R, k] or, with m = ``branches`` > 1, [R, k, m]) go to the device, and the
    accepted counts, next outcomes and branches come back in ONE transfer. With m > 1 the target
    scores ``(R, m, k+1)`` states and the rule is the token rule (multi-draft: route
    "multi-device")."""
    m = branches
    oshape, outcomes = round_outcomes(target, proposal, rule, m, k, R)  # the host route's checks
    p, V = target.probs, target.num_outcomes
    if rule != "greedy":
        check_draft_laws(proposal.dists, outcomes, oshape, V, on_device=True)  # and of the draft's laws
    dev = p.device
    drafts = upload(np.asarray(outcomes, np.int64), dev)
    lens = upload(np.ascontiguousarray(lengths, np.int64), dev)
    branch = None  # one branch: all zeros, made on the host
    if rule == "greedy":
        n, nxt, ok = greedy_device(p, drafts, lens)
    else:
        q = _round_q(proposal.dists, p, drafts, (*oshape, V))  # checked above
        u = upload(rng.random(R + R * k * m), dev)  # one copy; the CPU route's order: u_next, u_accept
        u_next, u_accept = u[:R], u[R:].view((R, k, m) if m != 1 else (R, k))
        if m != 1:
            n, nxt, branch, ok = multi_device(p, q, drafts, lens, u_accept, u_next)
        else:
            n, nxt, ok = (token_device if rule == "token" else block_device)(p, q, drafts, lens, u_accept, u_next)
    rows = [n, nxt, ok.to(torch.int64)] + ([] if branch is None else [branch])
    out = torch.stack(rows).cpu().numpy()  # the round's one transfer
    _raise_bad(out[2])
    if branch is None:
        return out[0], out[1], np.zeros(R, np.int64), f"{rule}-device"
    return out[0], out[1], out[3], "multi-device"


def _round_q(d: Any, p: Tensor, drafts: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The draft laws ``shape`` = ``[*drafts.shape, V]`` (checked: ``round_checks.check_draft_laws``) on
    ``p``'s device: point masses at the drafts (``d`` None), a DeviceCategorical's tensor or a host
    Categorical's array."""
    if d is None:  # deterministic drafts: point masses at the outcomes
        return torch.zeros(shape, dtype=p.dtype, device=p.device).scatter_(-1, drafts[..., None], 1.0)
    if isinstance(d, DeviceCategorical):
        return d.probs.to(p.device)
    return upload(np.ascontiguousarray(d.probs), p.device)  # a host Categorical


def _raise_bad(ok: np.ndarray) -> None:
    """``ValueError`` naming the first row whose ``ok`` flag is off."""
    if not ok.all():
        b = int(np.flatnonzero(~ok.astype(bool))[0])
        raise ValueError(f"row {b}: probabilities contain NaN, inf or a negative value, a drafted outcome "
                         "has q = 0, or a row drawn from has no positive mass")


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


def _weight(x: Tensor) -> Tensor:
    """``max(x, 0)`` as ``_inverse_cdf.weight`` takes it where it matters: NaN and -inf give NaN, not 0
    as ``clamp(min=0)`` would (a residual built from +inf q or -inf p is not finite, and the row is
    refused); +inf gives NaN where the kernel keeps +inf, a row refused either way."""
    return torch.maximum(x, 0.0 * x)  # maximum propagates NaN; 0 * -inf is NaN; 0 * a finite x is +-0


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
    resid = _weight(p_row - q_row)  # norm(max(p - q, 0))
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
        R = _weight(Pi[:, :-1, None] * p[:, 1:K].double() - q[:, 1:K].double()).sum(dim=-1)  # [B, K-1]
        R = torch.cat([R, torch.zeros_like(R[:, :1])], dim=1)  # [B, K]
    else:
        R = torch.zeros_like(Pi)
    h = torch.where(i == lengths[:, None], Pi, torch.where(Pi >= 1.0, 1.0, R / (R + 1.0 - Pi)))
    hit = (i <= lengths[:, None]) & (Pi > 0) & (u_accept.to(dev, torch.float64) < h)  # [B, K]
    tau = (hit.to(torch.int64) * i).amax(dim=1) if K else torch.zeros(B, dtype=torch.int64, device=dev)
    ar = torch.arange(B, device=dev)
    p_row = p[ar, tau].double()
    q_row = q[ar, tau.clamp(max=max(K - 1, 0))].double() if K else torch.zeros_like(p_row)
    resid = _weight(P[ar, tau][:, None] * p_row - q_row)
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


def multi_device(p: Tensor, q: Tensor, drafts: Tensor, lengths: Tensor | None, u_accept: Tensor,
                 u_next: Tensor, tiny: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Multi-draft verification (``multi.py``: recursive rejection over m branches) of ``p``
    ``[B, m, K+1, V]``, ``q`` ``[B, m, K, V]``, ``drafts`` ``[B, m, K]``, ``lengths`` ``[B, m]``,
    ``u_accept`` ``[B, K, m]``: ``(n_accepted [B], next_outcome [B], branch [B], ok [B])`` on
    ``p``'s device, ``branch`` the first live branch at the last depth. Depth by depth (a row still
    running at depth d has kept d drafts), every row at once; the residual is kept as the kernel
    keeps it, unnormalised weights ``w`` and their total ``Z``."""
    tiny = _tiny(p.dtype) if tiny is None else tiny
    B, m, K1, _ = p.shape
    dev = p.device
    drafts = drafts.to(dev, torch.int64)
    lengths = (torch.full((B, m), K1 - 1, dtype=torch.int64, device=dev) if lengths is None
               else lengths.to(dev, torch.int64))
    u_accept, u_next = u_accept.to(dev, torch.float64), u_next.to(dev, torch.float64)
    ar = torch.arange(B, device=dev)
    running = ((lengths >= 0) & (lengths <= K1 - 1)).all(dim=1)  # [B]: a bad length stops the row at once
    ok = running.clone()
    alive = torch.ones((B, m), dtype=torch.bool, device=dev)  # [B, m]: branches that agree with the kept prefix
    n, branch = (torch.zeros(B, dtype=torch.int64, device=dev) for _ in range(2))
    ended = torch.zeros(B, dtype=torch.bool, device=dev)  # [B]: the rows whose next outcome is drawn
    w_end: Tensor | None = None  # [B, V]: the weights each row draws from (its last residual or p's row)
    for d in range(K1):
        j0 = torch.argmax(alive.to(torch.uint8), dim=1)  # [B]: the first live branch
        p_row = p[ar, j0, d].double()  # [B, V]
        w, kept, bad = _multi_depth(p_row, q, drafts, lengths, u_accept, running & alive.T, d, tiny)
        ok &= ~bad
        end = running & ~bad & (kept < 0)  # [B]: every candidate rejected, or none: the next outcome is drawn here
        n, branch, ended = torch.where(end, d, n), torch.where(end, j0, branch), ended | end
        w_end = w if w_end is None else torch.where(end[:, None], w, w_end)  # [B, V]: what the draw reads
        running = running & ~bad & (kept >= 0)  # [B]: a draft kept at depth d
        if d < K1 - 1:
            x = drafts[:, :, d].gather(1, kept.clamp(min=0)[:, None])  # [B, 1]: the kept outcome
            alive = torch.where(running[:, None], alive & (lengths > d) & (drafts[:, :, d] == x), alive)
    nxt, usable = _multi_next(w_end, u_next)  # ONE draw per row, at the depth where it ended
    y_ok = usable & (p[ar, branch, n, nxt] > 0)  # p's row there (else the residual's mass came from a negative q)
    return n, nxt, branch, ok & (~ended | y_ok)


def _multi_depth(p_row: Tensor, q: Tensor, drafts: Tensor, lengths: Tensor, u_accept: Tensor, live: Tensor,
                 d: int, tiny: float) -> tuple[Tensor, Tensor, Tensor]:
    """Depth ``d`` of recursive rejection, from ``p_row`` ``[B, V]`` (float64: p at the first live
    branch): each live branch (``live`` ``[m, B]``) with a d-th draft is a candidate, in branch
    order, kept where ``u q(x) Z < w(x)``; on rejection ``w <- max(w - Z q, 0)`` and ``Z <-`` its
    total, where that total exceeds ``tiny``. Returns the residual weights ``w`` ``[B, V]``
    (``p_row`` where nothing changed them), the kept branch ``[B]`` (-1: none kept) and the rows
    whose candidates read a bad input ``[B]`` (as the kernel's BAD_INDEX, NOT_FINITE, NEGATIVE and
    Q_ZERO)."""
    B, V = p_row.shape
    w, Z = p_row, torch.ones(B, dtype=torch.float64, device=p_row.device)
    kept = torch.full((B,), -1, dtype=torch.int64, device=p_row.device)
    stop = torch.zeros(B, dtype=torch.bool, device=p_row.device)  # [B]: decided at this depth (kept or bad)
    bad = torch.zeros_like(stop)
    if d == q.shape[2]:  # the last depth: no drafts, the bonus from p
        return w, kept, bad
    for j in range(q.shape[1]):
        cand = live[j] & (lengths[:, j] > d) & ~stop  # [B]
        x = drafts[:, j, d]  # [B]
        xc = x.clamp(0, V - 1)[:, None]  # [B, 1] (a bad index is reported, not read)
        q_row = q[:, j, d].double()  # [B, V]
        qx, wx = q_row.gather(-1, xc)[:, 0], w.gather(-1, xc)[:, 0]  # [B]
        good = (x >= 0) & (x < V) & torch.isfinite(qx) & torch.isfinite(wx) & (qx > 0) & (wx >= 0)
        take = cand & good & (u_accept[:, d, j] * qx * Z < wx)  # probability min(1, r(x) / q(x)), r = w / Z
        r = _weight(w - Z[:, None] * q_row)  # [B, V]: max(w - Z q, 0)
        total = r.sum(dim=-1)  # [B]
        reject = cand & good & ~take
        new = reject & torch.isfinite(total) & (total > tiny)  # [B]: the residual changes
        w, Z = torch.where(new[:, None], r, w), torch.where(new, total, Z)
        kept = torch.where(take, j, kept)
        now_bad = (cand & ~good) | (reject & ~torch.isfinite(total))
        bad |= now_bad
        stop |= take | now_bad
    return w, kept, bad


def _multi_next(w: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The next outcome drawn from the weights ``w`` ``[B, V]`` (the last residual, or p's row) and
    whether the kernel's ``draw_row`` can draw from them: no NaN or negative weight, a finite
    positive total."""
    total = w.sum(dim=-1)  # [B]
    usable = (w >= 0).all(dim=-1) & torch.isfinite(total) & (total > 0)
    return draw(torch.where(usable[:, None], w, torch.ones_like(w)), u), usable  # [B], [B]


# --------------------------------------------------------------------------------------------
# NumPy in and out (checked as verify_token & co.): the exactness tests run these on the CPU


def _numpy(fn: Any, *arrays: Any, tiny: float | None = None) -> tuple[np.ndarray, ...]:
    """``fn``'s outputs but the last (``ok``, raised on) as int64 arrays."""
    t = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    out = fn(*t) if tiny is None else fn(*t, tiny)
    *vals, ok = (x.cpu().numpy() for x in out)
    _raise_bad(ok)
    return tuple(v.astype(np.int64) for v in vals)


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


def verify_multi_device(p: Any, q: Any, drafts: Any, lengths: Any = None, u_accept: Any = None,
                        u_next: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`multi_device` with the inputs and outputs of ``speculate.verify.verify_multi``."""
    from .kernels import _check_multi

    p, q, drafts, lengths, u_accept, u_next, tiny = _check_multi(p, q, drafts, lengths, u_accept, u_next)
    return _numpy(multi_device, p, q, drafts, lengths, u_accept, u_next, tiny=tiny)
