"""The OpenAI-compatible HTTP layer over the serving engine: :func:`make_app` builds a FastAPI app with
``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as server-sent events with
``stream: true``), ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text).

Requests are checked field by field before any work (pydantic models, strict types) and every error
comes back in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON, wrong types, out-of-range values, fields we do not support (named in the message; no field is
silently dropped except the few in :data:`IGNORED`) and the engine's :class:`~.types.Refused`; 404
for an unknown model; 429 when the engine's queue is full and 503 while it shuts down
(:class:`~.types.Busy`). The engine (``engine.py``) knows nothing of HTTP; this module knows nothing of
its rounds: it turns requests into (prompt ids, :class:`~.types.Sampling`, n) and the job's
:class:`~.types.JobEvent` stream into OpenAI responses or chunks.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .types import Busy, JobEvent, Refused, Sampling

__all__ = ["IGNORED", "UNSUPPORTED", "ApiError", "ChatCompletionRequest", "CompletionRequest", "make_app"]

#: fields accepted and ignored (they change nothing a local server computes)
IGNORED = frozenset({"user", "metadata", "store", "service_tier"})
#: OpenAI fields this server does not implement: a request that sets one is refused (400, naming it)
UNSUPPORTED = {
    "tools": "tools (function calling) are not supported",
    "tool_choice": "tools (function calling) are not supported",
    "parallel_tool_calls": "tools (function calling) are not supported",
    "functions": "functions (function calling) are not supported",
    "function_call": "functions (function calling) are not supported",
    "logit_bias": "logit_bias is not supported",
    "suffix": "suffix (insertion) is not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning_effort is not supported",
    "web_search_options": "web search is not supported",
}
MAX_STOP = 4
DEFAULT_CHAT_TOKENS = 1024  # a chat request without max_tokens, on a model of unknown context
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ApiError(Exception):
    """An error answered in OpenAI's shape with ``status``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Settings(BaseModel):
    """What both endpoints take (OpenAI's names; ``stop_token_ids`` and ``ignore_eos`` as vLLM's)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=128)
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class CompletionRequest(_Settings):
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a list of one of those."""

    prompt: Any = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1)


class ChatCompletionRequest(_Settings):
    """``POST /v1/chat/completions``: ``messages`` through the tokenizer's chat template."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


_Settings.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
_Req = TypeVar("_Req", bound=_Settings)


# ---- requests -> (prompt ids, Sampling, n) -------------------------------------------------------------


async def _parse(request: Request, model: type[_Req]) -> _Req:
    """The JSON body as ``model`` (whatever the content type: ``curl -d`` sends a form's), or a 400
    naming the field at fault."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON ({err})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise _invalid(err.errors(include_url=False)) from None


def _refuse_extras(req: _Settings) -> None:
    """400 for every field we do not implement (named), unless it is absent in effect (None, empty)."""
    for name, value in (req.model_extra or {}).items():
        if name in IGNORED or value is None:
            continue
        if name in UNSUPPORTED:
            if value in ({}, []) or (name in ("tool_choice", "function_call") and value == "none"):
                continue
            raise ApiError(400, f"{name}: {UNSUPPORTED[name]}", param=name, code="unsupported_parameter")
        raise ApiError(400, f"{name}: unknown field (this server takes OpenAI's fields; see the text "
                            "domain's README, 'Serving')", param=name, code="unsupported_parameter")
    _schema(req.response_format)


def _schema(rf: Any) -> Any:
    """The JSON schema a ``response_format`` asks for (None: free text). OpenAI's shapes:
    ``{"type": "text"}``, ``{"type": "json_object"}`` (any JSON object) and
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "response_format: expected {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                       param="response_format")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return {"type": "object"}
    js = rf.get("json_schema")
    schema = js.get("schema") if isinstance(js, dict) else None
    if not isinstance(schema, dict):
        raise ApiError(400, "response_format: json_schema.schema must be a JSON schema object",
                       param="response_format")
    return schema


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"stop: at most {MAX_STOP} stop strings, got {len(stops)}", param="stop")
    if any(s == "" for s in stops):
        raise ApiError(400, "stop: a stop string must not be empty", param="stop")
    return tuple(stops)


def _sampling(req: _Settings, max_tokens: int, logprobs: bool) -> Sampling:
    top_k = None if req.top_k is None or req.top_k <= 0 else req.top_k  # OpenAI/vLLM: -1 and 0 mean off
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options: only allowed with stream: true", param="stream_options")
    return Sampling(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=req.top_p, top_k=top_k, min_p=req.min_p or None,
                    presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
                    seed=req.seed, logprobs=logprobs, stop=_stops(req.stop),
                    stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=bool(req.ignore_eos),
                    json_schema=_schema(req.response_format))


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)


def _encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: send the prompt as a list of token ids", param="prompt")
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def completion_prompt(prompt: Any, tokenizer: Any) -> list[int]:
    """The token ids of a completions ``prompt``: a string, a list of ids, or a list of one of those."""
    if prompt is None:
        raise ApiError(400, "prompt: required (a string or a list of token ids)", param="prompt")
    if isinstance(prompt, list) and prompt and not _is_ids(prompt):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt: one prompt per request, got a list of {len(prompt)} (send one "
                                "request per prompt, or n= for several choices of one prompt)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _encode(tokenizer, prompt)
    if _is_ids(prompt) and prompt:
        return list(prompt)
    raise ApiError(400, "prompt: must be a string, a non-empty list of token ids, or a list of one of those",
                   param="prompt")


def _message(i: int, m: dict[str, Any]) -> dict[str, Any]:
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str):
        raise ApiError(400, f"messages[{i}].role: required, a string", param=f"messages[{i}].role")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) "
                                    "are supported", param=f"messages[{i}].content")
            parts.append(part["text"])
        content = "\n".join(parts)
    elif content is None and role == "assistant":
        content = ""
    elif not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content: a string or a list of text parts", param=f"messages[{i}].content")
    out = {"role": "system" if role == "developer" else role, "content": content}  # OpenAI's new name for it
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    for key, value in m.items():  # a message sent back as it came (refusal: null, tool_calls: null) is fine
        if key not in ("role", "content", "name") and value not in (None, [], {}):
            raise ApiError(400, f"messages[{i}].{key}: not supported", param=f"messages[{i}].{key}")
    return out


def chat_prompt(messages: list[dict[str, Any]], tokenizer: Any) -> list[int]:
    """The token ids of ``messages`` through the tokenizer's chat template (with the assistant's turn
    opened). The rendered text is encoded without the tokenizer's special tokens when it already starts
    with the BOS string (a template that writes it), with them otherwise (one BOS either way)."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise ApiError(400, "this model's tokenizer has no chat template; use /v1/completions", param="messages")
    msgs = [_message(i, m) for i, m in enumerate(messages)]
    try:
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    except Exception as err:  # jinja's TemplateError ("roles must alternate", ...) and its kin
        raise ApiError(400, f"messages: the chat template refused them: {err}", param="messages") from err
    bos = getattr(tokenizer, "bos_token", None)
    return _encode(tokenizer, text, add_special_tokens=not (bos and text.startswith(bos)))


def _submit(engine: Any, prompt: list[int], sampling: Sampling, n: int) -> Any:
    try:
        return engine.submit(prompt, sampling, n)
    except Refused as err:
        raise ApiError(400, str(err), param=err.param) from err
    except Busy as err:
        if err.shutting_down:
            raise ApiError(503, str(err), type="server_error", code="shutting_down",
                           headers={"Retry-After": "5"}) from err
        raise ApiError(429, str(err), type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from err


# ---- job events -> OpenAI responses ------------------------------------------------------------------


class _Tokens:
    """Each token's text and bytes for logprobs (cached per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, i: int) -> tuple[str, list[int]]:
        if i not in self.cache:
            tok, raw = self.tokenizer, None
            text = str(i) if tok is None else tok.decode([i], skip_special_tokens=False)
            if tok is not None and hasattr(tok, "decode_bytes"):
                raw = tok.decode_bytes([i])  # the byte tokenizer: the token's own byte
            raw = raw or text.encode("utf-8")
            if "\ufffd" in text:  # part of a character: OpenAI's 'bytes:' spelling
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self.cache[i] = (text, list(raw))
        return self.cache[i]

    def offset(self, ids: list[int]) -> int:
        """The length of the text of ``ids`` (whole characters)."""
        if not ids or self.tokenizer is None:
            return 0
        return len(self.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd"))


def _completion_logprobs(tokens: _Tokens, before: list[int], ids: list[int], lps: list[float], top: int) -> dict:
    """OpenAI's completions ``logprobs`` of ``ids`` (after ``before``, the choice's earlier tokens):
    each token's text offset is the length of the text decoded before it."""
    offsets = [tokens.offset([*before, *ids[:j]]) for j in range(len(ids))]
    strs = [tokens(i)[0] for i in ids]
    return {"tokens": strs, "token_logprobs": lps, "text_offset": offsets,
            "top_logprobs": [{s: lp} for s, lp in zip(strs, lps, strict=True)] if top > 0 else None}


def _chat_logprobs(tokens: _Tokens, ids: list[int], lps: list[float], top: int) -> dict:
    content = []
    for i, lp in zip(ids, lps, strict=True):
        s, raw = tokens(i)
        entry = {"token": s, "logprob": lp, "bytes": raw}
        content.append({**entry, "top_logprobs": [entry] if top > 0 else []})
    return {"content": content, "refusal": None}


class _Choice:
    def __init__(self) -> None:
        self.text, self.ids, self.lps = [], [], []
        self.finish: str | None = None
        self.error: str | None = None

    def add(self, ev: JobEvent) -> None:
        self.text.append(ev.text)
        self.ids += ev.token_ids
        self.lps += list(ev.logprobs or [])
        if ev.finish_reason is not None:
            self.finish, self.error = ev.finish_reason, ev.error


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _JobStream(StreamingResponse):
    """A streamed response that cancels its job however the response ends (a client that goes away
    cancels the streaming task: its rows are freed at once)."""

    def __init__(self, content: AsyncIterator[str], job: Any, done: Callable[[], bool]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job, self.done = job, done

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.done():
                self.job.cancel()


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _cancel_on_disconnect(request: Request, job: Any) -> None:
    """Cancel ``job`` when the client of a non-streamed request goes away (the body is read already:
    the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


@dataclass(frozen=True)
class _Call:
    """How to answer one accepted request."""

    endpoint: str
    chat: bool
    n: int
    prompt_tokens: int
    t0: float  # its arrival (perf_counter)
    top: int  # top_logprobs asked (only the sampled token is listed)
    logprobs: bool
    include_usage: bool
    stream: bool
    model: str


def _include_usage(req: _Settings) -> bool:
    return bool(req.stream_options is not None and req.stream_options.include_usage)


# ---- metrics ---------------------------------------------------------------------------------------------


class HttpStats:
    """What the HTTP layer counts itself: responses by endpoint and status, and the time from each
    request's arrival to its first token (a cumulative histogram; the engine keeps recent values only)."""

    def __init__(self) -> None:
        self.responses: dict[tuple[str, str], int] = {}
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0

    def count(self, endpoint: str, status: int) -> None:
        key = (endpoint, str(status))
        self.responses[key] = self.responses.get(key, 0) + 1

    def first_token(self, seconds: float) -> None:
        self.ttft[next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))] += 1
        self.ttft_sum += seconds

    def collect(self) -> Iterable[Any]:
        c = CounterMetricFamily("speculate_http_responses", "HTTP responses by endpoint and status",
                                labels=["endpoint", "status"])
        for (endpoint, status), v in sorted(self.responses.items()):
            c.add_metric([endpoint, status], v)
        yield c
        cum, buckets = 0, []
        for b, k in zip([*map(str, TTFT_BUCKETS), "+Inf"], self.ttft, strict=True):
            cum += k
            buckets.append((b, cum))
        yield HistogramMetricFamily("speculate_time_to_first_token_seconds",
                                    "time from a request's arrival to its first token", buckets=buckets,
                                    sum_value=self.ttft_sum)


class EngineCollector(Collector):
    """Prometheus metrics read from ``engine.metrics()`` (and the HTTP layer's :class:`HttpStats`) at
    each scrape."""

    def __init__(self, engine: Any, http: HttpStats | None = None) -> None:
        self.engine, self.http = engine, http

    def collect(self) -> Iterable[Any]:
        if self.http is not None:
            yield from self.http.collect()
        m = self.engine.metrics()

        def num(key: str) -> float | None:
            v = m.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        for key, name, doc in (
                ("requests_total", "speculate_requests", "requests submitted to the engine"),
                ("requests_finished", "speculate_requests_finished", "requests finished"),
                ("requests_refused", "speculate_requests_refused", "requests refused by the engine"),
                ("tokens_generated_total", "speculate_generated_tokens", "tokens generated"),
                ("prompt_tokens_total", "speculate_prompt_tokens", "prompt tokens read"),
                ("target_calls_total", "speculate_target_calls", "target model calls"),
                ("drafted_total", "speculate_drafted_tokens", "tokens drafted"),
                ("accepted_total", "speculate_accepted_tokens", "drafted tokens accepted"),
                ("rounds_total", "speculate_rounds", "rounds of drafting and verification (the whole batch)"),
                ("errors_total", "speculate_errors", "faults (a round or an admission that raised)")):
            if num(key) is not None:
                yield CounterMetricFamily(name, doc, value=num(key))
        for key, name, doc in (
                ("requests_running", "speculate_requests_running", "requests running"),
                ("requests_waiting", "speculate_requests_waiting", "requests in the queue"),
                ("batch_size", "speculate_batch_size", "rows running now"),
                ("tokens_per_second", "speculate_tokens_per_second", "recent throughput, tokens/s"),
                ("lookahead", "speculate_lookahead", "drafts per round now")):
            if num(key) is not None:
                yield GaugeMetricFamily(name, doc, value=num(key))
        drafted, accepted = num("drafted_total"), num("accepted_total")
        rate = num("acceptance_rate")
        if rate is None and drafted and accepted is not None:
            rate = accepted / drafted
        if rate is not None:
            yield GaugeMetricFamily("speculate_acceptance_rate", "accepted / drafted tokens", value=rate)
        per_call = num("tokens_per_target_call")
        calls, tokens = num("target_calls_total"), num("tokens_generated_total")
        if per_call is None and calls and tokens is not None:
            per_call = tokens / calls
        if per_call is not None:
            yield GaugeMetricFamily("speculate_tokens_per_target_call", "tokens a row gains per target call "
                                    "(1 without speculation)", value=per_call)
        counts = [int(c) for c in m.get("accepted_length_counts") or []]
        if counts:
            cum, buckets = 0, []
            for k, c in enumerate(counts):
                cum += c
                buckets.append((str(float(k)), cum))
            buckets.append(("+Inf", cum))
            yield HistogramMetricFamily("speculate_accepted_length", "drafts accepted per row-round",
                                        buckets=buckets, sum_value=float(sum(k * c for k, c in enumerate(counts))))
        recent = sorted(float(t) for t in m.get("ttft_seconds") or [])
        if recent:
            g = GaugeMetricFamily("speculate_recent_time_to_first_token_seconds",
                                  "time to first token in the engine, quantiles of recent requests",
                                  labels=["quantile"])
            for q in (0.5, 0.9, 0.99):
                g.add_metric([str(q)], recent[min(len(recent) - 1, math.ceil(q * len(recent)) - 1)])
            yield g


# ---- the app -----------------------------------------------------------------------------------------------


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "constrained-str"})


def _invalid(errors: list[Any]) -> ApiError:
    """The first of pydantic's (or FastAPI's) validation errors as a 400 naming the field."""
    if not errors:
        return ApiError(400, "invalid request")
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ())]
    if loc[:1] == ["body"]:
        loc = loc[1:]
    for i, part in enumerate(loc):  # pydantic names the member of a union it tried: not a field
        if i and ("[" in part or part in _TYPE_TAGS):
            loc = loc[:i]
            break
    if e.get("type") == "json_invalid":
        why = (e.get("ctx") or {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON ({why})" if why else "the request body is not "
                        "valid JSON")
    if not loc or e.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return ApiError(400, "the request body must be a JSON object")
    field = loc[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
    given = e.get("input")
    shown = "" if e.get("type") == "missing" else f" (got {json.dumps(given)[:80]})" if _jsonable(given) else ""
    msg = "required" if e.get("type") == "missing" else e.get("msg", "invalid")
    return ApiError(400, f"{field}: {msg}{shown}", param=loc[0])


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


def make_app(engine: Any) -> FastAPI:
    """The OpenAI-compatible app over ``engine`` (a started :class:`~.engine.Engine`).

    ``/health`` answers 503 once the engine is no longer ``running`` (shutting down) or
    ``app.state.draining`` is set (``server.serve`` sets it on a shutdown signal)."""
    app = FastAPI(title="speculate", version=_version(), docs_url=None, redoc_url=None)
    app.state.engine, app.state.draining = engine, False
    created = int(time.time())
    tokens = _Tokens(getattr(engine, "tokenizer", None))
    http = HttpStats()
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine, http))

    def draining() -> bool:
        return bool(app.state.draining or not getattr(engine, "running", True))

    def respond(err: ApiError, endpoint: str) -> JSONResponse:
        http.count(endpoint, err.status)
        return _error_response(err)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return respond(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:  # path parameters
        return respond(_invalid(list(exc.errors())), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = ApiError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        if exc.status_code == 404:
            err.message = f"no route {request.method} {request.url.path} (see GET /v1/models; POST /v1/completions, " \
                          "/v1/chat/completions)"
        return respond(err, "other")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return respond(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"),
                       request.url.path)

    def check_model(name: str | None) -> str:
        if name is not None and name != engine.model_name:
            raise ApiError(404, f"The model `{name}` does not exist (this server serves `{engine.model_name}`)",
                           param="model", code="model_not_found")
        return engine.model_name

    @app.get("/health")
    async def health() -> JSONResponse:
        if draining():
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "speculate"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        check_model(name)
        return model_card()

    async def run(request: Request, job: Any, call: _Call) -> Response:
        endpoint, chat, n, top, logprobs, name = call.endpoint, call.chat, call.n, call.top, call.logprobs, call.model
        include_usage, t0 = call.include_usage, call.t0
        kind = "chat.completion" if chat else "text_completion"
        rid = ("chatcmpl-" if chat else "cmpl-") + str(getattr(job, "id", uuid.uuid4().hex))
        now = int(time.time())
        choices = [_Choice() for _ in range(n)]
        first = [True]

        def seen(ev: JobEvent) -> None:
            if first[0] and ev.token_ids:
                first[0] = False
                http.first_token(time.perf_counter() - t0)
            choices[ev.index].add(ev)

        def done() -> bool:
            return all(c.finish is not None for c in choices)

        def usage() -> dict[str, int]:  # the prompt counted once (OpenAI's), the engine's count of new tokens
            return _usage(call.prompt_tokens, int(getattr(job, "completion_tokens", sum(len(c.ids) for c in choices))))

        if not call.stream:
            watch = asyncio.ensure_future(_cancel_on_disconnect(request, job))
            try:
                async for ev in job.stream():
                    seen(ev)
            finally:
                watch.cancel()
                if not done():
                    job.cancel()
            failed = [c.error or "the engine failed" for c in choices if c.finish == "error"]
            if failed:
                raise ApiError(500, f"generation failed: {failed[0]}", type="server_error")
            out = []
            for i, c in enumerate(choices):
                lp = None
                if logprobs:
                    lp = (_chat_logprobs(tokens, c.ids, c.lps, top) if chat
                          else _completion_logprobs(tokens, [], c.ids, c.lps, top))
                text = "".join(c.text)
                body = ({"message": {"role": "assistant", "content": text, "refusal": None}} if chat
                        else {"text": text})
                out.append({"index": i, **body, "logprobs": lp, "finish_reason": c.finish})
            http.count(endpoint, 200)
            return JSONResponse({"id": rid, "object": kind, "created": now, "model": name, "choices": out,
                                 "usage": usage()})

        sent: list[list[int]] = [[] for _ in range(n)]  # each choice's tokens streamed so far
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            c = {"id": rid, "object": chunk_kind, "created": now, "model": name, "choices": [choice]}
            if include_usage:
                c["usage"] = None
            return c

        async def events() -> AsyncIterator[str]:
            if chat:
                for i in range(n):
                    yield _sse(chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}))
            async for ev in job.stream():
                seen(ev)
                if not (ev.text or ev.finish_reason or (logprobs and ev.token_ids)):
                    continue
                lp = None
                if logprobs and ev.token_ids:
                    lps = list(ev.logprobs or [])
                    if chat:
                        lp = _chat_logprobs(tokens, ev.token_ids, lps, top)
                    else:
                        lp = _completion_logprobs(tokens, sent[ev.index], ev.token_ids, lps, top)
                        sent[ev.index] += ev.token_ids
                body = {"delta": {"content": ev.text} if ev.text else {}} if chat else {"text": ev.text}
                yield _sse(chunk({"index": ev.index, **body, "logprobs": lp, "finish_reason": ev.finish_reason}))
                if ev.finish_reason == "error":
                    err = ApiError(500, f"generation failed: {ev.error or 'the engine failed'}", type="server_error")
                    yield _sse(err.body())
            if include_usage:
                yield _sse({"id": rid, "object": chunk_kind, "created": now, "model": name, "choices": [],
                            "usage": usage()})
            yield "data: [DONE]\n\n"

        http.count(endpoint, 200)
        return _JobStream(events(), job, done)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        t0 = time.perf_counter()
        req = await _parse(request, CompletionRequest)
        name = check_model(req.model)
        _refuse_extras(req)
        if req.echo:
            raise ApiError(400, "echo: only false is supported (the response holds the new text alone)",
                           param="echo", code="unsupported_parameter")
        n = req.n or 1
        if req.best_of is not None and req.best_of != n:
            raise ApiError(400, f"best_of: only best_of == n is supported (every sampled choice is returned, "
                                f"none is ranked), got best_of={req.best_of}, n={n}", param="best_of",
                           code="unsupported_parameter")
        prompt = completion_prompt(req.prompt, engine.tokenizer)
        sampling = _sampling(req, 16 if req.max_tokens is None else req.max_tokens, req.logprobs is not None)
        job = _submit(engine, prompt, sampling, n)
        return await run(request, job, _Call("/v1/completions", False, n, len(prompt), t0, req.logprobs or 0,
                                             req.logprobs is not None, _include_usage(req), bool(req.stream), name))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        t0 = time.perf_counter()
        req = await _parse(request, ChatCompletionRequest)
        name = check_model(req.model)
        _refuse_extras(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        n = req.n or 1
        prompt = chat_prompt(req.messages, engine.tokenizer)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if limit is None:  # OpenAI's default: up to the context's end
            limit = default_chat_tokens(engine, len(prompt))
        sampling = _sampling(req, limit, bool(req.logprobs))
        job = _submit(engine, prompt, sampling, n)
        return await run(request, job, _Call("/v1/chat/completions", True, n, len(prompt), t0, req.top_logprobs or 0,
                                             bool(req.logprobs), _include_usage(req), bool(req.stream), name))

    return app


def default_chat_tokens(engine: Any, prompt_len: int) -> int:
    """``max_tokens`` of a chat request that sets none: up to the end of the model's context (its
    learned positions, else the length it was trained on, ``max_position_embeddings``; else
    :data:`DEFAULT_CHAT_TOKENS`), less the tokens the engine may draft past it."""
    context = getattr(engine, "max_context", None)
    gen = getattr(engine, "generator", None)
    if context is None and gen is not None:
        from ..models.facts import text_config

        cfg = text_config(gen.target.config)
        context = next((v for v in (getattr(cfg, a, None) for a in ("n_positions", "max_position_embeddings"))
                        if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    if context is None:
        return DEFAULT_CHAT_TOKENS
    slack = int(getattr(engine, "k_max", 0)) + 1
    return max(1, int(context) - prompt_len - slack)


def _version() -> str:
    from speculate import __version__

    return __version__
