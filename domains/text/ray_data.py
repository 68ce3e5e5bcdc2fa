"""Speculative text generation over a dataset with Ray Data: a callable class for ``map_batches``.

Ray Data builds one instance per actor, so the target and the draft are loaded once per actor
(``concurrency=`` actors, ``num_gpus=`` each), and every batch of prompts is generated with the
exact speculative decoder::

    import ray
    from speculate.domains.text import SpeculativeTextBatches

    ds = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    out = ds.map_batches(SpeculativeTextBatches, fn_constructor_kwargs={"max_new_tokens": 32, "seed": 0},
                         concurrency=2, batch_size=16)
    out.take_all()  # rows: id, prompt, text, new_tokens, and per-row stats columns

Row ``id`` gets stream ``id`` of the seed (:func:`speculate.distributed.row_streams`): the same
tokens as ``SpeculativeGenerator.generate(prompts, shards=..., rng=seed)`` for that row, whatever
the batch size, the number of actors or the order batches arrive in. Without an id column (or
with ``seed=None``) every row gets fresh entropy.

The class runs without Ray too (it is a plain callable on a dict of columns):

>>> gen = SpeculativeTextBatches(max_new_tokens=4, seed=0, lookahead=2)
>>> out = gen({"id": [0, 1], "prompt": ["def ", "import "]})
>>> sorted(out), [len(t) for t in out["new_tokens"]]
(['accepted', 'id', 'new_tokens', 'prompt', 'proposed', 'rounds', 'target_calls', 'text', 'tokens_per_call'], [4, 4])
>>> out["text"][0] == gen({"id": [0], "prompt": ["def "]})["text"][0]    # row 0 alone: the same tokens
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from speculate.distributed.sharding import row_streams

__all__ = ["SpeculativeTextBatches"]


def _load(spec: Any, which: str, pair: Callable[[], tuple]) -> Any:
    """A model from None (the embedded pair), a folder path, a factory, or a model itself."""
    if spec is None:
        return pair()[0 if which == "target" else 1]
    if isinstance(spec, (str, bytes)) or hasattr(spec, "__fspath__"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(spec).eval()
    if callable(spec) and not hasattr(spec, "config"):
        return spec()
    return spec


class SpeculativeTextBatches:
    """Load a target and a draft once, then generate speculatively for each batch of prompts.

    ``target``, ``draft``: None (the embedded pair of ``speculate.domains.text.examples.pair.load_pair``),
    a Hugging Face folder path, a zero-argument factory, or a model; ``draft`` may also be
    ``"ngram"`` / ``"early-exit:N"``. ``tokenizer``: None (the pair's byte tokenizer when the
    target is the embedded one, else ``AutoTokenizer.from_pretrained(target)`` for a path), a
    factory, or a tokenizer. ``seed``: the seed of the row streams (None: fresh entropy).
    ``prompt_column`` holds strings or token ids; ``id_column`` the row's index in the dataset.
    ``device``: where to put the models (``"cuda"`` with ``num_gpus=1`` in ``map_batches``).
    ``num_threads``: torch's intra-op threads per actor (give the same number as the process you
    compare against for bit-identical tokens: float sums can depend on it).
    The other keywords go to ``SpeculativeGenerator`` (``lookahead``, ``verify``, ``cost_ratio``)
    and ``generate`` (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``).

    Returns the batch's columns plus ``new_tokens`` (ids), ``text`` (when there is a tokenizer)
    and per-row stats: ``rounds``, ``target_calls``, ``proposed``, ``accepted``,
    ``tokens_per_call``.
    """

    def __init__(self, target: Any = None, draft: Any = None, *, tokenizer: Any = None, seed: int | None = 0,
                 prompt_column: str = "prompt", id_column: str = "id", device: str | None = None,
                 lookahead: int | str = 4, verify: str = "block", cost_ratio: float | None = None,
                 max_new_tokens: int = 32, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: Any = None, num_threads: int | None = None) -> None:
        from .api import SpeculativeGenerator

        if num_threads is not None:  # torch's intra-op threads in this actor (the same float sums everywhere)
            import torch

            torch.set_num_threads(int(num_threads))

        cache: dict[str, tuple] = {}

        def pair() -> tuple:
            if "pair" not in cache:
                from .examples.pair import load_pair

                cache["pair"] = load_pair(device=device)
            return cache["pair"]

        tgt = _load(target, "target", pair)
        drf = draft if isinstance(draft, str) else _load(draft, "draft", pair)
        if device is not None:
            tgt = tgt.to(device)
            drf = drf.to(device) if hasattr(drf, "to") else drf
        if tokenizer is None:
            if target is None:
                tokenizer = pair()[2]
            elif isinstance(target, (str, bytes)) or hasattr(target, "__fspath__"):
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(target)
        elif callable(tokenizer) and not hasattr(tokenizer, "decode"):
            tokenizer = tokenizer()
        self.tokenizer = tokenizer
        self.generator = SpeculativeGenerator(tgt, drf, lookahead=lookahead, verify=verify, cost_ratio=cost_ratio)
        self.seed, self.prompt_column, self.id_column = seed, prompt_column, id_column
        self.kw = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                   "eos_token_id": eos_token_id}

    def _ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, (str, bytes, np.str_)):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer: pass tokenizer= (or give token ids)")
            return list(self.tokenizer(str(prompt)).input_ids)
        return [int(t) for t in np.asarray(prompt).ravel()]

    def __call__(self, batch: Any) -> dict[str, Any]:
        cols = {k: list(batch[k]) for k in batch}  # a dict of numpy columns (Ray's default) or a DataFrame
        if self.prompt_column not in cols:
            raise KeyError(f"the batch has no column {self.prompt_column!r} (columns: {sorted(cols)})")
        prompts = [self._ids(p) for p in cols[self.prompt_column]]
        ids = cols.get(self.id_column)
        if self.seed is not None and ids is not None:
            streams = [row_streams(self.seed, 1, start=int(i))[0] for i in ids]
        else:
            streams = [np.random.SeedSequence() for _ in prompts]
        outs = [self.generator.generate([p], rng=np.random.default_rng(s), **self.kw)
                for p, s in zip(prompts, streams, strict=True)]
        new = [o.new_tokens[0] for o in outs]
        out: dict[str, Any] = dict(cols)
        out["new_tokens"] = new
        if self.tokenizer is not None:
            out["text"] = [self.tokenizer.decode(t) for t in new]
        out["rounds"] = [o.stats.rounds for o in outs]
        out["target_calls"] = [o.stats.target_calls for o in outs]
        out["proposed"] = [o.stats.proposed for o in outs]
        out["accepted"] = [o.stats.accepted for o in outs]
        out["tokens_per_call"] = [float(o.stats.tokens_per_call) for o in outs]
        return out
