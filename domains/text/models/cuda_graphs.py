"""Static decode steps, captured as CUDA graphs: a small model's step without launch gaps.

A decoding step of a small model on a GPU is a few hundred kernel launches of microseconds each;
the host issuing them, not the GPU, sets the pace. A CUDA graph records the launches once and
replays them with one call. It needs every shape and address fixed, which the position-indexed
cache (``lean_llama.py``) allows: buffers of ``rows x capacity`` slots allocated once, a step that
attends over all ``capacity`` slots through a mask (slot <= position) instead of slicing, and
writes each row's new keys and values at its positions (rolling back is still just not moving
``length``).

:class:`StepGraphs` keeps one graph per (batch bucket, width): the live rows are padded to the
next power of two (at most the rows allocated; the padded rows are dead rows of the buffers,
whose slots nothing reads), so a batch whose rows finish one by one replays a handful of graphs.
The static inputs are copied in, the graph replays, the logits of the live rows come out. A graph
is recaptured when the buffers move (a new capacity or batch); before capturing, the step runs
once for real on the same inputs (the warm-up CUDA graphs need), so capture never clobbers the
cache. On a CPU the same padded static step runs eagerly: the tests check it there
(tests/text/test_text_cuda_graphs.py), and the capture itself on a GPU (``-m gpu``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StepGraphs", "bucket"]

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bucket(rows: int, allocated: int) -> int:
    """The padded batch a step of ``rows`` live rows runs at: the next power of two, at most
    ``allocated`` (the rows the buffers hold).

    >>> [bucket(r, 12) for r in (1, 2, 3, 5, 9, 12)]
    [1, 2, 4, 8, 12, 12]
    """
    if not 1 <= rows <= allocated:
        raise ValueError(f"need 1 <= rows <= allocated, got rows={rows}, allocated={allocated}")
    return min(1 << (rows - 1).bit_length(), allocated)


class StepGraphs:
    """Replays of a static step ``step(tokens [b, W], pos [b, W]) -> logits [b, W, V]`` by bucket.

    ``capture``: record CUDA graphs (the default on a CUDA device); False runs the padded step
    eagerly (CPU, or to compare). ``key``: the buffers' identity (an allocation counter: a data
    pointer could come back for new buffers); graphs recorded under another key are dropped.
    """

    def __init__(self, step: Step, device: torch.device, capture: bool | None = None) -> None:
        self.step = step
        self.device = torch.device(device)
        self.capture = self.device.type == "cuda" if capture is None else bool(capture)
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.key: Any = None
        self.pool: Any = None
        self.captures = 0  # graphs recorded so far (a diagnostic: a steady loop stops recording)

    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor, allocated: int, key: Any) -> torch.Tensor:
        """Logits ``[R, W, V]`` of ``tokens`` ``[R, W]`` at positions ``pos`` ``[R, W]``, for the first
        ``R`` of ``allocated`` buffer rows."""
        R, W = tokens.shape
        b = bucket(R, allocated)
        if key != self.key:
            self.graphs.clear()
            self.key = key
        if b > R:  # dead rows: token 0 at positions 0 .. W-1 (their slots are never read)
            pad = b - R
            tokens = torch.cat([tokens, tokens.new_zeros(pad, W)])
            pos = torch.cat([pos, torch.arange(W, device=pos.device).expand(pad, W)])
        if not self.capture:
            return self.step(tokens, pos)[:R]
        entry = self.graphs.get((b, W))
        if entry is None:
            entry = self._record(tokens, pos)
            self.graphs[(b, W)] = entry
        else:
            entry[1].copy_(tokens)
            entry[2].copy_(pos)
            entry[0].replay()
        return entry[3][:R].clone()  # the next replay overwrites the recorded output; callers keep theirs

    def _record(self, tokens: torch.Tensor, pos: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Warm up on a side stream with the real inputs (the step runs once, writing the same keys
        and values the replay will), then record; the recorded graph's output is the step's."""
        static_t, static_p = tokens.clone(), pos.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.step(static_t, static_p)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(static_t, static_p)
        graph.replay()  # recording runs nothing: this computes ``out`` (and rewrites the same slots)
        self.captures += 1
        return graph, static_t, static_p, out
