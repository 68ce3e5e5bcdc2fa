"""The four ways a :class:`~speculate.domains.text.SpeculativeGenerator` runs a request: plain
(:func:`run_plain`, ``generate``), streamed (:func:`run_streamed`, ``stream``), in chunks
(:func:`run_chunked`, ``generate(batch_size=)``) and sharded (:func:`run_sharded`,
``generate(executor=/shards=)``: one random stream per prompt on :func:`speculate.distributed.map_shards`).
Each is a few lines over one :class:`Request`: :func:`prepare` checks it and builds its process
(nothing allocated), :func:`rounds_of` runs its rounds (caches filled at the first round, released
at the end, on an error, or when the caller stops), :func:`output_of` reads its output.

>>> from speculate.domains.text import SpeculativeGenerator
>>> from speculate.domains.text.conformance import tiny_llama
>>> from speculate.domains.text.request.settings import resolve
>>> gen = SpeculativeGenerator(tiny_llama(vocab=12), "ngram", lookahead=3)
>>> req = prepare(gen, resolve(None, max_new_tokens=5), np.random.default_rng(0), input_ids=[[1, 2, 3]])
>>> n_rounds = sum(1 for _ in rounds_of(gen, req))
>>> [len(s) for s in output_of(gen, req).sequences], n_rounds >= 2
([8], True)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from speculate.distributed.sharding import map_shards
from speculate.rng import as_rng
from speculate.rounds import Lookahead, Round, rounds
from speculate.stats import Stats

from .models.encoder_decoder import encode
from .models.facts import check_eval_mode, execution_device
from .process import TextProcess
from .request.constraints import grammar_constraints
from .request.inputs import EncoderInputs, decoder_prompts, encoder_inputs, eos_ids, is_int, pad_id, prompt_ids
from .request.output import GenerationOutput, joined
from .request.processors import Transforms
from .request.progress import progress_bar
from .request.settings import Settings
from .request.streaming import StreamEvent, stream_events, streamer_feed
from .request.strings import StopStrings
from .request.tokens import TokenBuffer

__all__ = ["Request", "output_of", "prepare", "rounds_of", "run_chunked", "run_fed", "run_plain", "run_sharded",
           "run_streamed"]


class Request(NamedTuple):
    """One checked request: its process (the caches are filled at its first round), buffer and budget."""

    process: TextProcess
    tokens: TokenBuffer
    prompt_lengths: list[int]
    n_new: int
    verify: str
    rng: np.random.Generator
    spare: int
    stats: Stats
    t_start: float


def run_plain(gen: Any, s: Settings, rng: Any, request: dict[str, Any], streamer: Any = None,
              logprobs: bool = False) -> GenerationOutput:
    """``generate``: the whole request in one batch, a transformers ``streamer`` fed each round."""
    req = prepare(gen, s, as_rng(rng), **request, logprobs=logprobs)
    return run_fed(gen, req, streamer_feed(streamer, req.tokens, gen.tokenizer) if streamer is not None else None)


def run_fed(gen: Any, req: Request, feed: Any = None) -> GenerationOutput:
    """Run ``req``'s rounds, each handed to ``feed`` (a streamer feed, ended either way); its output."""
    try:
        for event in rounds_of(gen, req):
            if feed is not None:
                feed.round(event)
    finally:
        if feed is not None:
            feed.end()
    return output_of(gen, req)


def run_streamed(gen: Any, s: Settings, rng: Any, request: dict[str, Any],
                 streamer: Any = None) -> Iterator[StreamEvent]:
    """``stream``: checked now, run at the first ``next()``; one event per round."""
    req = prepare(gen, s, as_rng(rng), **request)
    feed = streamer_feed(streamer, req.tokens, gen.tokenizer) if streamer is not None else None
    return stream_events(rounds_of(gen, req), req.tokens, gen.tokenizer, feed)


def run_chunked(gen: Any, request: dict[str, Any], s: Settings, rng: Any, streamer: Any, batch_size: int,
                progress: bool | None, logprobs: bool = False) -> GenerationOutput:
    """``generate(batch_size=)``: the request over chunks of ``batch_size`` prompts, one random stream for all."""
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if streamer is not None:
        raise ValueError("streamer= takes one row; it cannot be combined with batch_size=")
    if gen.seq2seq or request["input_features"] is not None or request["decoder_input_ids"] is not None:
        raise ValueError("batch_size= takes decoder-only prompts; split encoder-decoder requests yourself")
    prompts = prompt_ids(request["input_ids"], request["attention_mask"], gen.vocab, gen.tokenizer,
                         pad_id(gen.target, gen.tokenizer))
    rng = as_rng(rng)
    t0 = time.perf_counter()
    outs = []
    with progress_bar(len(prompts), "generate", enabled=progress, unit="prompt") as bar:
        for i in range(0, len(prompts), batch_size):
            chunk = [p.tolist() for p in prompts[i : i + batch_size]]
            part = s if not any(isinstance(v, (list, tuple)) for v in s.constraint.values()) else dataclasses.replace(
                s, constraint={k: list(v)[i : i + batch_size] if isinstance(v, (list, tuple)) else v
                               for k, v in s.constraint.items()})  # one constraint per prompt: this chunk's
            req = prepare(gen, part, rng, input_ids=chunk, logprobs=logprobs)
            for _ in rounds_of(gen, req):
                pass
            outs.append(output_of(gen, req))
            bar.update(len(chunk))
    return joined(outs, time.perf_counter() - t0, gen.tokenizer)


def run_sharded(gen: Any, prompts: Sequence[Sequence[int]], *, executor: Any = None, shards: int | None = None,
                rows_per_stream: int = 1, rng: Any = 0, **kw: Any) -> GenerationOutput:
    """``generate(executor=/shards=)`` on token-id prompts with one random stream per prompt
    (:func:`speculate.distributed.map_shards`): the samples depend on the seed and the prompt alone.

    ``gen``: a ``SpeculativeGenerator`` (pickled with each shard) or a
    :class:`~speculate.distributed.PerWorker` that builds one (loaded once per worker).
    """
    prompts = [[int(t) for t in p] for p in prompts]
    return map_shards(_shard, {"prompts": prompts}, merge=_merge_shards, fixed={"generator": gen, **kw}, rng=rng,
                      executor=executor, shards=shards, rows_per_stream=rows_per_stream)


def _shard(rng: np.random.Generator, prompts: Sequence[Sequence[int]], generator: Any, **kw: Any) -> GenerationOutput:
    return generator.generate([list(p) for p in prompts], rng=rng, **kw)


def _merge_shards(parts: list[GenerationOutput], seconds: float) -> GenerationOutput:
    return joined(parts, seconds)


def prepare(gen: Any, s: Settings, rng: np.random.Generator, *, input_ids: Any = None, attention_mask: Any = None,
             input_features: Any = None, decoder_input_ids: Any = None,
             decoder_attention_mask: Any = None, logprobs: bool = False) -> Request:
    """Check a request and build its process (nothing allocated yet)."""
    t_start = time.perf_counter()
    cfg = s.sampling
    trees = gen.draft.spec is not None
    # token trees: recursive rejection (the block rule has no tree form)
    verify = "greedy" if cfg.greedy else ("token" if trees else gen.verify)
    if verify == "greedy" and not cfg.greedy:
        raise ValueError("verify='greedy' is exact only for temperature=0; use 'token' or 'block'")
    for model, role in gen.models():  # .train() may have been called since __init__
        check_eval_mode(model, role)
    enc: EncoderInputs | None = None
    if gen.seq2seq:
        enc = encoder_inputs(gen.target, input_ids, attention_mask, input_features, gen.tokenizer)
        prompts = decoder_prompts(gen.target, decoder_input_ids, decoder_attention_mask, enc.rows,
                                  gen.vocab)
    else:
        extra = [k for k, v in (("input_features", input_features), ("decoder_input_ids", decoder_input_ids),
                                ("decoder_attention_mask", decoder_attention_mask)) if v is not None]
        if extra:
            raise ValueError(f"{type(gen.target).__name__} is a decoder-only LM: {', '.join(extra)} "
                             "belong to encoder-decoder targets; pass the prompt as input_ids")
        prompts = prompt_ids(input_ids, attention_mask, gen.vocab, gen.tokenizer, pad_id(gen.target, gen.tokenizer))
    cons = grammar_constraints(gen.tokenizer, gen.vocab, len(prompts), **s.constraint) if s.constraint else None
    n_ret = s.num_return_sequences
    if n_ret > 1:  # each prompt repeated: independent rows, prompt-major
        prompts = [p for p in prompts for _ in range(n_ret)]
        cons = None if cons is None else cons.repeat(n_ret)
        if enc is not None:
            enc = EncoderInputs({k: v.repeat_interleave(n_ret, 0) for k, v in enc.tensors.items()},
                                None if enc.ids is None else [r for r in enc.ids for _ in range(n_ret)],
                                enc.rows * n_ret)
    if s.eos_token_id is None:
        gc = getattr(gen.target, "generation_config", None)
        eos = eos_ids(getattr(gc, "eos_token_id", None), gen.vocab,
                      "the target's generation_config.eos_token_id")
    else:
        eos = eos_ids(s.eos_token_id, gen.vocab, "eos_token_id")
    n_new = s.max_new_tokens
    # cache slots past the longest row: the padded columns of ragged blocks (a row that
    # needs fewer drafts than the block is wide) and the scoring block's own column
    k_max = gen.lookahead if isinstance(gen.lookahead, int) else gen.max_lookahead
    spare = min(k_max, n_new) + 2
    if trees:  # a tree's nodes sit past the committed tokens while it is scored
        spare = max(spare, gen.draft.spec.n_nodes + 2)
    if n_new > 0:
        gen.limits.check_lengths(gen.models(), prompts, n_new)
        source = 0 if enc is None else _source_length(gen.target, enc)
        gen.limits.check_memory(gen.models(), len(prompts), max(len(p) for p in prompts) + n_new, spare, source)
    tokens = TokenBuffer.from_prompts(prompts, extra=n_new)  # the loop gives no row more
    if cons is not None:  # a row whose constraint is met ends at the tokenizer's EOS
        eos = np.union1d(eos, cons.eos).astype(np.int64)
    transforms = Transforms(cfg, s.before, s.user, s.min_new_tokens, eos, constraints=cons)
    stop = StopStrings(gen.tokenizer, s.stop_strings).hook(tokens) if s.stop_strings else None
    on_device = (gen.verify_on_device if gen.verify_on_device is not None
                 else execution_device(gen.target).type == "cuda")
    process = TextProcess(target=gen._target_lm, draft=gen.draft, tokens=tokens, cfg=transforms,
                          eos=eos, vocab=gen.vocab, stop=stop, on_device=on_device,
                          encode=None if enc is None else _encoders(gen, enc), want_logprobs=logprobs)
    return Request(process, tokens, [len(p) for p in prompts], n_new, verify, rng, spare, Stats(), t_start)

def rounds_of(gen: Any, req: Request) -> Iterator[Round]:
    """The rounds of ``req`` (a generator): caches filled at the first ``next()``, released when
    the rounds end, raise, or the caller stops early."""
    if req.n_new <= 0:
        return
    _claim(gen)
    try:
        req.process.start(spare=req.spare)
        yield from rounds(req.process, len(req.prompt_lengths), req.n_new, lookahead=gen.lookahead,
                          verify=req.verify, rng=req.rng, max_lookahead=gen.max_lookahead,
                          cost_ratio=gen.cost_ratio, stats=req.stats, control=_control(gen))
    finally:
        try:
            req.process.release()
        finally:
            gen._running = False

def output_of(gen: Any, req: Request) -> GenerationOutput:
    """The finished request's output."""
    t = req.tokens
    seqs = [t.ids[r, : t.n[r]].tolist() for r in range(len(req.prompt_lengths))]
    lp = None
    if req.process.want_logprobs:
        got = req.process.logprobs
        lp = [[] if got is None else got[r, p : t.n[r]].astype(float).tolist()
              for r, p in enumerate(req.prompt_lengths)]
    eos = set(np.asarray(req.process.eos).tolist())
    reasons = ["stop" if t.n[r] - p < req.n_new or (t.n[r] > p and int(t.ids[r, t.n[r] - 1]) in eos) else "length"
               for r, p in enumerate(req.prompt_lengths)]
    return GenerationOutput(sequences=seqs, prompt_lengths=req.prompt_lengths, stats=req.stats,
                            prefill_time=req.process.prefill_time,
                            wall_time=time.perf_counter() - req.t_start, tokenizer=gen.tokenizer,
                            logprobs=lp, finish_reasons=reasons)


def _control(gen: Any) -> Lookahead | None:
    """``lookahead="auto"`` with measured costs: one control per generator, continued across its calls
    (the acceptance and the costs it measured are the past of the next call; many short requests do
    not each pay for measuring rounds). With ``cost_ratio=`` each call starts afresh: its output then
    depends on its seed alone."""
    if gen.lookahead != "auto" or gen.cost_ratio is not None:
        return None
    c = gen.__dict__.get("_auto")
    if c is None or c.max != gen.max_lookahead:
        c = gen._auto = Lookahead("auto", gen.max_lookahead)
    return c


#: makes the running check and set of :func:`_claim` one step across threads
_RUNNING_LOCK = threading.Lock()


def _claim(gen: Any) -> None:
    """Mark this generator running, or raise before touching its caches: one generator holds one
    set of model caches, so a second run (``generate`` inside its own ``stream`` loop, or another
    thread) would overwrite the first's."""
    with _RUNNING_LOCK:
        if gen.__dict__.get("_running", False):
            raise RuntimeError(
                "this SpeculativeGenerator is already running (a generate or stream call that has not "
                "finished: a stream being iterated, or another thread); it holds one set of model caches, "
                "so runs cannot overlap: finish or close() the stream first, or make one generator per "
                "thread (they can share the models)")
        gen._running = True

def _encoders(gen: Any, enc: EncoderInputs) -> Any:
    """The process's encode step: the target's encoder once per row, its output handed to the
    target's cache and to the draft (which may run its own encoder on ``enc``)."""
    lm = gen._target_lm

    def run_encoders() -> None:
        state = encode(gen.target, enc.tensors)
        lm.encoder = state  # type: ignore[union-attr]
        gen.draft.encode(enc, state)

    return run_encoders

def _source_length(target: Any, enc: EncoderInputs) -> int:
    """Encoder positions per row (what the cross-attention caches hold)."""
    if "input_ids" in enc.tensors:
        return int(enc.tensors["input_ids"].shape[1])
    src = getattr(target.config, "max_source_positions", None)  # speech: after the convolutions
    return int(src) if isinstance(src, int) else int(enc.tensors["input_features"].shape[-1])
