"""Categorical laws as tensors on a device, and what moves and draws them there (torch).

- :class:`DeviceCategorical`: Categorical distributions whose probabilities are a tensor on some
  device (an accelerator): what a process hands the round loop (target scores, draft laws) so that
  verification runs where they are (``speculate.verify.device``), with no copy to the host;
- :func:`upload`: a host array or tensor on a device, the copy issued ``non_blocking``;
- :func:`draw`: one outcome per row of weights by inverse CDF at given uniforms, on the weights'
  device (the tensor twin of the inverse-CDF draw of ``_inverse_cdf.py``).

None of these is a verification rule: the tensor rules are ``speculate.verify.device`` (which
re-exports the three names, the path the text domain and the docs use).

>>> import torch
>>> d = DeviceCategorical(torch.tensor([[0.2, 0.8], [1.0, 0.0]]))
>>> d.batch_shape, d.num_outcomes
((2,), 2)
>>> draw(d.probs.double(), torch.tensor([0.1, 0.99], dtype=torch.float64)).tolist()
[0, 0]
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DeviceCategorical", "draw", "upload"]

Tensor = torch.Tensor


class DeviceCategorical:
    """Categorical distributions whose probabilities ``probs`` ``[*batch, V]`` are a tensor on some
    device: what a process hands the round loop (target scores, draft laws) so that verification
    runs where they are (``speculate.verify.device.verify_device_round``), with no copy to the host."""

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


def upload(x: Any, device: Any) -> Tensor:
    """``x`` (a host array or tensor) on ``device``, the copy issued with ``non_blocking=True`` (from
    pageable memory CUDA stages the bytes before returning, so ``x`` may change afterwards) where a
    plain ``.to(device)`` is a synchronous copy; how much host waiting this spares is what
    ``benchmarks/gpu/host_syncs.py`` measures on a GPU (not yet run). On the CPU: ``x`` as a tensor."""
    return torch.as_tensor(x).to(device, non_blocking=True)


def draw(w: Tensor, u: Tensor) -> Tensor:
    """One outcome per row of the weights ``w`` ``[B, V]`` (>= 0, float64) by inverse CDF at the
    uniforms ``u`` ``[B]``: the first ``j`` whose running sum exceeds ``u * total`` (never an outcome
    of zero weight; ``u * total`` rounded up to the total gives the last outcome with weight)."""
    c = torch.cumsum(w, dim=-1)  # [B, V]
    j = torch.searchsorted(c, (u * c[:, -1])[:, None], right=True)[:, 0]  # [B]
    last = w.shape[-1] - 1 - torch.argmax(torch.flip(w > 0, [-1]).to(torch.uint8), dim=-1)  # [B]
    return torch.minimum(j, last)
