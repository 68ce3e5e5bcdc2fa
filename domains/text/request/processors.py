"""Generation settings as one transform of the next-token logits, applied with each position's prefix.

:class:`Transforms` turns the logits of a row at a position into the probabilities the generator
samples from (or, greedy, the argmax): first the prefix-dependent processors in transformers'
order (repetition penalty, no-repeat n-grams, bad words, then ``min_new_tokens`` (EOS ids barred
until a row has that many new tokens), then the user's ``logits_processor`` list), then the
prefix-free warpers of :class:`~speculate.domains.text.request.sampling.SamplingConfig` (temperature,
top-k, top-p, min-p, typical-p). The SAME transform is applied to the target's logits at every
verified position and to the draft's at every drafted position, each with its own prefix (the
row's committed tokens, then the drafts before that position), so the verified tokens follow the
target's law under those settings; the draft law handed to verification is the one each draft token
was sampled from, after every transform (the bug of transformers #47932 cannot happen here).

Processors follow transformers' protocol, ``processor(input_ids [N, L], scores [N, V]) -> scores``,
and are called with unpadded prefixes: all items of one call share a prefix length (items are
grouped by it), so no padding token ever enters a prefix.

**The contract.** A processor's output must be a function of the prefix and the scores alone.
Checked twice: classes known to break it are refused (:data:`REFUSED`: they read the row's index
in the batch, a padded prompt length, keep state between calls, or run a model), and the first
call of every processor is made twice on copies of the same input: different results raise
``ValueError``.

>>> import torch
>>> from speculate.domains.text.process import TokenBuffer
>>> from transformers import RepetitionPenaltyLogitsProcessor
>>> tr = Transforms(SamplingConfig(temperature=0), [RepetitionPenaltyLogitsProcessor(10.0)])
>>> buf = TokenBuffer.from_prompts([[1, 2]], extra=2)
>>> logits = torch.tensor([[[0.0, 3.0, 2.0, 1.0], [0.0, 3.0, 2.0, 1.0]]])     # [R=1, J=2, V=4]
>>> # position 0 sees the prefix [1, 2] (ids 1, 2 penalised); position 1 sees [1, 2, 3] (the draft 3 too)
>>> tr.probs(logits, buf, np.array([0]), np.array([[3]])).argmax(-1).tolist()
[[3, 1]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .sampling import SamplingConfig, probabilities

__all__ = ["REFUSED", "Transforms", "as_transforms"]

#: processor classes whose output depends on more than the prefix and the scores, and why
REFUSED = {
    "PrefixConstrainedLogitsProcessor": "it reads the row's index in the batch (batch_id)",
    "SuppressTokensAtBeginLogitsProcessor": "it reads the padded prompt length of a batch",
    "WhisperTimeStampLogitsProcessor": "it reads the padded prompt length of a batch",
    "MinNewTokensLengthLogitsProcessor": "it reads the padded prompt length; pass min_new_tokens=",
    "MinLengthLogitsProcessor": "it reads the padded length; pass min_new_tokens=",
    "ClassifierFreeGuidanceLogitsProcessor": "it reads a doubled batch (guidance rows)",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "it runs a model and keeps a cache between calls",
    "WatermarkLogitsProcessor": "watermarking is keyed to the order of plain generate's calls",
    "SynthIDTextWatermarkLogitsProcessor": "it keeps state between calls (watermarking)",
    "AlternatingCodebooksLogitsProcessor": "it reads the padded length of a batch",
    "BarkEosPrioritizerLogitsProcessor": "it reads the padded length of a batch",
}


def _name(p: Any) -> str:
    return getattr(p, "__name__", type(p).__name__)


def check_processor(p: Any) -> None:
    """Refuse a processor that is not callable or whose class is in :data:`REFUSED`."""
    cls = type(p).__name__
    if cls in REFUSED:
        raise ValueError(f"logits processor {cls} cannot be used with speculative decoding: {REFUSED[cls]}; "
                         "a processor's output must depend only on the prefix (input_ids) and the scores")
    if not callable(p):
        raise TypeError(f"logits_processor entries must be callables (input_ids, scores) -> scores, got {cls}")


class Transforms:
    """The generation settings of one request: prefix processors, ``min_new_tokens`` and warpers.

    ``before``: transformers' built-in processors (repetition penalty, no-repeat n-grams, bad
    words); ``user``: the user's processors, applied after ``min_new_tokens``; ``eos``: the ids
    barred while a row has fewer than ``min_new_tokens`` new tokens.
    """

    def __init__(self, cfg: SamplingConfig, before: Sequence[Any] = (), user: Sequence[Any] = (),
                 min_new_tokens: int = 0, eos: Sequence[int] | np.ndarray = (), constraints: Any = None) -> None:
        for p in (*before, *user):
            check_processor(p)
        self.cfg = cfg
        self.before, self.user = list(before), list(user)
        self.min_new = int(min_new_tokens or 0)
        self.eos = np.asarray(eos, dtype=np.int64).reshape(-1)
        self.checked: set[int] = set()
        self.constraints = constraints  # request/constraints.Constraints: masks by each position's prefix state

    @property
    def greedy(self) -> bool:
        return self.cfg.greedy

    @property
    def active(self) -> bool:
        """True when some transform reads the prefix (else only the warpers act)."""
        return bool(self.before or self.user or (self.min_new > 0 and len(self.eos)) or self.constraints is not None)

    def _call(self, p: Callable, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = p(ids.clone(), scores.clone())
        if not isinstance(out, torch.Tensor) or out.shape != scores.shape:
            raise ValueError(f"logits processor {_name(p)} must return scores of shape {tuple(scores.shape)}, "
                             f"got {getattr(out, 'shape', type(out).__name__)}")
        if id(p) not in self.checked:  # the contract: the same input gives the same output
            again = p(ids.clone(), scores.clone())
            if not torch.allclose(out, again, rtol=0, atol=0, equal_nan=True):
                raise ValueError(
                    f"logits processor {_name(p)} gave two different outputs for the same input_ids and "
                    "scores: speculative decoding applies it to the target and the draft at every position, "
                    "so its output must depend only on the prefix and the scores (no state, no randomness)")
            self.checked.add(id(p))
        return out.to(scores.dtype)

    def _bar_eos(self, x: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``x`` [..., V] with the EOS ids at -inf where ``new`` (the new-token count, [...]) < min_new."""
        if self.min_new <= 0 or not len(self.eos):
            return x
        bar = (new < self.min_new)[..., None]  # [..., 1]
        cols = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
        cols[torch.as_tensor(self.eos[self.eos < x.shape[-1]], device=x.device)] = True
        return x.masked_fill(bar & cols, float("-inf"))

    def scores(self, logits: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None,
               first: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The processed logits ``[R, J, V]`` (before the warpers) of ``logits`` ``[R, J, V]``.

        Position ``j`` of row ``i`` (buffer row ``rows[i]``) has the prefix: the row's committed
        tokens (``tokens``, a ``TokenBuffer``), then ``drafts[i, :first + j]``.
        """
        x = logits.to(dtype)
        if not self.active:
            return x
        J = x.shape[1]
        n = tokens.n[rows]  # [R]
        lens = n[:, None] + first + np.arange(J)[None, :]  # [R, J] prefix lengths
        new = lens - tokens.prompt_len[rows][:, None]  # [R, J] new tokens in each prefix
        if not (self.before or self.user):  # no prefix processors: min_new_tokens alone reads the prefix
            x = self._bar_eos(x, torch.as_tensor(new, device=x.device))
        else:
            x = self._processed(x, tokens, rows, drafts, first, n, lens, new)
        if self.constraints is not None:  # each position masked by the state after ITS prefix
            ok = self.constraints.chain_masks(tokens, rows, drafts, first, J)  # [R, J, V']
            V = x.shape[-1]
            ok = ok[..., :V] if ok.shape[-1] >= V else np.pad(ok, ((0, 0), (0, 0), (0, V - ok.shape[-1])))
            x = x.masked_fill(~torch.from_numpy(ok).to(x.device), float("-inf"))
        return x

    def _processed(self, x: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None, first: int,
                   n: np.ndarray, lens: np.ndarray, new: np.ndarray) -> torch.Tensor:
        """``x`` ``[R, J, V]`` through the prefix processors and ``min_new_tokens``, each position with its
        own unpadded prefix (see :meth:`scores`)."""
        R, J, _ = x.shape
        D = first + J - 1  # drafts any prefix reads
        ext = np.zeros((R, int(n.max()) + max(D, 0)), np.int64)
        ext[:, : tokens.ids.shape[1]] = tokens.ids[rows][:, : ext.shape[1]]
        if D > 0:
            cols = n[:, None] + np.arange(D)[None, :]  # [R, D]
            ext[np.arange(R)[:, None], cols] = np.asarray(drafts)[:, :D]
        ext_t = torch.from_numpy(ext).to(x.device)
        x = x.clone()
        for L in np.unique(lens).tolist():  # one call per prefix length: no padding in any prefix
            ri, ji = np.nonzero(lens == L)
            ri_t, ji_t = torch.as_tensor(ri, device=x.device), torch.as_tensor(ji, device=x.device)
            ids = ext_t[ri_t, :L]  # [m, L]
            s = x[ri_t, ji_t]  # [m, V]
            for p in self.before:
                s = self._call(p, ids, s)
            s = self._bar_eos(s, torch.as_tensor(new[ri, ji], device=x.device))
            for p in self.user:
                s = self._call(p, ids, s)
            x[ri_t, ji_t] = s
        return x

    def probs(self, logits: torch.Tensor, tokens: Any, rows: np.ndarray, drafts: np.ndarray | None,
              first: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Probabilities ``[R, J, V]`` of the next token at each position (see :meth:`scores`);
        greedy: one-hot on the first argmax of the processed logits."""
        x = self.scores(logits, tokens, rows, drafts, first, dtype)
        if self.active and not bool(torch.isfinite(x.amax(dim=-1)).all()):
            raise ValueError("the logits processors or the constraint removed every token at some position (all "
                             "scores -inf or NaN): check bad_words_ids, min_new_tokens, the logits_processor list and "
                             "the json_schema / regex / grammar (a constraint the tokenizer cannot spell)")
        return probabilities(x, self.cfg, dtype)


def as_transforms(cfg: SamplingConfig | Transforms) -> Transforms:
    """``cfg`` as a :class:`Transforms` (a bare ``SamplingConfig`` has no prefix processors)."""
    return cfg if isinstance(cfg, Transforms) else Transforms(cfg)
