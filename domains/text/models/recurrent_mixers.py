"""The recurrent mixers the text domain can roll back: Mamba, Mamba2, short convolutions, gated delta nets.

Each class runs one kind of transformers mixer module on the module's own (live) weights, from the
per-row state of a :class:`~speculate.domains.text.models.recurrent.RowState` instead of transformers'
cache (whose multi-token forwards start from a zero state or from the cached one, never from a
state inside the previous block, and run on whatever kernels are installed). A forward computes the
projections and the causal convolution of a block in parallel, then runs the recurrence token by
token from each row's start state, freezing rows after their valid columns; ``step`` is the same
recurrence for the rollback's replay. The arithmetic follows transformers' own torch paths (dtypes
included), so the logits agree with the model's uncached forward to float rounding
(``kv_cache.check_model`` verifies it for every model before use).

=================  ==========================================================================
implementation     transformers modules
=================  ==========================================================================
:class:`Mamba`     ``MambaMixer``, ``FalconMambaMixer``, ``JambaMambaMixer``
:class:`Mamba2`    ``Mamba2Mixer``, ``BambaMixer``, ``FalconH1Mixer``, ``Zamba2MambaMixer``,
                   ``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``
:class:`ShortConv` ``Lfm2ShortConv`` (LFM2)
:class:`GatedDeltaNet`  ``Qwen3NextGatedDeltaNet`` (Qwen3-Next)
=================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from .recurrent import LOG_LIMIT, Feed, RowState

__all__ = ["MIXERS", "GatedDeltaNet", "Mamba", "Mamba2", "ShortConv", "find_mixers", "unknown_recurrent"]


def _conv(conv: torch.nn.Conv1d, window: torch.Tensor, cols: torch.Tensor, act: str | None) -> torch.Tensor:
    """A depthwise causal convolution of ``cols`` ``[R, W, C]`` continuing ``window`` ``[R, K-1, C]``
    (``Conv1d`` of the module's weights over the window and the block; a sum of K shifted products,
    which for short kernels is faster than ``F.conv1d``)."""
    x = torch.cat([window, cols], dim=1).to(conv.weight.dtype)  # [R, K-1+W, C]
    w = conv.weight[:, 0, :]  # [C, K]
    K, W = w.shape[1], cols.shape[1]
    out = x[:, :W] * w[:, 0]
    for k in range(1, K):
        out = out + x[:, k : k + W] * w[:, k]
    if conv.bias is not None:
        out = out + conv.bias
    if act is not None:
        out = ACT2FN[act](out)
    return out.to(cols.dtype)  # [R, W, C]


def _scan(step, readout, h: torch.Tensor, steps: tuple[torch.Tensor, ...], feed: Feed, st: RowState
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Outputs ``[R, W, ...]`` of the recurrence over the W columns of ``steps`` from ``h``, the
    state after each row's ``feed.valid[r]`` columns (later columns pad a ragged block), and the
    states after every column ``[R, W, ...]`` when ``st`` logs them (small states; else None)."""
    ys, hs = [], []
    keep_all = st.logs_states() and steps[0].shape[1] <= LOG_LIMIT
    cur = None if feed.ends is None else h.clone()
    for t in range(steps[0].shape[1]):
        h = step(h, tuple(s[:, t] for s in steps))
        ys.append(readout(h, t))
        if keep_all:
            hs.append(h)
        rows = None if feed.ends is None else feed.ends.get(t + 1)
        if rows is not None:
            cur.index_copy_(0, rows, h.index_select(0, rows))
    return torch.stack(ys, dim=1), (h if cur is None else cur), (torch.stack(hs, dim=1) if keep_all else None)


class Mamba:
    """Mamba's selective scan (``h = exp(dt A) h + dt B x``, ``y = C h + D x``, gated by ``silu(z)``),
    with the dt / B / C RMS norms of Falcon-Mamba and Jamba when the module has them."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.kernel = int(m.conv1d.kernel_size[0])

    def step(self, h: torch.Tensor, x: tuple) -> torch.Tensor:
        dt, u, B = x  # [R, Di], [R, Di], [R, N]
        A = -torch.exp(self.m.A_log.float())  # [Di, N]
        dA = torch.exp(A[None] * dt[..., None])
        return dA * h + (dt[..., None] * B[:, None, :].float()) * u[..., None].float()

    def forward(self, m: Any, hidden: torch.Tensor, st: RowState, feed: Feed) -> torch.Tensor:
        dtype = hidden.dtype
        R = hidden.shape[0]
        xin, gate = m.in_proj(hidden).chunk(2, dim=-1)  # [R, W, Di] each
        N = m.ssm_state_size
        if not st.ready:
            sd = torch.promote_types(torch.float32, dtype)
            st.init(xin.new_zeros(R, self.kernel - 1, xin.shape[-1]),
                    torch.zeros(R, xin.shape[-1], N, dtype=sd, device=xin.device))
        conv0, h = st.at(feed.offset)
        x = _conv(m.conv1d, conv0, xin, m.activation)  # [R, W, Di]
        ts, B, C = torch.split(m.x_proj(x), [m.time_step_rank, N, N], dim=-1)
        if hasattr(m, "dt_layernorm"):
            ts, B, C = m.dt_layernorm(ts), m.b_layernorm(B), m.c_layernorm(C)
        dt = ts @ m.dt_proj.weight.T  # [R, W, Di]
        if m.dt_proj.bias is not None:
            dt = dt + m.dt_proj.bias.float().to(dt.dtype)
        dt = F.softplus(dt)
        y, h, hs = _scan(self.step, lambda s, t: (s.to(dtype) @ C[:, t, :, None])[..., 0], h, (dt, x, B), feed, st)
        y = (y + x * m.D.float()) * F.silu(gate)
        st.end(feed, xin, (dt, x, B), h, conv0, hs)
        return m.out_proj(y.to(dtype))


class Mamba2:
    """Mamba2's scalar-decay scan per head (``h = exp(dt A) h + dt x B^T``, ``y = h C + D x``),
    gated RMS norm (or ``silu(z)`` gating) and FalconH1's multipliers when the module has them."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.kernel = int(m.conv1d.kernel_size[0])

    def _heads(self, t: torch.Tensor) -> torch.Tensor:  # [R, G*N] -> [R, H, N]
        m = self.m
        t = t.float().view(t.shape[0], m.n_groups, m.ssm_state_size)
        return t.repeat_interleave(m.num_heads // m.n_groups, dim=1)

    def step(self, h: torch.Tensor, x: tuple) -> torch.Tensor:
        dt, u, B = x  # [R, H], [R, Di], [R, G*N]
        m = self.m
        A = -torch.exp(m.A_log.float())  # [H]
        dA = torch.exp(dt.float() * A)[..., None, None]  # [R, H, 1, 1]
        u = u.float().view(u.shape[0], m.num_heads, m.head_dim) * dt.float()[..., None]  # [R, H, P]
        return h * dA + u[..., None] * self._heads(B)[:, :, None, :]

    def forward(self, m: Any, hidden: torch.Tensor, st: RowState, feed: Feed) -> torch.Tensor:
        dtype = hidden.dtype
        R = hidden.shape[0]
        if hasattr(m, "ssm_in_multiplier"):
            hidden = hidden * m.ssm_in_multiplier
        proj = m.in_proj(hidden)
        if hasattr(m, "mup_vector"):
            proj = proj * m.mup_vector
        gate, xin, dt = proj.split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
        if not st.ready:
            st.init(xin.new_zeros(R, self.kernel - 1, xin.shape[-1]),
                    torch.zeros(R, m.num_heads, m.head_dim, m.ssm_state_size, device=xin.device))
        conv0, h = st.at(feed.offset)
        xbc = _conv(m.conv1d, conv0, xin, m.activation)
        GN = m.n_groups * m.ssm_state_size
        x, B, C = torch.split(xbc, [m.intermediate_size, GN, GN], dim=-1)
        dt = F.softplus(dt + m.dt_bias.to(dt.dtype)).clamp(*m.time_step_limit)  # [R, W, H]

        def readout(s: torch.Tensor, t: int) -> torch.Tensor:
            return (s * self._heads(C[:, t])[:, :, None, :]).sum(-1).reshape(R, -1)  # [R, Di]

        y, h, hs = _scan(self.step, readout, h, (dt, x, B), feed, st)
        D = m.D[:, None].expand(-1, m.head_dim).reshape(-1)
        y = y + D * x.float()
        if getattr(m, "mamba_rms_norm", True):
            y = m.norm(y, gate)
        else:
            y = y * F.silu(gate)
        st.end(feed, xin, (dt, x, B), h, conv0, hs)
        return m.out_proj(y.to(dtype))


class ShortConv:
    """LFM2's gated short convolution ``y = C * conv(B * x)``: a convolution window, no recurrent state."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.kernel = int(m.conv.kernel_size[0])

    def step(self, h: Any, x: tuple) -> Any:
        return h

    def forward(self, m: Any, hidden: torch.Tensor, st: RowState, feed: Feed) -> torch.Tensor:
        R = hidden.shape[0]
        B, C, x = m.in_proj(hidden).chunk(3, dim=-1)
        bx = B * x
        if not st.ready:
            st.init(bx.new_zeros(R, self.kernel - 1, bx.shape[-1]), None)
        conv0, _ = st.at(feed.offset)
        y = C * _conv(m.conv, conv0, bx, None)
        st.end(feed, bx, (), None, conv0)
        return m.out_proj(y)


class GatedDeltaNet:
    """Qwen3-Next's gated delta rule (``h = g h + k (beta (v - k^T g h))^T``, ``y = q^T h``) in float32,
    after its causal convolution, with its gated RMS norm."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.kernel = int(m.conv1d.kernel_size[0])

    def step(self, h: torch.Tensor, x: tuple) -> torch.Tensor:
        k, v, g, beta = x  # [R, Hv, dk], [R, Hv, dv], [R, Hv], [R, Hv]
        h = h * g.exp()[..., None, None]
        delta = (v - (h * k[..., None]).sum(dim=-2)) * beta[..., None]
        return h + k[..., None] * delta[..., None, :]

    def forward(self, m: Any, hidden: torch.Tensor, st: RowState, feed: Feed) -> torch.Tensor:
        dtype = hidden.dtype
        R, W = hidden.shape[:2]
        q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(hidden), m.in_proj_ba(hidden))
        xin = torch.cat([t.reshape(R, W, -1) for t in (q, k, v)], dim=-1)  # [R, W, conv_dim]
        Hv, dk, dv = m.num_v_heads, m.head_k_dim, m.head_v_dim
        if not st.ready:
            st.init(xin.new_zeros(R, self.kernel - 1, xin.shape[-1]),
                    torch.zeros(R, Hv, dk, dv, device=xin.device))
        conv0, h = st.at(feed.offset)
        qkv = _conv(m.conv1d, conv0, xin, m.activation)
        q, k, v = torch.split(qkv, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        rep = Hv // m.num_k_heads
        q, k = (t.reshape(R, W, -1, dk).repeat_interleave(rep, dim=2).float() for t in (q, k))
        v = v.reshape(R, W, Hv, dv).float()
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / dk ** 0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = b.sigmoid().float()
        g = (-m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias)).float()
        y, h, hs = _scan(self.step, lambda s, t: (s * q[:, t, :, :, None]).sum(dim=-2), h, (k, v, g, beta), feed, st)
        y = m.norm(y.to(dtype).reshape(-1, dv), z.reshape(-1, dv)).reshape(R, W, -1)
        st.end(feed, xin, (k, v, g, beta), h, conv0, hs)
        return m.out_proj(y)


#: transformers mixer classes (by name) and the implementation that runs them
MIXERS: dict[str, type] = {
    **dict.fromkeys(("MambaMixer", "FalconMambaMixer", "JambaMambaMixer"), Mamba),
    **dict.fromkeys(("Mamba2Mixer", "BambaMixer", "FalconH1Mixer", "Zamba2MambaMixer",
                     "NemotronHMamba2Mixer", "GraniteMoeHybridMambaLayer"), Mamba2),
    "Lfm2ShortConv": ShortConv,
    "Qwen3NextGatedDeltaNet": GatedDeltaNet,
}


def find_mixers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """The recurrent mixers of ``model`` that :data:`MIXERS` runs, with their implementation."""
    return [(mod, MIXERS[type(mod).__name__](mod)) for mod in model.modules()
            if type(mod).__name__ in MIXERS]


def unknown_recurrent(model: torch.nn.Module) -> list[str]:
    """Class names of modules that look recurrent (a depthwise causal convolution, a state-space
    ``A_log``, an RWKV/LRU decay) outside the mixers :data:`MIXERS` runs."""
    known = {id(p) for mod in model.modules() if type(mod).__name__ in MIXERS for p in mod.modules()}
    out = set()
    for name, mod in model.named_modules():
        if id(mod) in known:
            continue
        depthwise = isinstance(mod, torch.nn.Conv1d) and mod.groups > 1 and mod.groups == mod.in_channels
        state = any(n in ("A_log", "time_decay", "recurrent_param", "a_param") for n, _ in
                    mod.named_parameters(recurse=False))
        if depthwise or state:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name and depthwise else mod
            out.add(type(parent).__name__)
    return sorted(out)
