"""The exact law of short continuations, which every speculative run of the text domain must follow.

:func:`continuation_law` computes, with full (uncached) forward passes of a float64 copy of the
target, the exact probability of every continuation of a prompt of up to ``n_new`` tokens under a
sampling setting (a continuation ends early at EOS). The speculative generator must sample from
exactly this law whatever the draft, the verification rule and the batch; ``tests/text`` and the
shared conformance suite (``conformance.py``) compare the two with chi-square tests.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from speculate.domains.text.request.sampling import SamplingConfig
>>> _ = torch.manual_seed(0)
>>> m = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)).eval()
>>> law = continuation_law(m, [1, 2, 3], 2, SamplingConfig(top_k=2))
>>> len(law), round(sum(law.values()), 12)
(4, 1.0)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .request.sampling import SamplingConfig, probabilities
from .request.tokens import TokenBuffer

__all__ = ["continuation_law"]


@torch.inference_mode()
def continuation_law(
    model: Any, prompt: Sequence[int], n_new: int, cfg: SamplingConfig,
    eos: Sequence[int] = (), encoder_inputs: dict[str, torch.Tensor] | None = None,
    transforms: Any = None,
) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``n_new`` generated tokens (a continuation stops at EOS).

    Every prefix of positive probability is scored by a full forward pass (one batch per depth)
    of a float64 copy of ``model``; probabilities are the sampling transforms in float64. For an
    encoder-decoder, ``encoder_inputs`` are one row's encoder inputs (``input_ids`` ``[1, S]``, or
    ``input_features`` ``[1, F, T]``; no padding) and ``prompt`` its decoder prompt: the encoder
    runs on them, and the decoder on every prefix. ``transforms``: a
    :class:`~speculate.domains.text.request.processors.Transforms` (prefix processors, ``min_new_tokens``;
    its sampling settings replace ``cfg``), applied to every prefix in float64.
    """
    m64 = copy.deepcopy(model).to(torch.float64).eval()
    dev = next(m64.parameters()).device
    enc = None
    if encoder_inputs is not None:
        kw = {k: (v.to(dev, torch.float64) if v.is_floating_point() else v.to(dev))
              for k, v in encoder_inputs.items()}
        enc = m64.get_encoder()(**kw).last_hidden_state  # [1, S, D]
    stop = {int(e) for e in eos}
    law: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for depth in range(n_new):
        if not frontier:
            break
        ids = torch.tensor([[*prompt, *s] for s, _ in frontier], device=dev)  # [F, L + depth]
        if enc is None:
            logits = m64(input_ids=ids).logits[:, -1]  # [F, V]
        else:
            hid = enc.expand(len(frontier), -1, -1)  # [F, S, D]
            logits = m64(encoder_outputs=(hid,), decoder_input_ids=ids).logits[:, -1]  # [F, V]
        if transforms is None:
            pr = probabilities(logits, cfg, dtype=torch.float64).cpu().numpy()  # [F, V]
        else:  # every prefix is a row of a buffer whose prompt is ``prompt``
            buf = TokenBuffer.from_prompts(ids.cpu().numpy(), extra=0)
            buf.prompt_len = np.full(len(frontier), len(prompt), np.int64)
            pr = transforms.probs(logits[:, None], buf, np.arange(len(frontier)), None,
                                  dtype=torch.float64)[:, 0].cpu().numpy()
        nxt = []
        for (seq, w), row in zip(frontier, pr, strict=True):
            for tok in np.flatnonzero(row > 0):
                s, pw = (*seq, int(tok)), w * float(row[tok])
                if int(tok) in stop or depth == n_new - 1:
                    law[s] = law.get(s, 0.0) + pw
                else:
                    nxt.append((s, pw))
        frontier = nxt
    return law
