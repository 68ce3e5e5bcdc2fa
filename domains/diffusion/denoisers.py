"""Calling a denoiser: the signature every denoiser follows, guidance, and the checks of its output.

A denoiser is any torch callable ``denoiser(x[N, *shape], t[N])`` (class-conditional:
``denoiser(x, t, labels[N])``) returning ``[N, *shape]``: a torch ``nn.Module`` or a function (it gets
its own copy of x: writing into it cannot change the chain), with
``t`` the int64 model times (1..T, one per sample: the k+1 states of a round sit at different
times) and ``labels`` int64. It receives float tensors of the module's own dtype and device (the
first parameter or buffer; float32 on the CPU for a plain function, or what ``dtype=`` /
``device=`` say) and runs under ``torch.inference_mode``.

:class:`Denoiser` calls it ONCE per batch, with classifier-free guidance when asked (the
conditional and the unconditional halves in one call of twice the batch; the guided output is
``out_u + w (out_c - out_u)``, diffusers' convention: w = 1 is the conditional model), converts the
output to float64 and checks its type and shape; finiteness is returned per sample, not raised,
because a non-finite output at a drafted state the chain never reaches must not stop a run.

>>> import numpy as np, torch
>>> d = Denoiser(lambda x, t: 0.5 * x, who="target denoiser")
>>> out, finite = d(np.ones((2, 1, 3)), np.array([5, 4]))
>>> out[0, 0].tolist(), finite.tolist(), d.evaluations
([0.5, 0.5, 0.5], [True, True], 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Denoiser", "to_numpy"]


def to_numpy(value: Any, who: str) -> np.ndarray:
    """A denoiser's output (torch tensor or array of real numbers) as float64; TypeError otherwise."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        t = value.detach().cpu()
        if t.is_complex() or str(t.dtype) == "torch.bool":
            raise TypeError(f"{who} must return real numbers, got a torch tensor of {t.dtype}")
        value = t.double().numpy()
    try:
        a = np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{who} did not return an array of real numbers: {err}") from None
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{who} must return real numbers (a float tensor), got {type(value).__name__} of {a.dtype}")
    return a.astype(np.float64, copy=False)


def _placement(fn: Any, dtype: Any, device: Any) -> tuple[Any, Any]:
    import torch

    if dtype is not None and not isinstance(dtype, torch.dtype):
        try:
            dtype = torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype
        except (TypeError, ValueError):
            raise TypeError(f"dtype must be a torch or numpy float dtype, got {dtype!r}") from None
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    if dtype is None or device is None:
        first = None
        if isinstance(fn, torch.nn.Module):
            first = next(iter(fn.parameters()), None)
            if first is None:
                first = next(iter(fn.buffers()), None)
        if dtype is None:
            dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
        if device is None:
            device = first.device if first is not None else torch.device("cpu")
    return dtype, torch.device(device)


class Denoiser:
    """A user's denoiser, called once per batch with guidance and checks (see the module docstring).

    ``guidance``: None (no guidance) or the scale w; it needs ``labels`` in every call and the
    ``null_label`` that stands for "no class". ``evaluations`` counts network evaluations (a guided
    sample costs two).
    """

    def __init__(self, fn: Any, *, who: str, guidance: float | None = None, null_label: int | None = None,
                 dtype: Any = None, device: Any = None) -> None:
        if not callable(fn):
            raise TypeError(f"{who} must be callable (a torch module or function), got {type(fn).__name__}")
        self.fn, self.who = fn, who
        self.guidance, self.null_label = guidance, null_label
        self.dtype, self.device = _placement(fn, dtype, device)
        self.evaluations = 0
        self.calls = 0

    def __call__(self, x: np.ndarray, t: np.ndarray, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Outputs [N, *shape] float64 at the states ``x`` [N, *shape] and times ``t`` [N] (labels [N]
        or None), and which are finite (bool [N])."""
        import torch

        N = x.shape[0]
        xt = torch.tensor(x, dtype=self.dtype, device=self.device)  # the denoiser's own copy
        tt = torch.as_tensor(t, dtype=torch.int64, device=self.device)
        guided = self.guidance is not None
        if guided:
            xt, tt = torch.cat([xt, xt]), torch.cat([tt, tt])
            labels = np.concatenate([labels, np.full(N, self.null_label, np.int64)])
        args = (xt, tt) if labels is None else (xt, tt, torch.as_tensor(labels, dtype=torch.int64, device=self.device))
        self.calls += 1
        self.evaluations += 2 * N if guided else N
        with torch.inference_mode():
            raw = self.fn(*args)
        out = to_numpy(raw, self.who)
        want = tuple(xt.shape)
        if out.shape != want:
            raise ValueError(f"{self.who} returned shape {tuple(out.shape)} for inputs of shape {want} "
                             "(expected the shape of x)")
        if guided:
            with np.errstate(over="ignore", invalid="ignore"):
                out = out[N:] + self.guidance * (out[:N] - out[N:])
        finite = np.isfinite(out).reshape(N, -1).all(axis=1)
        return out, finite
