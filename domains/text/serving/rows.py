"""What lets requests with their own settings and seeds share one batch: per-row sampling settings
(:class:`RowSettings`, a :class:`~speculate.domains.text.request.processors.Transforms` whose
temperature, top-k, top-p, min-p and penalties are arrays over the buffer rows) and per-row random
streams (:class:`RowStreams`: every draw of a round comes from each row's own generator).

The target's law for a row is its settings' law: presence and frequency penalties (OpenAI's, over the
tokens the row has generated so far, drafts before the position included), then temperature, top-k,
top-p and min-p (transformers' warpers, in that order); temperature 0 is the argmax. The draft's laws
go through the SAME transform with each position's prefix, so verification keeps the target's law.

>>> import numpy as np, torch
>>> from speculate.domains.text.request.tokens import TokenBuffer
>>> rs = RowSettings()
>>> rs.add(np.array([0, 1]), temperature=[0.0, 1.0], top_k=[None, 2], top_p=[None, None], min_p=[None, None],
...        presence=[0.0, 0.0], frequency=[0.0, 0.0])
>>> buf = TokenBuffer.from_prompts([[1], [1]], extra=2)
>>> logits = torch.tensor([[[0.0, 3.0, 2.0, 1.0]], [[0.0, 3.0, 2.0, 1.0]]])        # [R=2, J=1, V=4]
>>> p = rs.probs(logits, buf, np.array([0, 1]), None)
>>> p[0, 0].tolist(), [round(v, 3) for v in p[1, 0].tolist()]       # greedy; top-2 of row 1
([0.0, 1.0, 0.0, 0.0], [0.0, 0.731, 0.269, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..request.processors import Transforms
from ..request.sampling import SamplingConfig, probabilities

__all__ = ["RowSettings", "RowStreams"]


class RowSettings(Transforms):
    """Sampling settings per buffer row (arrays indexed by the row), applied row by row in one batch."""

    _FIELDS = ("temperature", "top_k", "top_p", "min_p", "presence", "frequency")

    def __init__(self) -> None:
        super().__init__(SamplingConfig())
        self.temperature = np.zeros(0, np.float64)
        self.top_k = np.zeros(0, np.int64)  # 0: none
        self.top_p = np.zeros(0, np.float64)  # 1: none
        self.min_p = np.zeros(0, np.float64)  # 0: none
        self.presence = np.zeros(0, np.float64)
        self.frequency = np.zeros(0, np.float64)
        self.cons: Any = None  # request.constraints.Constraints over every buffer row (None: no row has one)

    @property
    def greedy(self) -> bool:
        return False  # rows of temperature 0 draft and verify one-hot laws (their argmax): exact too

    @property
    def active(self) -> bool:
        return True  # every call needs the rows (their settings)

    def add(self, rows: np.ndarray, *, temperature: Sequence[float], top_k: Sequence[int | None],
            top_p: Sequence[float | None], min_p: Sequence[float | None], presence: Sequence[float],
            frequency: Sequence[float]) -> None:
        """Settings of the new buffer rows ``rows`` (beyond every row set so far)."""
        rows = np.asarray(rows, np.int64)
        n = int(rows.max()) + 1 if len(rows) else 0
        vals = {"temperature": temperature, "top_k": [0 if v is None else v for v in top_k],
                "top_p": [1.0 if v is None else v for v in top_p], "min_p": [0.0 if v is None else v for v in min_p],
                "presence": presence, "frequency": frequency}
        for name in self._FIELDS:
            a = getattr(self, name)
            if len(a) < n:
                grown = np.zeros(n, a.dtype)
                grown[: len(a)] = a
                a = grown
            a[rows] = np.asarray(vals[name], a.dtype)
            setattr(self, name, a)

    def constrain(self, rows: np.ndarray, constraints: Sequence[Any], vocab: int) -> None:
        """Row constraints (``RowConstraint`` or None) of the new buffer rows ``rows`` (the newest rows)."""
        from ..request.constraints import Constraints

        if self.cons is None:
            if all(c is None for c in constraints):
                return
            self.cons = Constraints([], vocab)
        n = int(np.max(rows)) + 1 if len(rows) else 0
        self.cons.extend([None] * (n - len(self.cons.rows)))
        for r, c in zip(np.asarray(rows).tolist(), constraints, strict=True):
            self.cons.rows[r] = c

    def taken(self, rows: np.ndarray) -> None:
        """Keep only the rows ``rows``, renumbered ``0 .. len(rows) - 1`` (as ``TextProcess.compact``)."""
        for name in self._FIELDS:
            setattr(self, name, getattr(self, name)[rows])
        if self.cons is not None:
            rows = np.asarray(rows, np.int64)
            if len(rows) and rows.max() >= len(self.cons.rows):
                self.cons.extend([None] * (int(rows.max()) + 1 - len(self.cons.rows)))
            self.cons.taken(rows)

    def scores(self, logits: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None,
               first: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``logits`` ``[R, J, V]`` after each row's presence and frequency penalties: position ``j`` of row
        ``i`` counts the tokens row ``rows[i]`` generated (after its prompt), then ``drafts[i, :first + j]``;
        then each constrained row's mask (its constraint's state after the position's prefix)."""
        rows = np.asarray(rows, np.int64)
        x = self._penalised(logits.to(dtype), tokens, rows, drafts, first, dtype)
        cons = self.cons
        if cons is not None and any(r < len(cons.rows) and cons.rows[r] is not None for r in rows.tolist()):
            # each position masked by its row's constraint state after THAT position's prefix (proofs/12)
            ok = cons.chain_masks(tokens, rows, drafts, first, x.shape[1])  # [R, J, V']
            V = x.shape[-1]
            ok = ok[..., :V] if ok.shape[-1] >= V else np.pad(ok, ((0, 0), (0, 0), (0, V - ok.shape[-1])))
            x = x.masked_fill(~torch.from_numpy(ok).to(x.device), float("-inf"))
        return x

    def _penalised(self, x: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None, first: int,
                   dtype: torch.dtype) -> torch.Tensor:
        pres, freq = self.presence[rows], self.frequency[rows]
        if not (pres.any() or freq.any()):
            return x
        R, J, V = x.shape
        counts = np.zeros((R, J, V), np.float32)
        for i, r in enumerate(rows.tolist()):
            if pres[i] == 0 and freq[i] == 0:
                continue
            gen = tokens.ids[r, tokens.prompt_len[r] : tokens.n[r]]
            base = np.bincount(gen[gen < V], minlength=V)[:V].astype(np.float32)  # [V]
            counts[i] = base
            if drafts is not None:
                for j in range(J):
                    d = np.asarray(drafts[i, : first + j], np.int64)
                    if len(d):
                        np.add.at(counts[i, j], d[d < V], 1.0)
        c = torch.from_numpy(counts).to(x.device)
        f = torch.as_tensor(freq, dtype=dtype, device=x.device)[:, None, None]
        p = torch.as_tensor(pres, dtype=dtype, device=x.device)[:, None, None]
        return x - f * c - p * (c > 0).to(dtype)

    def probs(self, logits: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None,
              first: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Probabilities ``[R, J, V]`` of the next token at each position under each row's settings."""
        rows = np.asarray(rows, np.int64)
        x = self.scores(logits, tokens, rows, drafts, first, dtype)  # [R, J, V]
        if self.cons is not None and not bool(torch.isfinite(x.amax(dim=-1)).all()):
            raise ValueError("a row's constraint (response_format) removed every token at some position")
        # each group of rows with the same warpers through request/sampling.py's one implementation
        keys = np.stack([self.temperature[rows], self.top_k[rows], self.top_p[rows], self.min_p[rows]], axis=1)
        groups, which = np.unique(keys, axis=0, return_inverse=True)
        if len(groups) == 1:
            return probabilities(x, self._config(groups[0]), dtype)
        p = torch.empty_like(x)
        for g, key in enumerate(groups):
            idx = torch.as_tensor(np.flatnonzero(which.reshape(-1) == g), device=x.device)
            p[idx] = probabilities(x[idx], self._config(key), dtype)
        return p

    @staticmethod
    def _config(key: np.ndarray) -> SamplingConfig:
        t, k, top_p, min_p = (float(v) for v in key)
        return SamplingConfig(temperature=t, top_k=int(k) if k > 0 else None, top_p=top_p if top_p < 1 else None,
                              min_p=min_p if min_p > 0 else None)


class RowStreams:
    """A ``numpy.random.Generator`` stand-in whose draws come from each row's own generator: a draw of
    ``size[0] = m * R`` values for the ``R`` rows of the round (:attr:`rows`) gives row ``i`` the
    ``i``-th run of ``m`` (row-major), drawn from ``streams[rows[i]]``. Every draw of the text path is
    row-major in this sense (a refused shape raises instead of mixing rows). A row's tokens then
    depend on its own seed only, whatever rows run beside it (with the same work per row and round:
    the serving loop's fixed lookahead)."""

    def __init__(self) -> None:
        self.streams: dict[int, np.random.Generator] = {}
        self.rows: list[int] = []

    def random(self, size: Any = None) -> np.ndarray:
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size or ())
        R = len(self.rows)
        if not shape or R == 0 or shape[0] % R:
            raise ValueError(f"RowStreams draws row-major blocks for the round's {R} rows, got size {size!r}")
        m = shape[0] // R
        if m == 1:
            out = np.stack([self.streams[r].random(shape[1:]) for r in self.rows]) if R else np.zeros(shape)
        else:
            out = np.concatenate([self.streams[r].random((m, *shape[1:])) for r in self.rows])
        return out.reshape(shape)

    def states(self) -> dict[int, Any]:
        """Each row's generator state (to rewind a round that raised)."""
        return {r: self.streams[r].bit_generator.state for r in self.rows}

    def rewind(self, states: dict[int, Any]) -> None:
        for r, s in states.items():
            if r in self.streams:
                self.streams[r].bit_generator.state = s

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"RowStreams draws uniforms only (random()); the text path asked for {name!r}")
