"""Recurrent layers (state-space, gated linear attention, short convolutions) in the position-indexed cache.

A recurrent layer keeps no keys to mask: its state after a token folds in every token before it. For
exact speculative decoding the state must be the one after the last ACCEPTED token, and a round
feeds the target k+1 tokens of which only a prefix is kept (and ragged rows, padded columns). Each
layer's :class:`RowState` therefore holds, per row:

- the committed state at slot ``length[r]``: the last ``K - 1`` inputs of its causal convolution
  and its recurrent state (none for convolution-only layers);
- the round's log: for every slot fed since, the convolution input and the step inputs of the
  recurrence (a few vectors per token, not the state: a Mamba2 state is ``heads x head_dim x
  state_size``, its step inputs ``heads x (head_dim + 1) + groups x state_size``);
- a cursor: the state after the last forward's valid tokens (``valid``, the columns a row
  actually fed; padded columns never advance it), so a draft's next step and a commit that keeps
  every fed token need no work at all.

A forward starts each row from its state at ``start[r] - length[r]`` slots past the committed
one (the cursor, the committed state, or a replay of the log), runs the recurrence over its
columns, logs them and moves the cursor. :meth:`RowState.keep` commits ``n[r]`` slots: the cursor
when every fed token was kept, else the committed state advanced through the first ``n[r]`` logged
step inputs (a replay of at most k+1 cheap element-wise steps, no matmul: the rollback), and the
convolution window read from the log. Forwards wider than :data:`LOG_LIMIT` (prompts) are not
logged: only their cursor can be committed, which is all a prefill needs.

The layers themselves run in ``recurrent_mixers.py``: one implementation per kind of mixer (Mamba,
Mamba2, short convolution, gated delta net), reading the module's own weights;
:class:`RecurrentLayers` finds them in a model and swaps them in for the duration of a forward.

>>> import numpy as np, torch
>>> st = RowState(kernel=2, step=lambda h, x: h + x[0])       # the state: a running sum of the inputs
>>> st.init(torch.zeros(2, 1, 1), torch.zeros(2, 1))           # 2 rows, a window of 1 input, 1 channel
>>> feed = Feed.of(np.array([0, 0]), np.array([3, 2]), 3, torch.device("cpu"))  # row 1 feeds 2 of 3
>>> conv, h = st.at(feed.offset)
>>> xs = torch.tensor([[[1.0], [2.0], [4.0]], [[1.0], [1.0], [9.0]]])  # [R, W, 1]
>>> st.end(feed, xs, (xs,), torch.tensor([[7.0], [2.0]]), conv)       # with the states after them
>>> st.keep(np.array([1, 2]))        # row 0 keeps 1 of its 3 (a replay), row 1 both (its cursor)
>>> st.state.tolist(), st.conv.tolist()
([[1.0], [2.0]], [[[1.0]], [[1.0]]])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["LOG_LIMIT", "STATE_LOG_LIMIT", "Feed", "RecurrentLayers", "RowState", "conv_window", "where_rows"]

#: forwards wider than this many tokens (prompts) are not logged: only their cursor is committed
LOG_LIMIT = 64
#: recurrent states of at most this many elements per row are logged after every slot too, so that a
#: rollback is one gather instead of a replay (larger states: the step inputs are replayed)
STATE_LOG_LIMIT = 1 << 16


def where_rows(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a`` where the per-row ``mask`` ``[R]`` is True, else ``b`` (``[R, ...]`` each)."""
    return torch.where(mask.view(-1, *([1] * (a.ndim - 1))), a, b)


def conv_window(full: torch.Tensor, at: torch.Tensor, width: int) -> torch.Tensor:
    """Rows' slices ``full[r, at[r] : at[r] + width]`` of ``full`` ``[R, T, C]``: ``[R, width, C]``."""
    idx = at[:, None] + torch.arange(width, device=full.device)[None, :]  # [R, width]
    return full[torch.arange(full.shape[0], device=full.device)[:, None], idx]


@dataclass(frozen=True)
class Feed:
    """What one forward feeds a recurrent layer: per-row start offsets and valid columns, as NumPy
    arrays for the bookkeeping and as tensors on the layer's device for the arithmetic."""

    offset: np.ndarray  #: int64 [R] slots past the committed state where each row's block starts
    valid: np.ndarray  #: int64 [R] columns each row really feeds (the rest pad a ragged block)
    valid_t: torch.Tensor  #: ``valid`` on the device
    ends: dict[int, torch.Tensor] | None  #: rows whose valid columns end at each count; None: all W

    @classmethod
    def of(cls, offset: np.ndarray, valid: np.ndarray, width: int, device: torch.device) -> Feed:
        ends = None if bool((valid == width).all()) else {
            int(v): torch.from_numpy(np.flatnonzero(valid == v)).to(device) for v in np.unique(valid)}
        return cls(offset, valid, torch.from_numpy(valid).to(device), ends)


class RowState:
    """One recurrent layer's per-row committed state, round log and cursor (see the module doc).

    ``kernel``: the causal convolution's width K (its window holds K - 1 inputs); ``step(h, x)``:
    the recurrence, ``x`` a tuple of one slot's step inputs ``[R, ...]`` each, returning the new
    state (``h`` is None for convolution-only layers). Offsets and counts are NumPy arrays (no
    device synchronisation); tensors live on the layer's device.
    """

    def __init__(self, kernel: int, step: Callable[[Any, tuple], Any]) -> None:
        self.k1 = int(kernel) - 1
        self.step = step
        self.conv: torch.Tensor | None = None  # [R, K-1, C] committed convolution inputs
        self.state: torch.Tensor | None = None  # [R, ...] committed recurrent state
        self.log_conv: torch.Tensor | None = None  # [R, cap, C] convolution inputs at slots length + j
        self.log_step: tuple[torch.Tensor, ...] = ()  # [R, cap, ...] step inputs at slots length + j
        self.log_state: torch.Tensor | None = None  # [R, cap, ...] states after slot length + j (small states)
        self.logged = np.zeros(0, np.int64)  # [R] slots 0 .. logged - 1 of the log are valid
        self.cur_at = np.zeros(0, np.int64)  # [R] the cursor's slot (relative to length)
        self.cur_conv: torch.Tensor | None = None
        self.cur_state: torch.Tensor | None = None

    @property
    def ready(self) -> bool:
        return self.conv is not None

    def init(self, conv: torch.Tensor, state: torch.Tensor | None) -> None:
        """Start every row from ``conv`` ``[R, K-1, C]`` and ``state`` (zeros: an empty sequence)."""
        self.conv, self.state = conv, state
        self.logged = np.zeros(conv.shape[0], np.int64)
        self.cur_at, self.cur_conv, self.cur_state = self.logged.copy(), conv, state
        self.log_conv, self.log_step, self.log_state = None, (), None

    def logs_states(self) -> bool:
        """Whether forwards should hand :meth:`end` the state after every column (small states)."""
        h = self.state
        return h is not None and h[0].numel() <= STATE_LOG_LIMIT

    def release(self) -> None:
        self.__init__(self.k1 + 1, self.step)

    def select(self, keep: np.ndarray) -> None:
        """Keep only the rows ``keep`` (between rounds; a stale log is dropped, not copied)."""
        if not self.ready:
            return
        idx = torch.from_numpy(np.asarray(keep, np.int64)).to(self.conv.device)
        pick = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        same = self.cur_state is self.state and self.cur_conv is self.conv
        self.conv, self.state = pick(self.conv), pick(self.state)
        self.cur_conv, self.cur_state = (self.conv, self.state) if same else (pick(self.cur_conv),
                                                                               pick(self.cur_state))
        self.logged, self.cur_at = self.logged[keep], self.cur_at[keep]
        if self.logged.any():
            self.log_conv, self.log_step = pick(self.log_conv), tuple(pick(t) for t in self.log_step)
            self.log_state = pick(self.log_state)
        else:
            self.log_conv, self.log_step, self.log_state = None, (), None

    def at(self, o: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The convolution window ``[R, K-1, C]`` and the state ``o[r]`` slots past the committed one."""
        cur = o == self.cur_at
        if cur.all():
            return self.cur_conv, self.cur_state
        zero = o == 0
        if (cur | zero).all() and not cur.any():
            return self.conv, self.state
        dev = self.conv.device
        conv, h = self.conv, self.state
        other = ~(cur | zero)
        if other.any():
            if (o[other] > self.logged[other]).any():
                raise RuntimeError("recurrent state requested past the logged slots of the round")
            n = torch.from_numpy(np.where(other, o, 0)).to(dev)
            mask = torch.from_numpy(other).to(dev)
            full = torch.cat([self.conv, self.log_conv], dim=1)
            conv = where_rows(mask, conv_window(full, n, self.k1), conv)
            if h is not None and self.log_state is not None:  # the state after slot n - 1: a gather
                after = self.log_state[torch.arange(len(o), device=dev), (n - 1).clamp(min=0)]
                h = where_rows(mask, after, h)
            elif h is not None:
                for t in range(int(o[other].max())):  # the replay: the kept slots' step inputs
                    h = where_rows(t < n, self.step(h, tuple(x[:, t] for x in self.log_step)), h)
        if cur.any():
            mask = torch.from_numpy(cur).to(dev)
            conv = where_rows(mask, self.cur_conv, conv)
            if h is not None:
                h = where_rows(mask, self.cur_state, h)
        return conv, h

    def end(self, feed: Feed, cols: torch.Tensor, steps: tuple[torch.Tensor, ...],
            state: torch.Tensor | None, conv: torch.Tensor, states: torch.Tensor | None = None) -> None:
        """Record a forward (``feed``; started from the window ``conv``): its convolution inputs
        ``cols`` ``[R, W, C]``, step inputs ``steps`` (``[R, W, ...]`` each), ``state``, the
        state after each row's valid columns (the new cursor), and (when :meth:`logs_states`)
        ``states`` ``[R, W, ...]``, the state after every column."""
        R, W = cols.shape[:2]
        o = feed.offset
        self.cur_at = o + feed.valid
        self.cur_conv = conv_window(torch.cat([conv, cols], dim=1), feed.valid_t, self.k1)
        self.cur_state = state
        if W > LOG_LIMIT:
            self.logged = np.minimum(self.logged, o)
            return
        need = int(o.max()) + W
        if self.log_conv is None or self.log_conv.shape[1] < need:
            cap = max(need, 2 * (0 if self.log_conv is None else self.log_conv.shape[1]))
            grow = lambda old, new: (new if old is None else  # noqa: E731
                                     torch.cat([old, new[:, old.shape[1]:]], dim=1))
            self.log_conv = grow(self.log_conv, cols.new_empty(R, cap, *cols.shape[2:]))
            self.log_step = tuple(grow(old, s.new_empty(R, cap, *s.shape[2:])) for old, s in
                                  zip(self.log_step or (None,) * len(steps), steps, strict=True))
            if states is not None:
                self.log_state = grow(self.log_state, states.new_empty(R, cap, *states.shape[2:]))
        if (o == o[0]).all():
            sl = slice(int(o[0]), int(o[0]) + W)
            self.log_conv[:, sl] = cols
            for log, s in zip(self.log_step, steps, strict=True):
                log[:, sl] = s
            if states is not None:
                self.log_state[:, sl] = states
        else:
            rows = torch.arange(R, device=cols.device)[:, None]
            slots = torch.from_numpy(o).to(cols.device)[:, None] + torch.arange(W, device=cols.device)[None, :]
            self.log_conv[rows, slots] = cols
            for log, s in zip(self.log_step, steps, strict=True):
                log[rows, slots] = s
            if states is not None:
                self.log_state[rows, slots] = states
        self.logged = np.where(o <= self.logged, o + feed.valid, self.logged)

    def keep(self, n: np.ndarray) -> None:
        """Commit ``n[r]`` slots: the state after them becomes row ``r``'s committed state."""
        if not self.ready:
            return
        self.conv, self.state = self.at(np.asarray(n, np.int64))
        self.logged = np.zeros_like(self.logged)
        self.cur_at, self.cur_conv, self.cur_state = self.logged.copy(), self.conv, self.state


class RecurrentLayers:
    """The recurrent mixers of one model with their :class:`RowState`, swapped in while it runs.

    ``mixers``: ``(module, implementation)`` pairs (``recurrent_mixers.find_mixers``). While
    :meth:`installed` is active each module's ``forward`` is the implementation's, fed a
    :class:`Feed` (start slots and valid columns) on the module's device.
    """

    def __init__(self, mixers: list[tuple[torch.nn.Module, Any]]) -> None:
        self.mixers = mixers
        self.states = [RowState(impl.kernel, impl.step) for _, impl in mixers]

    def __bool__(self) -> bool:
        return bool(self.mixers)

    def reset(self) -> None:
        for s in self.states:
            s.release()

    release = reset

    def select(self, keep: np.ndarray) -> None:
        for s in self.states:
            s.select(keep)

    def keep(self, n: np.ndarray) -> None:
        for s in self.states:
            s.keep(n)

    @contextlib.contextmanager
    def installed(self, offset: np.ndarray, valid: np.ndarray, width: int) -> Iterator[None]:
        """Run the mixers' implementations instead of their modules' forwards, for a block of
        ``width`` columns starting ``offset`` (``start - length``) slots past each row's committed
        state, of which row ``r`` feeds the first ``valid[r]``."""
        saved = []
        feeds: dict[torch.device, Feed] = {}
        try:
            for (module, impl), st in zip(self.mixers, self.states, strict=True):
                dev = _device(module)
                if dev not in feeds:
                    feeds[dev] = Feed.of(offset, valid, width, dev)

                def fwd(hidden_states: torch.Tensor, *args: Any, _m=module, _i=impl, _s=st, _f=feeds[dev],
                        **kwargs: Any) -> torch.Tensor:
                    return _i.forward(_m, hidden_states, _s, _f)

                saved.append((module, module.__dict__.get("forward")))
                module.forward = fwd
            yield
        finally:
            for module, old in saved:
                if old is None:
                    del module.forward
                else:
                    module.forward = old


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device
