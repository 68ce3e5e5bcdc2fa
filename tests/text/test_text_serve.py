"""``speculate serve``'s HTTP layer (domains/text/serving/app.py, server.py, cli.py): a real uvicorn server
on 127.0.0.1 (a free port, a background thread) over the continuous-batching engine, driven by the real
``openai`` client and by raw httpx. Greedy text over HTTP is the generator's own; streamed chunks join to
the non-streamed text; seeds repeat; stop strings cut; every error comes back in OpenAI's shape with its
status; a client that goes away frees its rows.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from speculate.domains.text import ByteTokenizer, SpeculativeGenerator
from speculate.domains.text.conformance import tiny_llama
from speculate.domains.text.examples.pair import load_pair
from speculate.domains.text.serving import Busy, Engine, JobEvent, Refused
from speculate.domains.text.serving.server import running_server

openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

PROMPT = "class Foo:\n    def __init__(self"
CHAT = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
LOOKAHEAD = 3  # fixed: a seed gives the same tokens alone or in a batch


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.fixture(scope="module")
def served(pair):
    """(base URL, engine, tokenizer): the embedded pair behind a real server."""
    target, draft, tok = pair
    engine = Engine(SpeculativeGenerator(target, draft, lookahead=LOOKAHEAD, tokenizer=tok), max_batch=8,
                    max_queue=32).start()
    with running_server(engine) as url:
        yield url, engine, tok
    engine.shutdown(timeout=5)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0, timeout=60)


def _reference(text: str, m: int) -> str:
    """The greedy text of the generator alone (a pair of its own: nothing shared with the server)."""
    target, draft, tok = load_pair()
    gen = SpeculativeGenerator(target, draft, lookahead=LOOKAHEAD, tokenizer=tok)
    return gen.generate(text, temperature=0, max_new_tokens=m).texts[0]


def _wait_idle(engine: Engine, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = engine.metrics()
        if (m["requests_running"] == 0 and m["requests_waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


# ---- what works ----------------------------------------------------------------------------------------


def test_models_and_health(served, client):
    url = served[0]
    assert [m.id for m in client.models.list().data] == ["speculate"]
    assert client.models.retrieve("speculate").id == "speculate"
    r = httpx.get(url + "/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_greedy_completion_is_the_generators_text(served, client):
    _, _, tok = served
    m = 16
    want = _reference(PROMPT, m)
    out = client.completions.create(model="speculate", prompt=PROMPT, max_tokens=m, temperature=0)
    (choice,) = out.choices
    assert choice.text == want and choice.finish_reason == "length" and choice.index == 0
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == "speculate"
    n_prompt = len(tok(PROMPT).input_ids)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (n_prompt, m, n_prompt + m)
    by_ids = client.completions.create(model="speculate", prompt=tok(PROMPT).input_ids, max_tokens=m, temperature=0)
    one = client.completions.create(model="speculate", prompt=[PROMPT], max_tokens=m, temperature=0)
    assert by_ids.choices[0].text == one.choices[0].text == want


def test_chat_through_the_embedded_template(served, client):
    _, _, tok = served
    out = client.chat.completions.create(model="speculate", messages=CHAT, max_tokens=8, temperature=0)
    (choice,) = out.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length") and out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou write Python.<|im_end|>\n") and text.endswith("assistant\n")
    assert out.usage.prompt_tokens == len(tok(text).input_ids)  # one BOS, then the template's bytes
    parts = [{"type": "text", "text": "def fib(n):"}]
    again = client.chat.completions.create(model="speculate", messages=[CHAT[0], {"role": "user", "content": parts}],
                                           max_completion_tokens=8, temperature=0)
    assert again.choices[0].message.content == choice.message.content


def test_streamed_chunks_join_to_the_text(served, client):
    full = client.completions.create(model="speculate", prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="speculate", prompt=PROMPT, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])

    chat = client.chat.completions.create(model="speculate", messages=CHAT, max_tokens=12, temperature=0)
    deltas = list(client.chat.completions.create(model="speculate", messages=CHAT, max_tokens=12, temperature=0,
                                                 stream=True))
    assert deltas[0].choices[0].delta.role == "assistant" and deltas[0].object == "chat.completion.chunk"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == chat.choices[0].message.content
    assert deltas[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_n_choices_and_seeds(client):
    kw = dict(model="speculate", prompt=PROMPT, max_tokens=8, temperature=1.0)
    out = client.completions.create(n=3, seed=7, **kw)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert 3 <= out.usage.completion_tokens <= 3 * 8
    again = client.completions.create(n=3, seed=7, **kw)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]
    texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(1, 6)}
    assert len(texts) > 1  # different seeds differ somewhere
    chunks = list(client.completions.create(n=2, seed=7, stream=True, **kw))
    joined = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(2)]
    assert joined == [c.text for c in out.choices[:2]]


def test_stop_strings_end_the_text_before_them(client):
    ref = client.completions.create(model="speculate", prompt=PROMPT, max_tokens=40, temperature=0).choices[0].text
    stop = ref[10:13]
    assert len(stop) == 3
    out = client.completions.create(model="speculate", prompt=PROMPT, max_tokens=40, temperature=0,
                                    stop=[stop, "\x00never"])
    assert out.choices[0].text == ref[: ref.find(stop)] and out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="speculate", prompt=PROMPT, max_tokens=40, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ref[: ref.find(stop)]


def test_logprobs_are_the_sampled_tokens_under_the_targets_law(served, client, pair):
    _, _, tok = served
    target = pair[0]
    out = client.completions.create(model="speculate", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=3,
                                    logprobs=1)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(v <= 0 and math.isfinite(v) for v in lp.token_logprobs)
    assert [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    ids = tok(PROMPT).input_ids
    first = tok(out.choices[0].text, add_special_tokens=False).input_ids[0]  # byte tokens: text -> ids
    with torch.no_grad():
        law = target(torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)
    assert lp.token_logprobs[0] == pytest.approx(float(law[first]), abs=1e-4)

    chat = client.chat.completions.create(model="speculate", messages=CHAT, max_tokens=5, logprobs=True,
                                          top_logprobs=2, seed=1)
    content = chat.choices[0].logprobs.content
    assert len(content) == 5
    for e in content:
        assert e.logprob <= 0 and [(t.token, t.logprob) for t in e.top_logprobs] == [(e.token, e.logprob)]
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or e.token.startswith("bytes:")


def test_metrics_in_prometheus_text(served, client):
    url, engine, _ = served
    client.completions.create(model="speculate", prompt=PROMPT, max_tokens=8, temperature=0)
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in parser.text_string_to_metric_families(r.text)}
    for name in ("speculate_requests", "speculate_requests_running", "speculate_requests_waiting",
                 "speculate_tokens_per_second", "speculate_acceptance_rate", "speculate_tokens_per_target_call",
                 "speculate_accepted_length", "speculate_time_to_first_token_seconds", "speculate_http_responses",
                 "speculate_generated_tokens", "speculate_target_calls"):
        assert name in fams, name
    value = {s.name: s.value for f in fams.values() for s in f.samples if not s.labels}
    m = engine.metrics()
    assert value["speculate_requests_total"] >= 1 and value["speculate_requests_waiting"] == m["requests_waiting"]
    assert 0 <= value["speculate_acceptance_rate"] <= 1 and value["speculate_tokens_per_target_call"] >= 1
    hist = {s.labels["le"]: s.value for s in fams["speculate_accepted_length"].samples if s.name.endswith("_bucket")}
    assert hist["+Inf"] == sum(m["accepted_length_counts"]) and list(hist.values()) == sorted(hist.values())
    ttft = {s.name: s.value for s in fams["speculate_time_to_first_token_seconds"].samples if not s.labels}
    assert ttft["speculate_time_to_first_token_seconds_count"] >= 1


# ---- errors ------------------------------------------------------------------------------------------------


def test_errors_come_back_in_openais_shape(client):
    c = client.completions.create
    kw = dict(model="speculate", prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError) as nf:
        c(**{**kw, "model": "gpt-4"})
    assert nf.value.code == "model_not_found" and nf.value.body["param"] == "model"
    for extra, param in (({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"),
                         ({"presence_penalty": 3}, "presence_penalty"),
                         ({"frequency_penalty": -2.5}, "frequency_penalty"),
                         ({"logprobs": 6}, "logprobs"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                         ({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"), ({"best_of": 3}, "best_of"),
                         ({"logit_bias": {"5": 1.0}}, "logit_bias"), ({"seed": -1}, "seed"),
                         ({"max_tokens": 0}, "max_tokens"), ({"prompt": ["a", "b"]}, "prompt"),
                         ({"prompt": [1, 2, 100000]}, "prompt"), ({"extra_body": {"frobnicate": 1}}, "frobnicate")):
        with pytest.raises(openai.BadRequestError) as e:
            c(**{**kw, **extra})
        assert e.value.body["param"] == param, (extra, e.value.body)
        assert e.value.body["type"] == "invalid_request_error"
        assert param in e.value.body["message"], e.value.body
    ch = client.chat.completions.create
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    for extra, param in (({"tools": [tool]}, "tools"), ({"top_logprobs": 2}, "top_logprobs"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                          "response_format"),
                         ({"response_format": {"type": "xml"}}, "response_format"),
                         ({"response_format": {"type": "json_schema", "json_schema": {
                             "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nosuch"}}}}}},
                          "response_format"),
                         ({"messages": image}, "messages[0].content")):
        with pytest.raises(openai.BadRequestError) as e:
            ch(**{"model": "speculate", "messages": msgs, "max_tokens": 2, **extra})
        assert e.value.body["param"] == param, (extra, e.value.body)
    # accepted and ignored: user; response_format "text" is the default
    ok = ch(model="speculate", messages=msgs, max_tokens=2, user="me", response_format={"type": "text"})
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_malformed_requests_over_raw_http(served):
    url = served[0]
    for body, param in ((b"{bad json", None), (b"", None), (b"[1, 2]", None), (b'{"prompt": "x", "max_tokens": "5"}',
                         "max_tokens"), (b'{"prompt": "x", "stream": "yes"}', "stream"),
                        (b'{"prompt": "x", "temperature": NaN}', "temperature"),
                        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
                        (b'{"max_tokens": 2}', "prompt")):
        r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
    r = httpx.post(url + "/v1/completions", content=b"{bad json")
    assert "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # no content type (curl -d sends a form's): still read as JSON
    r = httpx.post(url + "/v1/completions", content=b'{"prompt": "x", "max_tokens": 1}')
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


class _Stub:
    """An engine that answers every request with ``exc`` raised, or with a job replaying ``events``
    (the HTTP mapping alone: Busy, Refused, a crash, a choice that ends in an error)."""

    model_name, running = "stub", True
    tokenizer = ByteTokenizer()

    def __init__(self, exc: Exception | None = None, events: list[JobEvent] = ()) -> None:
        self.exc, self.events = exc, list(events)

    def submit(self, prompt, sampling, n=1):
        if self.exc is not None:
            raise self.exc
        events = self.events

        class _Job:
            id, n, prompt_tokens, completion_tokens = "stub", 1, len(prompt), 1

            async def stream(self):
                for ev in events:
                    yield ev

            def cancel(self):
                pass

        return _Job()

    def metrics(self) -> dict:
        return {}


def test_busy_refused_and_crashes_map_to_429_503_400_500():
    for exc, status, kind in ((Busy("the queue is full"), 429, openai.RateLimitError),
                              (Busy("shutting down", shutting_down=True), 503, openai.InternalServerError),
                              (Refused("too long", "max_tokens"), 400, openai.BadRequestError),
                              (RuntimeError("boom"), 500, openai.InternalServerError)):
        stub = _Stub(exc)
        with running_server(stub, log_level="critical") as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            with pytest.raises(kind) as e:
                c.completions.create(model="stub", prompt="x")
            assert e.value.status_code == status and str(exc) in e.value.body["message"]
            if status == 400:
                assert e.value.body["param"] == "max_tokens"
            if status in (429, 503):
                assert "retry-after" in e.value.response.headers
            stub.running = status != 503
            assert httpx.get(url + "/health").status_code == (503 if status == 503 else 200)


def test_a_choice_that_fails_is_an_error_not_a_text():
    stub = _Stub(events=[JobEvent(0, [65], "A"), JobEvent(0, [], "", None, "error", "the model raised")])
    with running_server(stub) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="the model raised"):
            c.completions.create(model="stub", prompt="x")
        with pytest.raises(openai.APIError, match="the model raised"):
            list(c.completions.create(model="stub", prompt="x", stream=True))


# ---- clients that go away, bursts --------------------------------------------------------------------------


def test_a_client_that_disconnects_frees_its_job(served):
    url, engine, _ = served
    body = {"model": "speculate", "prompt": PROMPT, "max_tokens": 3000, "temperature": 1.0}
    before = engine.metrics()["tokens_generated_total"]
    with httpx.Client(timeout=30) as h, h.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        assert engine.metrics()["requests_running"] == 1
    m = _wait_idle(engine, timeout=10)
    assert m["requests_running"] == 0 and m["batch_size"] == 0
    assert m["tokens_generated_total"] - before < 3000  # cancelled long before its budget
    # a non-streamed request whose client gives up (a read timeout closes the connection)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    m = _wait_idle(engine, timeout=10)
    assert m["requests_running"] == 0 and m["batch_size"] == 0


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama with the byte tokenizer (no chat template) behind a server with a short queue."""
    tok = ByteTokenizer()
    engine = Engine(SpeculativeGenerator(tiny_llama(vocab=len(tok)), "ngram", lookahead=2, tokenizer=tok),
                    max_batch=4, max_queue=16, model_name="tiny").start()
    with running_server(engine) as url:
        yield url, engine
    engine.shutdown(timeout=5)


def test_a_tokenizer_without_a_chat_template_refuses_chat(tiny):
    r = httpx.post(tiny[0] + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "this model's tokenizer has no chat template; use /v1/completions"


def test_a_burst_of_200_against_a_queue_of_16_is_answered(tiny):
    url, engine = tiny

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as h:
            rs = await asyncio.gather(*(h.post(url + "/v1/completions", json={"prompt": f"p{i}", "max_tokens": 4,
                                                                            "temperature": 0}) for i in range(200)))
        for r in rs:
            if r.status_code == 200:
                assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            else:
                assert r.json()["error"]["code"] == "queue_full"
        return [r.status_code for r in rs]

    codes = asyncio.run(burst())
    assert len(codes) == 200 and set(codes) <= {200, 429}, set(codes)
    assert codes.count(200) >= 16 and codes.count(429) >= 1, (codes.count(200), codes.count(429))
    m = _wait_idle(engine)
    assert m["requests_running"] == 0 and m["requests_waiting"] == 0
    assert m["requests_finished"] >= codes.count(200)


# ---- the command -------------------------------------------------------------------------------------------


def test_speculate_serve_command(tmp_path):
    """``speculate serve`` on the embedded pair: up, one chat answer, then SIGINT drains and exits 0."""
    from speculate.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--port", "70000"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "log.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "speculate", "serve", "--port", str(port), "--threads", "1",
                             "--device", "cpu", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "log.txt").read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, (tmp_path / "log.txt").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_serve_without_fastapi_names_the_extra(monkeypatch, capsys):
    from speculate.domains.text.serving.cli import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi -> ImportError
    assert main([]) == 1
    assert "pip install 'speculate[serve]'" in capsys.readouterr().err


def test_response_format_gives_text_that_matches_the_schema(client):
    """Structured output: every choice's text is JSON matching the schema (sampled, several choices),
    and json_object gives a JSON object."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"], "additionalProperties": False}
    out = client.completions.create(model="speculate", prompt="def f(x):\n    return ", max_tokens=60, n=3,
                                    temperature=1.0, seed=5,
                                    extra_body={"response_format": {"type": "json_schema",
                                                                    "json_schema": {"name": "r", "schema": schema}}})
    for ch in out.choices:
        assert ch.finish_reason == "stop", ch
        jsonschema.validate(json.loads(ch.text), schema)
    chat = client.chat.completions.create(model="speculate", messages=[{"role": "user", "content": "data?"}],
                                          max_tokens=40, temperature=0.7, seed=1,
                                          response_format={"type": "json_object"})
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content), dict)
    else:  # out of tokens inside the object: a prefix of one
        assert chat.choices[0].message.content.startswith("{")
