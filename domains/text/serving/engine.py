"""The serving engine: continuous batching of requests over one :class:`SpeculativeGenerator`.

One thread runs the round loop (:class:`speculate.rounds.RoundLoop`) over one running batch. Between
rounds it admits waiting requests (their prompts are prefilled on their own, then their rows join the
running caches: ``TextProcess.absorb``) and lets finished or cancelled rows go (the caches drop them at
the next round). Requests never wait for a batch to fill, and a long request never holds others back.

Exactness and seeds. Every row is verified by the exact rule under its own settings
(:class:`~.rows.RowSettings`): its tokens follow the target's law for those settings whatever rows run
beside it. Every random draw of a row comes from the row's own stream (:class:`~.rows.RowStreams`),
and every round drafts the same lookahead for every row, so with a fixed lookahead a request's
``seed`` gives the same tokens alone or beside 31 others (up to floating-point differences between
batch shapes, which move a sample only when a uniform falls within about 1e-7 of a boundary). With
``lookahead="auto"`` the lookahead follows the whole batch's acceptance: still exact, not seed-stable.

Faults. A round that raises (a model error) stops no one for good: the engine rewinds every row of
the round to its last committed token and random state and runs each alone for one round; the row
that raises alone ends with ``finish_reason="error"``, the others rejoin. Bad input is refused by
:meth:`Engine.submit` (:class:`~.types.Refused`) before any work; a full queue is :class:`~.types.Busy`.

>>> from speculate.domains.text import SpeculativeGenerator
>>> from speculate.domains.text.conformance import tiny_llama
>>> eng = Engine(SpeculativeGenerator(tiny_llama(vocab=12), "ngram", lookahead=3)).start()
>>> job = eng.submit([1, 2, 3], Sampling(max_tokens=5, temperature=0))
>>> events = list(job)
>>> sum(len(e.token_ids) for e in events) <= 5, events[-1].finish_reason in ("stop", "length")
(True, True)
>>> eng.shutdown()
"""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speculate.rounds import RoundLoop
from speculate.stats import Stats

from ..models.facts import check_eval_mode, execution_device
from ..process import TextProcess
from ..request.inputs import eos_ids, is_int
from ..request.strings import decode
from ..request.tokens import TokenBuffer
from .rows import RowSettings, RowStreams
from .types import Busy, JobEvent, Refused, Sampling

__all__ = ["Engine", "Job"]

_RECENT = 256  # time-to-first-token values kept for /metrics


class Job:
    """One submitted request (``n`` choices): its events, in order, as they are produced."""

    def __init__(self, engine: Engine, prompt: list[int], sampling: Sampling, n: int) -> None:
        self.id = uuid.uuid4().hex
        self.engine, self.prompt, self.sampling, self.n = engine, prompt, sampling, n
        self.prompt_tokens = len(prompt) * n
        self.completion_tokens = 0
        self.created = time.time()
        self.t_submit = time.perf_counter()
        self.first_token: float | None = None
        self.finish_reasons: list[str | None] = [None] * n
        self.cancelled = False
        self._lock = threading.Lock()
        self._sync: deque[JobEvent] = deque()
        self._ready = threading.Condition(self._lock)
        self._aq: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def finished(self) -> bool:
        return all(r is not None for r in self.finish_reasons)

    def _put(self, ev: JobEvent) -> None:
        with self._lock:
            if ev.finish_reason is not None:
                self.finish_reasons[ev.index] = ev.finish_reason
            if self._aq is not None and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._aq.put_nowait, ev)
                except RuntimeError:  # the client's event loop is closed: nobody is listening
                    pass
            else:
                self._sync.append(ev)
                self._ready.notify_all()

    def __iter__(self) -> Iterator[JobEvent]:
        """The events, blocking until each comes; ends after every choice's last event."""
        left = self.n
        while left:
            with self._ready:
                while not self._sync:
                    self._ready.wait()
                ev = self._sync.popleft()
            left -= ev.finish_reason is not None
            yield ev

    async def stream(self) -> AsyncIterator[JobEvent]:
        """The events in an asyncio task (the engine thread hands them to this event loop)."""
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._aq = asyncio.Queue()
            while self._sync:
                self._aq.put_nowait(self._sync.popleft())
        left = self.n
        while left:
            ev = await self._aq.get()
            left -= ev.finish_reason is not None
            yield ev

    def cancel(self) -> None:
        """Stop this job: its rows leave the batch before the next round (finish_reason "cancelled")."""
        self.engine._cancel(self)


@dataclass
class _Row:
    """One choice of a job running in the batch."""

    job: Job
    index: int
    budget: int  # max_tokens
    eos: frozenset
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # generated (EOS excluded)
    logprobs: list[float] = field(default_factory=list)
    sent_text: int = 0  # characters of the decoded text already sent
    sent_tokens: int = 0
    done: bool = False
    isolate: bool = False  # run alone for one round (after a round of its batch raised)


@dataclass
class _Waiting:
    job: Job
    rows: list[_Row]
    streams: list[np.random.Generator]


class Engine:
    """Continuous batching over ``generator`` (a decoder-only :class:`SpeculativeGenerator`), with up to
    ``max_batch`` rows running and ``max_queue`` requests waiting. See the module docstring."""

    def __init__(self, generator: Any, *, max_batch: int = 32, max_queue: int = 64,
                 model_name: str = "speculate") -> None:
        if getattr(generator, "seq2seq", False):
            raise ValueError("the serving engine takes decoder-only targets; "
                             f"{type(generator.target).__name__} is an encoder-decoder")
        for name, v in (("max_batch", max_batch), ("max_queue", max_queue)):
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.generator = gen = generator
        self.tokenizer = gen.tokenizer
        self.model_name = model_name
        self.vocab = int(gen.vocab)
        self.max_batch, self.max_queue = int(max_batch), int(max_queue)
        self.lookahead = gen.lookahead
        self.verify = "token" if gen.draft.spec is not None else gen.verify
        if self.verify == "greedy":
            self.verify = "block"  # rows of any temperature share the batch: one-hot laws for greedy rows
        gc = getattr(gen.target, "generation_config", None)
        self.eos = frozenset(eos_ids(getattr(gc, "eos_token_id", None), self.vocab,
                                     "the target's generation_config.eos_token_id").tolist())
        self._cv = threading.Condition()
        self._waiting: deque[_Waiting] = deque()
        self._cancels: list[Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._proc: TextProcess | None = None
        self._loop: RoundLoop | None = None
        self._rows: dict[int, _Row] = {}
        self._settings = RowSettings()
        self._streams = RowStreams()
        self._joins: bool | None = None  # whether rows can join a running batch (else: waves)
        self.join_refusal: str | None = None
        self.stats = Stats()
        self.counters = dict(requests_total=0, requests_finished=0, requests_refused=0, tokens_generated_total=0,
                             prompt_tokens_total=0, errors_total=0)
        self.accepted_length_counts: list[int] = []
        self.ttft: deque[float] = deque(maxlen=_RECENT)
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)  # (time, tokens) per round

    # -- the client side (any thread) ---------------------------------------------------------
    @property
    def k_max(self) -> int:
        return int(self.lookahead) if self.lookahead != "auto" else int(self.generator.max_lookahead)

    def start(self) -> Engine:
        """Start the engine thread (idempotent)."""
        with self._cv:
            if self._thread is None:
                for model, role in self.generator.models():
                    check_eval_mode(model, role)
                self._thread = threading.Thread(target=self._run, name="speculate-engine", daemon=True)
                self._thread.start()
        return self

    def check(self, prompt: Any, sampling: Sampling, n: int = 1) -> list[int]:
        """``Refused`` naming the field when the request cannot run; the prompt as a list of ids."""
        if not isinstance(sampling, Sampling):
            raise Refused(f"sampling must be a Sampling, got {type(sampling).__name__}")
        if not is_int(n) or not 1 <= n <= self.max_batch:
            raise Refused(f"n must be an integer in 1..{self.max_batch} (the batch's rows), got {n!r}", "n")
        if not isinstance(prompt, (list, tuple)) or not all(is_int(t) for t in prompt):
            raise Refused("the prompt must be a list of token ids", "prompt")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise Refused("the prompt is empty: give at least one token", "prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise Refused(f"prompt token ids {bad[:5]} are outside the vocabulary (0..{self.vocab - 1})", "prompt")
        s = sampling
        if not is_int(s.max_tokens) or s.max_tokens < 1:
            raise Refused(f"max_tokens must be an integer >= 1, got {s.max_tokens!r}", "max_tokens")
        real = (int, float, np.integer, np.floating)
        checks = [("temperature", s.temperature, 0.0, 2.0, False), ("top_p", s.top_p, 0.0, 1.0, True),
                  ("min_p", s.min_p, 0.0, 1.0, True), ("presence_penalty", s.presence_penalty, -2.0, 2.0, False),
                  ("frequency_penalty", s.frequency_penalty, -2.0, 2.0, False)]
        for name, v, lo, hi, optional in checks:
            if v is None and optional:
                continue
            if isinstance(v, bool) or not isinstance(v, real) or not math.isfinite(v) or not lo <= v <= hi:
                raise Refused(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}", name)
        if s.top_p is not None and s.top_p == 0:
            raise Refused("top_p must be > 0 (use temperature=0 for greedy decoding)", "top_p")
        if s.top_k is not None and (not is_int(s.top_k) or s.top_k == 0 or s.top_k < -1):
            raise Refused(f"top_k must be a positive integer (or -1 / null: all tokens), got {s.top_k!r}", "top_k")
        if s.seed is not None and (not is_int(s.seed) or not 0 <= s.seed < 2**63):
            raise Refused(f"seed must be an integer in 0..2**63-1, got {s.seed!r}", "seed")
        if s.stop and self.tokenizer is None:
            raise Refused("stop strings need a tokenizer (serve the model with its tokenizer)", "stop")
        if not all(isinstance(t, str) and t for t in s.stop):
            raise Refused("stop must be non-empty strings", "stop")
        if not all(is_int(t) and 0 <= t < self.vocab for t in s.stop_token_ids):
            raise Refused(f"stop_token_ids must be ids in 0..{self.vocab - 1}", "stop_token_ids")
        if s.json_schema is not None:
            self._schema(s.json_schema)  # compiled (and cached) now: a bad schema is refused before any work
        try:  # the learned positions / sliding windows: the row may run k tokens past max_tokens
            self.generator.limits.check_lengths(self.generator.models(), [prompt], s.max_tokens + self.k_max + 1)
        except ValueError as err:
            raise Refused(f"{err} (the server drafts up to {self.k_max + 1} tokens past max_tokens: "
                          "they count against the context)", "max_tokens") from None
        return prompt

    def _schema(self, spec: Any) -> tuple[Any, np.ndarray]:
        """A pristine row constraint for the JSON schema ``spec`` and the ids that end a complete text."""
        import json

        from ..request.constraints import grammar_constraints

        key = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True, default=str)
        cache = self.__dict__.setdefault("_schemas", {})
        if key not in cache:
            if self.tokenizer is None:
                raise Refused("response_format needs the model's tokenizer (serve the model with it)",
                              "response_format")
            try:
                cons = grammar_constraints(self.tokenizer, self.vocab, 1, json_schema=spec)
            except ImportError:
                raise Refused("response_format needs llguidance: pip install 'speculate[structured]'",
                              "response_format") from None
            except (ValueError, TypeError) as err:
                raise Refused(f"response_format: {err}", "response_format") from None
            if len(cache) > 256:
                cache.clear()
            cache[key] = (cons.rows[0], cons.eos)
        return cache[key]

    def _constraint(self, job: Job) -> Any:
        """A fresh constraint state for one choice of ``job`` (None without a schema)."""
        if job.sampling.json_schema is None:
            return None
        return copy.deepcopy(self._schema(job.sampling.json_schema)[0])

    def submit(self, prompt: Any, sampling: Sampling, n: int = 1) -> Job:
        """Queue a request of ``n`` choices; ``Refused`` / ``Busy`` before any work."""
        try:
            prompt = self.check(prompt, sampling, n)
        except Refused:
            with self._cv:
                self.counters["requests_refused"] += 1
            raise
        job = Job(self, prompt, sampling, n)
        seeds = (np.random.SeedSequence(sampling.seed).spawn(n) if sampling.seed is not None
                 else np.random.SeedSequence().spawn(n))
        eos = set() if sampling.ignore_eos else set(self.eos)
        eos |= {int(t) for t in sampling.stop_token_ids}
        if sampling.json_schema is not None:  # a complete text ends at the tokenizer's EOS
            eos |= set(self._schema(sampling.json_schema)[1].tolist())
        rows = [_Row(job, i, int(sampling.max_tokens), frozenset(eos), prompt) for i in range(n)]
        with self._cv:
            if self._stopping:
                self.counters["requests_refused"] += 1
                raise Busy("the server is shutting down", shutting_down=True)
            if len(self._waiting) >= self.max_queue:
                self.counters["requests_refused"] += 1
                raise Busy(f"the queue is full ({self.max_queue} requests waiting): try again later")
            self._waiting.append(_Waiting(job, rows, [np.random.Generator(np.random.PCG64(s)) for s in seeds]))
            self.counters["requests_total"] += 1
            self.counters["prompt_tokens_total"] += job.prompt_tokens
            self._cv.notify_all()
        if self._thread is None:
            self.start()
        return job

    def _cancel(self, job: Job) -> None:
        with self._cv:
            job.cancelled = True
            self._cancels.append(job)
            self._cv.notify_all()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting; end the waiting requests with an error; let the running ones finish for up to
        ``timeout`` seconds, then end them with an error too; stop the thread."""
        with self._cv:
            self._stopping = True
            self._deadline = time.perf_counter() + timeout
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout + 30.0)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def metrics(self) -> dict[str, Any]:
        """A snapshot of the counters (for ``GET /metrics``)."""
        with self._cv:
            st = self.stats
            now = time.perf_counter()
            recent = [(t, n) for t, n in self._recent if now - t <= 10.0]
            span = (now - recent[0][0]) if len(recent) > 1 else 0.0
            tps = sum(n for _, n in recent[1:]) / span if span > 0 else 0.0
            return dict(
                **self.counters,
                requests_running=len({id(r.job) for r in self._rows.values()}),
                requests_waiting=len(self._waiting),
                target_calls_total=st.target_calls, drafted_total=st.proposed, accepted_total=st.accepted,
                rounds_total=st.rounds, acceptance_rate=st.accepted / st.proposed if st.proposed else 0.0,
                tokens_per_target_call=st.emitted / st.row_rounds if st.row_rounds else 0.0,
                accepted_length_counts=list(self.accepted_length_counts), ttft_seconds=list(self.ttft),
                tokens_per_second=tps, batch_size=len(self._rows), lookahead=self.lookahead,
                joins=self._joins is not False)

    # -- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._waiting or self._rows or self._cancels or self._stopping):
                        self._cv.wait()
                    cancels, self._cancels = self._cancels, []
                    if self._stopping:
                        self._end_waiting("the server is shutting down")
                        if not self._rows or time.perf_counter() > self._deadline:
                            break
                    admit = self._admissible()
                self._drop_jobs(cancels, "cancelled")
                if admit:
                    self._admit(admit)
                if self._loop is not None and self._loop.rows.size:
                    self._round()
                elif self._proc is not None:
                    self._release()
        finally:
            self._end_all("error", "the server shut down before this request finished")
            self._release()

    def _admissible(self) -> list[_Waiting]:
        """The waiting requests that join now (under the lock): all that fit in the batch, or one
        request to run alone (rows to isolate, or waves when rows cannot join)."""
        take: list[_Waiting] = []
        running = len(self._rows)
        if self._waiting and self._waiting[0].rows[0].isolate:
            return [self._waiting.popleft()] if running == 0 else []
        if running and (self._joins is False or any(r.isolate for r in self._rows.values())):
            return []
        while self._waiting and not self._waiting[0].rows[0].isolate:
            w = self._waiting[0]
            if running + len(w.rows) > self.max_batch:
                break
            if not self._fits(running, w):
                break
            take.append(self._waiting.popleft())
            running += len(w.rows)
        return take

    def _fits(self, running: int, w: _Waiting) -> bool:
        """Whether ``w``'s rows fit in memory beside the running ones (KV-cache estimate)."""
        from ..models.memory import CacheMemoryError

        cap = len(w.rows[0].prompt) + w.rows[0].budget + self.k_max + 1
        try:
            self.generator.limits.check_memory(self.generator.models(), max(running, 1) + len(w.rows), cap,
                                               self.k_max + 2)
        except CacheMemoryError:
            return running == 0  # a request alone always gets its chance (it fails then, not here)
        return True

    def _new_process(self, rows: list[_Row]) -> TextProcess:
        gen = self.generator
        prompts = [r.prompt + r.tokens for r in rows]
        extra = max(r.budget - len(r.tokens) for r in rows) + self.k_max + 1
        tokens = TokenBuffer.from_prompts(prompts, extra=extra)
        tokens.prompt_len[:] = [len(r.prompt) for r in rows]  # penalties count the generated tokens
        # the engine's own runtimes (copies of the generator's: the same models, caches of their own)
        target_lm, draft = copy.copy(gen._target_lm), gen.draft.fresh()
        on_device = (gen.verify_on_device if gen.verify_on_device is not None
                     else execution_device(gen.target).type == "cuda")
        return TextProcess(target=target_lm, draft=draft, tokens=tokens, cfg=self._settings,
                           eos=np.zeros(0, np.int64), vocab=self.vocab, on_device=on_device, want_logprobs=True)

    def _admit(self, batch: list[_Waiting]) -> None:
        """Prefill the new requests' rows on their own, then join them to the running batch."""
        rows = [r for w in batch for r in w.rows]
        streams = [g for w in batch for g in w.streams]
        try:
            proc = self._new_process(rows)
            proc.start(spare=self.k_max + 2)
        except Exception as err:  # a prefill raised: each request alone finds the one at fault
            self._requeue_alone(batch, err)
            return
        try:
            if self._proc is not None and self._loop is not None and self._loop.rows.size:
                self._proc._select(self._loop.rows)  # finished rows leave the caches before the copy
                if len(self._proc.tokens.n) > 2 * len(self._proc.live) + 16:
                    self._compact()  # the buffer forgets the finished rows
                new = self._proc.absorb(proc)
            else:
                self._release()
                self._proc, new = proc, proc.live.copy()
                if self._joins is None:  # known before any other request can be admitted beside these
                    self.join_refusal = proc.join_refusal()
                    self._joins = self.join_refusal is None
                self._loop = RoundLoop(proc, lookahead=self.lookahead, verify=self.verify, rng=self._streams,
                                       max_lookahead=self.generator.max_lookahead,
                                       cost_ratio=self.generator.cost_ratio, stats=self.stats)
        except Exception as err:  # joining failed (the caches may be half-joined): everyone reruns alone
            self._requeue_alone(batch, err)
            if self._loop is not None and self._loop.rows.size:
                self._fault(self._loop.rows.copy(), err)
            return
        s = [r.job.sampling for r in rows]
        self._settings.add(new, temperature=[x.temperature for x in s], top_k=[None if x.top_k in (None, -1)
                           else x.top_k for x in s], top_p=[x.top_p for x in s], min_p=[x.min_p for x in s],
                           presence=[x.presence_penalty for x in s], frequency=[x.frequency_penalty for x in s])
        # each row's constraint from its first generated token (a row rerun alone replays its tokens)
        self._settings.constrain(new, [self._constraint(r.job) for r in rows], self.vocab)
        for b, r, g in zip(new.tolist(), rows, streams, strict=True):
            self._rows[b] = r
            self._streams.streams[b] = g
        self._loop.add(new, [r.budget - len(r.tokens) for r in rows])

    def _compact(self) -> None:
        """Renumber the live rows 0..R-1 (the buffer forgets finished rows)."""
        proc = self._proc
        old = proc.compact()
        mapping = np.full(int(old.max()) + 1 if len(old) else 0, -1, np.int64)
        mapping[old] = np.arange(len(old))
        self._loop.renumber(mapping)
        self._settings.taken(old)
        self._rows = {int(mapping[b]): r for b, r in self._rows.items() if b < len(mapping) and mapping[b] >= 0}
        self._streams.streams = {int(mapping[b]): g for b, g in self._streams.streams.items()
                                 if b < len(mapping) and mapping[b] >= 0}

    def _round(self) -> None:
        loop, proc = self._loop, self._proc
        rows = loop.rows.copy()
        self._streams.rows = rows.tolist()
        rewind = self._streams.states()
        n0 = proc.tokens.n[rows].copy()
        try:
            ev = loop.step()
        except Exception as err:
            self._streams.rewind(rewind)
            self._fault(rows, err)
            return
        now = time.perf_counter()
        n_acc = np.asarray(ev.used) - 1
        with self._cv:
            for a in n_acc.tolist():
                while len(self.accepted_length_counts) <= a:
                    self.accepted_length_counts.append(0)
                self.accepted_length_counts[a] += 1
            self._recent.append((now, int(sum(ev.used))))
        leave = []
        for i, b in enumerate(rows.tolist()):
            row = self._rows.get(b)
            if row is None:
                continue
            u = int(ev.used[i])
            toks = proc.tokens.ids[b, n0[i] : n0[i] + u].tolist()
            lps = proc.logprobs[b, n0[i] : n0[i] + u].astype(float).tolist()
            self._deliver(row, toks, lps)
            if row.isolate:
                row.isolate = False
            if row.done:
                leave.append(b)
        finished = set(ev.finished)
        for b in ev.finished:  # budget reached in the loop (the delivery cut it at max_tokens)
            row = self._rows.get(b)
            if row is not None and not row.done:
                self._finish(row, "length")
        leave = [b for b in leave if b not in finished]
        if leave:
            loop.drop(leave)
        for b in [*leave, *finished]:
            self._forget(b)
        if not loop.rows.size:
            self._release()

    def _deliver(self, row: _Row, toks: list[int], lps: list[float]) -> None:
        """Hand a row's newly committed tokens to its job: cut at its EOS, max_tokens and stop strings."""
        if row.done or row.job.cancelled:
            return
        new, new_lp, reason = [], [], None
        for t, lp in zip(toks, lps, strict=True):
            if t in row.eos:
                reason = "stop"
                row.job.completion_tokens += 1
                break
            new.append(t)
            new_lp.append(lp)
            if len(row.tokens) + len(new) >= row.budget:
                reason = "length"
                break
        row.tokens += new
        row.logprobs += new_lp
        row.job.completion_tokens += len(new)
        text = ""
        if self.tokenizer is not None:
            full = decode(self.tokenizer, row.tokens)
            stop_at = None
            for s in row.job.sampling.stop:
                j = full.find(s, max(0, row.sent_text - len(s) + 1))
                if j >= 0 and (stop_at is None or j < stop_at):
                    stop_at = j
            if stop_at is not None:  # cut the text before the stop string, the tokens after the one completing it
                reason = "stop"
                full = full[:stop_at]
                keep = len(row.tokens) - len(new)
                while keep < len(row.tokens) and len(decode(self.tokenizer, row.tokens[:keep])) < stop_at + 1:
                    keep += 1
                drop = len(row.tokens) - keep
                if drop:
                    row.job.completion_tokens -= drop
                    del row.tokens[keep:], row.logprobs[keep:]
                    new, new_lp = new[: max(0, len(new) - drop)], new_lp[: max(0, len(new_lp) - drop)]
            end = len(full)
            if reason is None:  # hold back an incomplete character and a possible start of a stop string
                end = len(full.rstrip("\ufffd"))
                for s in row.job.sampling.stop:
                    for m in range(min(len(s) - 1, end), 0, -1):
                        if full[:end].endswith(s[:m]):
                            end = min(end, len(full[:end]) - m)
                            break
            if end > row.sent_text:
                text, row.sent_text = full[row.sent_text : end], end
        if new and row.job.first_token is None:
            row.job.first_token = time.perf_counter()
            with self._cv:
                self.ttft.append(row.job.first_token - row.job.t_submit)
        with self._cv:
            self.counters["tokens_generated_total"] += len(new)
        if new or text or reason is not None:
            row.sent_tokens += len(new)
            row.job._put(JobEvent(row.index, new, text, new_lp if row.job.sampling.logprobs else None, reason))
        if reason is not None:
            row.done = True
            self._done_job(row.job)

    def _finish(self, row: _Row, reason: str, error: str | None = None) -> None:
        if row.done:
            return
        row.done = True
        text = ""
        if self.tokenizer is not None and reason != "error":
            full = decode(self.tokenizer, row.tokens)
            text, row.sent_text = full[row.sent_text :], len(full)
        row.job._put(JobEvent(row.index, [], text, [] if row.job.sampling.logprobs else None, reason, error))
        self._done_job(row.job)

    def _done_job(self, job: Job) -> None:
        if job.finished:
            with self._cv:
                self.counters["requests_finished"] += 1

    def _forget(self, b: int) -> None:
        self._rows.pop(b, None)
        self._streams.streams.pop(b, None)

    def _drop_jobs(self, jobs: list[Job], reason: str) -> None:
        """End ``jobs`` (cancelled): their running rows leave the batch, their waiting entries the queue."""
        if not jobs:
            return
        ids = {id(j) for j in jobs}
        with self._cv:
            waiting = [w for w in self._waiting if id(w.job) in ids]
            for w in waiting:
                self._waiting.remove(w)
        for w in waiting:
            for r in w.rows:
                self._finish(r, reason)
        gone = [b for b, r in self._rows.items() if id(r.job) in ids]
        for b in gone:
            self._finish(self._rows[b], reason)
            self._forget(b)
        if gone and self._loop is not None:
            self._loop.drop(gone)

    def _requeue_alone(self, batch: list[_Waiting], err: Exception) -> None:
        """Admitting ``batch`` raised: a request admitted alone ends with the error; several go back to
        the front of the queue, each to be admitted alone."""
        if (len(batch) == 1 and batch[0].rows[0].isolate) or (len(batch) == 1 and len(batch[0].rows) == 1):
            self.counters["errors_total"] += 1
            for r in batch[0].rows:
                self._finish(r, "error", f"{type(err).__name__}: {err}")
            return
        for w in batch:
            for r in w.rows:
                r.isolate = True
        with self._cv:
            self._waiting.extendleft(reversed(batch))

    def _fault(self, rows: np.ndarray, err: Exception) -> None:
        """A round raised: a row that ran alone ends with the error; otherwise every row of the round
        goes back to the front of the queue, from its committed tokens, to run alone for one round."""
        self.counters["errors_total"] += 1
        msg = f"{type(err).__name__}: {err}"
        entries = []
        for b in rows.tolist():
            row = self._rows.get(b)
            if row is None:
                continue
            if len(rows) == 1 or row.isolate:
                self._finish(row, "error", msg)
            else:
                row.isolate = True
                entries.append(_Waiting(row.job, [row], [self._streams.streams[b]]))
        for b in rows.tolist():
            self._forget(b)
        self._loop.drop(rows)
        self._release()
        with self._cv:
            self._waiting.extendleft(reversed(entries))

    def _release(self) -> None:
        if self._proc is not None:
            try:
                self._proc.release()
            finally:
                self._proc = None
                self._loop = None
                self._rows.clear()
                self._streams.streams.clear()
                self._settings.taken(np.zeros(0, np.int64))

    def _end_waiting(self, msg: str) -> None:
        """(under the lock) end every waiting request with an error."""
        while self._waiting:
            w = self._waiting.popleft()
            for r in w.rows:
                if not r.done:
                    r.done = True
                    r.job._put(JobEvent(r.index, [], "", None, "error", msg))

    def _end_all(self, reason: str, msg: str) -> None:
        with self._cv:
            self._end_waiting(msg)
        for r in list(self._rows.values()):
            self._finish(r, reason, msg)
