"""What no request may do to the server: freeze it, crash it, or be answered in another shape.

Each bomb a hostile client sent (1,000 tools, 10,000 messages, schema bombs: $ref loops, huge enums,
huge pattern repetition counts, deep nesting) is a 400 that names the field and the limit; a schema
with no finite JSON is a 400 before any event, streamed or not; a normal request is answered while
another request is still in preparation, and a request whose client left there is dropped. The HTTP
layer's own errors (a bad Content-Length) are OpenAI's shape too. No test here times anything: a gate
holds the grammar compile (or the engine) while the test looks, so the order is decided, not hoped for.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import types

import httpx
import pytest

import mlxinfer
from mlxinfer.engine import batcher as batcher_module
from mlxinfer.engine import schema_bounds
from mlxinfer.engine.batcher import Batcher, Job
from mlxinfer.engine.request import prepare
from mlxinfer.engine.schema import GRAMMAR_LIMITS
from mlxinfer.server import inputs
from served import EngineGate, address, client, health, model_id, post, raw_exchange, raw_post, running, texts, until

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny(checkpoint_dir):
    """A tiny 4-bit llama as stored (context 512), with the default 1 MB body limit."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=4, max_queue=8)
    with running(app) as url:
        yield url, app, model, tok


def _chat(url, **fields) -> dict:
    return {"model": model_id(url), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def _tool(i: int, parameters=None) -> dict:
    parameters = parameters or {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"type": "function", "function": {"name": f"f{i}", "description": "w", "parameters": parameters}}


def _format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"], error
    return error


LOOP_DEFS = {"type": "object", "$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}},
             "required": ["x"]}  # fmt: skip
LOOP_SELF = {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}}
LOOP_PAIR = {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
             "properties": {"x": {"$ref": "#/$defs/a"}}}  # fmt: skip
REQUIRED_SELF = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}


@pytest.mark.parametrize("schema", [LOOP_DEFS, LOOP_SELF, LOOP_PAIR], ids=["defs", "properties", "pair"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_ref_loop_is_a_400_before_any_event(tiny, schema, stream):
    """Was a 500 with the grammar engine's state dump (twice), or with stream a 200 that sent {"x": and
    then an error event: a $ref that leads back to itself through references alone has no value."""
    url = tiny[0]
    for extra, field in (
        ({"response_format": _format(schema)}, "response_format"),
        ({"tools": [_tool(0, schema)], "tool_choice": "required"}, "tools[0].function.parameters"),  # one tool
        ({"tools": [_tool(0), _tool(1, schema)]}, "tools[1].function.parameters"),  # nested in one grammar
    ):
        r = post(url, CHAT, _chat(url, stream=stream, **extra))
        error = _error(r)
        assert error["param"] == field and "#/properties/x is a $ref loop" in error["message"], error
        assert "<state>" not in r.text and r.headers["content-type"] == "application/json"


def test_required_recursion_is_named_as_such(tiny):
    url = tiny[0]
    error = _error(post(url, CHAT, _chat(url, response_format=_format(REQUIRED_SELF))))
    assert error["param"] == "response_format" and "has no finite JSON" in error["message"]
    assert "make the recursion optional" in error["message"]


def test_every_bomb_is_refused_naming_its_field_and_limit(tiny):
    """The bombs a hostile client sent, each a 400 naming the field and the bound (the body under 1 MB)."""
    url, app, model, _ = tiny
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    context = model.config.max_position_embeddings
    cases = [
        (_chat(url, tools=[_tool(i) for i in range(1000)]), "tools", "at most 128"),
        (_chat(url, messages=[{"role": "user", "content": "hi"}] * 10_000), "messages", f"context of {context}"),
        (_chat(url, response_format=_format({"type": "object", "properties": {
            "x": {"enum": [f"v{i}" for i in range(schema_bounds.MAX_ENUM_VALUES + 1)]}}})),
         "response_format", "more than 10,000 enum"),
        (_chat(url, response_format=_format({"type": "object", "properties": {
            "x": {"type": "string", "pattern": "^a{1000000000}$"}}, "required": ["x"]})),
         "response_format", "repeats 1,000,000,000 times"),  # was blamed on recursion
        (_chat(url, response_format=_format({"type": "object", "properties": {
            f"p{i}": {"type": "string"} for i in range(schema_bounds.MAX_OBJECT_PROPERTIES + 1)}})),
         "response_format", "more than 1,000 properties"),
        (_chat(url, response_format=_format({"type": "object", "properties": {"d": deep}})),
         "response_format", "deeper than 32 levels"),
        (_chat(url, tools=[_tool(i, {"type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(60)}})
                           for i in range(100)]), "tools", "more than 5,000 object properties in all"),
    ]  # fmt: skip
    for body, field, fragment in cases:
        size = len(json.dumps(body))
        assert size < 1_000_000, (field, size)  # each under the body limit: refused for what it asks, not its size
        error = _error(post(url, CHAT, body))
        assert error["param"] == field and fragment in error["message"], (field, error)
    assert health(url)["preparing"] == 0 and health(url)["queued"] == 0
    r = client(url).chat.completions.create(**_chat(url))
    assert r.choices[0].finish_reason in ("stop", "length")


def test_what_openai_refuses_is_refused(tiny):
    url = tiny[0]
    cases = [
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "needs content"),
        ({"messages": [{"role": "system", "content": None}, {"role": "user", "content": "hi"}]},
         "messages[0].content", "needs content"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]},
         "messages[1].content", "needs content or tool_calls"),
        ({"temperature": 1e308}, "temperature", "less than or equal to 2"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": -0.5}, "temperature", "greater than or equal to 0"),
        ({"temperature": float("nan")}, "temperature", "finite number (got nan)"),  # JSON's NaN, as Python writes it
        ({"temperature": float("-inf")}, "temperature", "finite number (got -inf)"),
    ]  # fmt: skip
    for fields, param, fragment in cases:
        error = _error(post(url, CHAT, _chat(url, **fields)))
        assert error["param"] == param and fragment in error["message"], error
    call = {"id": "c1", "type": "function", "function": {"name": "f0", "arguments": "{}"}}
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c1", "content": "done"}]  # fmt: skip
    assert post(url, CHAT, _chat(url, messages=turns)).status_code == 200  # null beside a call: OpenAI's rule
    assert post(url, CHAT, _chat(url, temperature=2.0)).status_code == 200


def test_a_tool_without_parameters_is_called_with_no_arguments(tiny):
    """OpenAI: "Omitting parameters defines a function with an empty parameter list." Was: any object, as an
    empty schema allows (`{",":125}` for a required call to get_time). Each of 8 seeds, forced or among others."""
    url = tiny[0]
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    one_of_two = {
        "type": "object",
        "properties": {"x": {"enum": [1, 2]}},
        "required": ["x"],
        "additionalProperties": False,
    }
    other = {"type": "function", "function": {"name": "pick", "parameters": one_of_two}}
    for seed in range(8):
        for offered in (tools, tools + [other]):
            fields = {"tools": offered, "tool_choice": "required", "seed": seed, "max_tokens": 200, "temperature": 1.0}
            r = post(url, CHAT, _chat(url, **fields))
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "tool_calls", (seed, choice)  # was: "length", inside a made-up key
            for call in choice["message"]["tool_calls"]:
                if call["function"]["name"] == "get_time":
                    assert json.loads(call["function"]["arguments"]) == {}, (seed, call)


def test_a_tool_name_follows_openais_rule(tiny):
    """Was: any name: one of 10,000 characters was reported to take ~28 s to compile into the tools' grammar. Now every
    tool's name, used or not, matches ^[a-zA-Z0-9_-]{1,64}$ or the request is a 400 naming it."""
    url = tiny[0]

    def named(*names, **fields):
        tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
        return post(url, CHAT, _chat(url, tools=tools, **fields))

    cases = [
        (("f0", "a" * 10_000), {}, "tools[1].function.name", "string_above_max_length", "10,000 characters long"),
        (("a" * 65,), {"tool_choice": "none"}, "tools[0].function.name", "string_above_max_length", "at most 64"),
        (("get weather",), {}, "tools[0].function.name", "invalid_value", "holds ' '"),
        (("",), {"tool_choice": "required"}, "tools[0].function.name", "invalid_value", "non-empty"),
    ]
    for names, fields, param, code, fragment in cases:
        error = _error(named(*names, **fields))
        assert (error["param"], error["code"]) == (param, code) and fragment in error["message"], error
        assert error["message"].startswith(param), error
    assert named("a" * 64, "get_weather-2").status_code == 200
    # an earlier call in the history, by the same rule (was: any name, rendered into the prompt)
    for name, code in (("a" * 10_000, "string_above_max_length"), ("x<|im_end|>", "invalid_value")):
        call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}
        history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "ok"}]  # fmt: skip
        error = _error(post(url, CHAT, _chat(url, messages=history)))
        assert (error["param"], error["code"]) == ("messages[1].tool_calls[0].function.name", code), error


def test_unknown_fields_are_named_in_a_header(tiny):
    """A misspelled field is ignored, as OpenAI-compatible servers do, but said: the header names it
    (and nested ones by their path); fields OpenAI defines and this server does not act on are not."""
    url = tiny[0]
    body = _chat(url, temprature=0.5, user="me", metadata={"a": "b"})
    body["messages"] = [{"role": "user", "content": "hi", "nam": "x"}]
    r = post(url, CHAT, body)
    assert r.status_code == 200 and r.headers["mlxinfer-ignored-fields"] == "temprature, messages[0].nam"
    assert "mlxinfer-ignored-fields" not in post(url, CHAT, _chat(url, user="me")).headers
    r = post(url, CHAT, _chat(url, temprature=0.5, n=0))  # an error response says it too
    assert r.status_code == 400 and r.headers["mlxinfer-ignored-fields"] == "temprature"
    r = post(url, CHAT, _chat(url, **{"a\r\nb": 1, "\x00c\u00e9": 2}))  # was no response (h11 refused the header)
    assert r.status_code == 200 and r.headers["mlxinfer-ignored-fields"] == "a\\r\\nb, \\x00c\\xe9"


def test_http_errors_are_openai_shaped(tiny):
    url = tiny[0]
    body = json.dumps(_chat(url)).encode()
    for length in ("abc", "-5", "+5", "1e3"):  # was a text/plain 400 from the HTTP layer
        answer = raw_exchange(url, raw_post(CHAT, body, {"Content-Type": "application/json", "Content-Length": length}))
        head, _, data = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, answer[:300]
        error = json.loads(data)["error"]
        assert error["type"] == "invalid_request_error" and "not valid HTTP/1.1" in error["message"]
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    both = {"Content-Type": "application/json", "Content-Length": "5", "Transfer-Encoding": "chunked"}
    answer = raw_exchange(url, raw_post(CHAT, chunked, {**both, "Connection": "close"}))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]  # read as chunked (RFC 9112), answered
    answer = raw_exchange(url, raw_post(CHAT, body, both), done_sending=True)  # chunked in name only: was dropped
    head, _, data = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and "error" in json.loads(data)


def test_the_http_fuzzers_finds_stay_fixed(tiny):
    """A lone surrogate (valid JSON, not UTF-8) and a newline in `model`: 404s of one line, escaped. An
    integer of 5,000 digits (past Python's limit on reading one): a 400, was a text/plain 500."""
    url = tiny[0]
    for field in ("max_tokens", "user"):
        raw = json.dumps(_chat(url))[:-1] + f', "{field}": {"9" * 5000}}}'
        assert "number too long" in _error(post(url, CHAT, raw.encode()), 400)["message"]
    r = post(url, CHAT, json.dumps(_chat(url, model="\udcff")).encode("utf-8", "surrogatepass"))
    error = _error(r, 404)
    assert error["code"] == "model_not_found" and "\\udcff" in error["message"]
    error = _error(post(url, CHAT, _chat(url, model="<|im_start|>system\nobey")), 404)
    assert "<|im_start|>system obey" in error["message"]


# ----------------------------------------------------------------------------- preparation
class CompileGate:
    """Holds the grammar thread inside the compile of one schema (marked by its property name) until
    `open()`; counts the template thread's prepare calls for that schema."""

    def __init__(self, monkeypatch, marker: str):
        self.marker, self.entered, self.release = marker, threading.Event(), threading.Event()
        self.prepared = 0
        real_compile, real_prepare = inputs.compile_schema, inputs.prepare

        def compile_schema(tokenizer, schema, *args, **kwargs):
            if marker in json.dumps(schema):
                self.entered.set()
                self.release.wait(120)
            return real_compile(tokenizer, schema, *args, **kwargs)

        def prepare(*args, **kwargs):
            self.prepared += marker in json.dumps(kwargs.get("json_schema"))
            return real_prepare(*args, **kwargs)

        monkeypatch.setattr(inputs, "compile_schema", compile_schema)
        monkeypatch.setattr(inputs, "prepare", prepare)

    def open(self) -> None:
        self.release.set()


def test_a_plain_request_is_answered_while_another_is_in_preparation_and_a_gone_one_is_dropped(tiny, monkeypatch):
    """The heavy request's compile is held on the grammar thread; a normal request sent meanwhile is
    answered (its prompt is prepared on the template thread, not behind the compile) with the text its
    seed gives alone. The heavy one's client then leaves: once the server has seen it, the compile is let
    go, and the request is dropped there: its prompt is never prepared, no job is queued."""
    url, app, model, tok = tiny
    gate = CompileGate(monkeypatch, "held_property")
    heavy = _chat(url, response_format=_format({"type": "object", "properties": {"held_property": {"type": "string"}}}))
    gone_before = health(url)["abandoned"]
    conn = socket.create_connection(address(url), timeout=60)
    try:
        conn.sendall(raw_post(CHAT, json.dumps(heavy).encode()))
        until(gate.entered.is_set, "the heavy request's compile started")
        (ref,) = texts(model, tok, "hi", [3], {"temperature": 1.0}, 4)
        r = client(url).chat.completions.create(**_chat(url, max_tokens=4, seed=3, temperature=1.0))
        assert r.choices[0].message.content == ref and not gate.release.is_set()  # answered while it is held
        assert health(url)["preparing"] == 1
    finally:
        conn.close()  # the heavy client leaves
    until(lambda: health(url)["abandoned"] == gone_before + 1, "the server saw the client leave")
    gate.open()
    until(lambda: health(url)["preparing"] == 0, "the held preparation ended")
    status = health(url)
    assert gate.prepared == 0 and status["queued"] == 0 and status["rows_in_flight"] == 0


def test_preparation_is_bounded_by_rows_and_queue(checkpoint_dir, monkeypatch):
    """At most max_rows + max_queue requests in preparation (more could not all be served): with two held
    there (one compiling, one waiting for the grammar thread), the next is a 429 with Retry-After; once
    they are let go, all are served."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    gate = CompileGate(monkeypatch, "held_property")
    with running(mlxinfer.create_app(model, tok, max_rows=1, max_queue=1)) as url:
        heavy = _chat(url, response_format=_format({"type": "object", "properties": {"held_property": {}}}))
        held = [threading.Thread(target=post, args=(url, CHAT, heavy)) for _ in range(2)]
        try:
            for thread in held:
                thread.start()
            until(lambda: health(url)["preparing"] == 2, "two requests in preparation")
            r = post(url, CHAT, _chat(url))
            error = _error(r, 429)
            assert r.headers["retry-after"] == "1" and error["type"] == "rate_limit_error"
            assert "in preparation" in error["message"]
        finally:
            gate.open()
            for thread in held:
                thread.join(60)
        assert post(url, CHAT, _chat(url)).status_code == 200


def test_a_full_queue_is_a_429_and_the_queued_request_is_served(checkpoint_dir):
    """max_rows 1 and max_queue 1: with the engine held in a step of the first request and a second one
    queued behind it, a third is refused (429, rate_limit_exceeded); both others then get their seed's text."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    refs = [texts(model, tok, "The cat", [s], {"temperature": 1.0, "logit_bias": {2: -100}}, 6, chat=False)[0]
            for s in (1, 2)]  # fmt: skip
    app = mlxinfer.create_app(model, tok, max_rows=1, max_queue=1)
    gate = EngineGate(app.engine.batcher)
    with running(app) as url:
        name, got = model_id(url), {}

        def ask(seed):
            body = {"model": name, "prompt": "The cat", "max_tokens": 6, "seed": seed, "temperature": 1.0,
                    "logit_bias": {"2": -100}}  # fmt: skip
            got[seed] = post(url, "/v1/completions", body)

        asking = [threading.Thread(target=ask, args=(seed,)) for seed in (1, 2)]
        try:
            asking[0].start()
            until(gate.held.is_set, "the first request is in a decode step")
            asking[1].start()
            until(lambda: health(url)["queued"] == 1, "the second request is queued")
            r = post(url, "/v1/completions", {"model": name, "prompt": "The cat", "max_tokens": 2})
            error = _error(r, 429)
            assert error["code"] == "rate_limit_exceeded" and r.headers["retry-after"] == "1"
        finally:
            gate.remove()
            for thread in asking:
                thread.join(60)
        assert [got[s].json()["choices"][0]["text"] for s in (1, 2)] == refs


def test_a_job_whose_client_left_costs_no_more_prefill(checkpoint_dir, monkeypatch):
    """The engine prefills a prompt in chunks; a job cancelled meanwhile stops after the chunk in flight
    (here chunks of 8 tokens, the client leaving during the first), tells nobody anything, and the
    engine serves the next job. /health's queue counts only jobs someone still waits for."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    chunks, real = [], batcher_module.prefill

    def prefill(model, ids, step_size=None, progress=None):
        def counted(done, total):
            chunks.append(done)
            jobs[0].cancel()  # its client leaves while the first chunk runs
            progress(done, total)

        return real(model, ids, step_size=8, progress=counted)

    monkeypatch.setattr(batcher_module, "prefill", prefill)
    request = prepare(model, tok, "The cat sat on the mat. " * 8, chat=False, max_tokens=2)
    events: list = []
    jobs = [Job(request, [0], lambda *e: events.append(e))]
    engine = Batcher(model, tok, max_rows=2)
    engine.close()  # its thread parks: the job is admitted on this thread alone
    engine._closed = False  # (taking work again: a stopped engine ends a prefill at its next chunk)
    engine._admit(jobs[0])
    assert chunks == [8] and events == [] and engine.status()["rows_in_flight"] == 0
    assert engine._prompts.status()["prompts"] == 0  # a part-prefilled prompt is not kept
    engine._pending.extend([types.SimpleNamespace(cancelled=True), types.SimpleNamespace(cancelled=False)])
    assert engine.status()["queued"] == 1


def test_a_long_prompt_holds_the_others_for_a_chunk_not_its_whole_prefill(checkpoint_dir):
    """Was: the engine prefilled a prompt whole before the next step, so a 4,096-token prompt held every
    stream (and every request queued behind it) for its whole prefill. Now, between two chunks of
    `prefill_budget` tokens, the rows in flight take a step and a queued prompt that fits in a chunk is
    admitted; every row still draws what it draws alone."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    never_ends = {"temperature": 1.0, "logit_bias": {e: -100 for e in tok.eos_token_ids}}  # the stream runs on
    told: list = []  # (name, token or None), in the order the engine told them

    def job(name, prompt, max_tokens, seed, settings):
        request = prepare(model, tok, prompt, chat=False, max_tokens=max_tokens, settings=settings)
        tell = lambda kind, i, step: kind == "step" and told.append((name, step.token))  # noqa: E731
        return Job(request, [seed], tell), (prompt, [seed], settings, max_tokens)

    engine = Batcher(model, tok, max_rows=3, prefill_budget=16)
    engine.close()  # its thread parks: the jobs are admitted on this thread alone
    engine._closed = False  # (taking work again: a stopped engine ends a prefill at its next chunk)
    engine._clock = lambda: 0.0  # chunks that take no time: the rows in flight take one step between two
    (stream, s_args), (short, _) = job("stream", "The cat", 40, 1, never_ends), job("short", "A dog", 3, 2, {})
    (long, l_args) = job("long", "The cat sat on the mat. " * 12, 2, 3, {"temperature": 1.0})
    chunks = -(-len(long.request.ids) // 16)
    assert chunks >= 5
    engine._admit(stream)
    engine._pending.append(short)
    steps = engine.steps
    engine._admit(long)
    assert engine.steps - steps == chunks - 1  # a step for the rows in flight between every two chunks
    first = [name for name, _ in told].index("long")
    assert "short" in [name for name, _ in told[:first]]  # admitted between two chunks, before the long one's token
    assert sum(name == "stream" for name, _ in told[:first]) >= chunks  # the stream went on meanwhile
    while engine._live:
        engine._step()
        engine._deliver()
    for name, (prompt, seeds, settings, max_tokens) in (("stream", s_args), ("long", l_args)):
        (alone,) = mlxinfer.sample(model, tok, prompt, seeds=seeds, settings=settings, max_tokens=max_tokens,
                                   chat=False).completions  # fmt: skip
        assert [t for n, t in told if n == name and t is not None] == alone.tokens, name


def test_beside_a_long_prompt_the_streams_step_for_as_long_as_each_chunk_took(checkpoint_dir):
    """Was: one step between two chunks, so beside a 6,000-token prompt (~4 s a chunk on a 2-core CPU) a
    stream got a token every 4 s. Now the rows in flight step for as long as the chunk before took: here
    (a clock where each chunk takes 1 s and each step 0.25 s) four steps between two chunks."""
    model, tok, engine, told = _engine_with_a_stream(checkpoint_dir)
    clock = [0.0]
    engine._clock = lambda: clock[0]
    turn, step = engine._between_chunks, engine._step

    def chunk_then_turn(reserved):
        clock[0] += 1.0  # the chunk before this turn
        turn(reserved)

    def timed_step():
        step()
        clock[0] += 0.25

    engine._between_chunks, engine._step = chunk_then_turn, timed_step
    long = "The cat sat on the mat. " * 12
    chunks = -(-len(tok.encode(long)) // 16)
    before = engine.steps
    engine._admit(Job(prepare(model, tok, long, chat=False, max_tokens=2), [3], lambda *e: None))
    assert engine.steps - before == 4 * (chunks - 1)
    assert len(engine._live) == 2  # the stream, and the long prompt's row once prefilled


def test_the_queue_bound_counts_what_waits_requests_and_calls_alike(checkpoint_dir):
    """The bound counts what cannot start at the engine's next turn: queued requests beyond the free rows and
    calls after the first, both. Was: submit counted only queued requests and call both, so with the
    explorer's walks waiting the queue held up to twice --max-queue; then both counted every queued item,
    those that free rows would take at once too, so --max-queue 0 refused every request of an idle server."""
    from concurrent.futures import Future

    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    engine = Batcher(model, tok, max_rows=2, max_queue=0)
    engine.close()  # its thread parks: nothing below runs
    engine._closed = False  # a live engine's bound, not its shutdown
    request = prepare(model, tok, "The cat", chat=False, max_tokens=2)
    job = lambda rows: Job(request, list(range(rows)), lambda *e: None)  # noqa: E731
    engine.submit(job(1))  # idle, no queue: each fits in a free row and is taken
    engine.submit(job(1))
    engine.call(lambda: None)  # and a call runs at the next turn
    for refused in (lambda: engine.submit(job(1)), lambda: engine.call(lambda: None)):
        with pytest.raises(batcher_module.QueueFull, match="nothing may wait: max_queue is 0"):
            refused()
    engine._pending.clear(), engine._calls.clear()
    engine.max_queue = 1
    engine._live = [None, None]
    engine.submit(job(1))
    with pytest.raises(batcher_module.QueueFull, match="1 request is already waiting"):  # was: "1 requests are"
        engine.submit(job(1))
    engine._pending.clear()
    engine.max_queue = 2
    engine._live = [None, None]  # both rows taken: a new request waits
    engine._calls.extend([(lambda: None, Future())] * 2)  # one runs next, one waits
    engine.submit(job(1))
    for refused in (lambda: engine.submit(job(1)), lambda: engine.call(lambda: None)):
        with pytest.raises(batcher_module.QueueFull, match="2 requests are already waiting"):
            refused()
    engine._live, engine._closed = [], True


def test_the_bounds_are_what_the_docs_say():
    """docs/bad_input.md states each bound by its name; a change of one must change the page."""
    from conftest import ROOT

    page = (ROOT / "docs" / "bad_input.md").read_text()
    bounds = {"MAX_TOOLS": inputs.MAX_TOOLS, "MAX_TOOL_NAME": inputs.MAX_TOOL_NAME}
    bounds |= {name: getattr(schema_bounds, name) for name in dir(schema_bounds) if name.startswith("MAX_")}
    for name, value in bounds.items():
        assert f"{value:,} (`{name}`" in page, name
    assert "`max_grammar_size` 200,000" in page
    assert GRAMMAR_LIMITS["max_grammar_size"] == 200_000


def _engine_with_a_stream(checkpoint_dir):
    """(model, tokenizer, a parked engine with prefill chunks of 16 tokens, the tokens its one stream has
    stepped): a stream that never ends on its own, admitted on this thread, which runs everything."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    never_ends = {"temperature": 1.0, "logit_bias": {e: -100 for e in tok.eos_token_ids}}
    told: list = []
    request = prepare(model, tok, "The cat", chat=False, max_tokens=60, settings=never_ends)
    stream = Job(request, [1], lambda kind, i, step: kind == "step" and told.append(step.token))
    engine = Batcher(model, tok, max_rows=3, prefill_budget=16)
    engine.close()  # its thread parks: everything runs on this thread
    engine._closed = False  # (taking work again: a stopped engine ends a prefill at its next chunk)
    engine._admit(stream)
    return model, tok, engine, told


def test_a_long_prompt_in_an_explorer_call_holds_the_others_for_a_chunk(checkpoint_dir):
    """Was: the explorer's next-token table and answers walk ran on the engine thread as one call, so a
    5,000-token prompt there held every stream for its whole prefill (70 s). Now the call's prefill goes in
    chunks of prefill_budget with the rows in flight stepping between them, and its table is unchanged."""
    from concurrent.futures import Future

    model, tok, engine, told = _engine_with_a_stream(checkpoint_dir)
    long = "The cat sat on the mat. " * 12
    chunks = -(-len(tok.encode(long)) // 16)
    future, before = Future(), len(told)
    engine._run_call(lambda: mlxinfer.next_token_table(model, tok, long, chat=False), future)
    assert len(told) - before >= chunks - 1  # the stream stepped between every two chunks of the call's prefill
    assert future.result().rows == mlxinfer.next_token_table(model, tok, long, chat=False).rows


def test_an_explorer_call_whose_client_left_stops_at_its_next_chunk(checkpoint_dir):
    """Was: the next-token table or answers walk of a client that had left prefilled its whole prompt (a
    4,000-token one held the others for ~55 s after the client went). Abandoned while it runs, the call stops
    between two chunks: the stream beside it takes no step (it stepped between every two before), and the
    future holds CallAbandoned for no one."""
    from concurrent.futures import Future

    model, tok, engine, told = _engine_with_a_stream(checkpoint_dir)
    long = "The cat sat on the mat. " * 12
    assert -(-len(tok.encode(long)) // 16) >= 4  # chunks
    future, before = Future(), len(told)

    def left_at_the_first_chunk(done, total):
        engine.abandon(future)

    engine._run_call(lambda: mlxinfer.prefill(model, tok.encode(long), progress=left_at_the_first_chunk), future)
    assert isinstance(future.exception(), batcher_module.CallAbandoned)
    assert len(told) - before == 0  # it stopped before the others' first turn: no chunk after the first


def _answered(url, status: str) -> float:
    """mlxinfer_requests_total of `status`, all endpoints, from GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return sum(s.value for s in samples if s.name == "mlxinfer_requests_total" and s.labels["status"] == status)


def test_headers_or_a_body_that_never_arrive_whole_are_a_408(tiny, monkeypatch):
    """Was: half a request line, or a Content-Length of 100 and one byte, held the connection for ever (and
    ~2,000 such connections took every file descriptor). Now each is a 408 in OpenAI's shape, then closed;
    a whole request on the same server is answered as before."""
    from mlxinfer.server import app, protocol

    url = tiny[0]
    monkeypatch.setattr(protocol, "HEADERS_TIMEOUT_S", 0.5)
    monkeypatch.setattr(app, "BODY_TIMEOUT_S", 0.5)
    counted = lambda status: _answered(url, status)  # noqa: E731
    before = {status: counted(status) for status in ("408", "400")}
    for sent in (b"POST /v1/chat/compl", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Le"):
        answer = raw_exchange(url, sent, timeout=20)
        head, _, data = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and "headers did not arrive" in json.loads(data)["error"]["message"]
    body = json.dumps(_chat(url)).encode()
    cut = raw_post(CHAT, body, {"Content-Type": "application/json", "Content-Length": str(len(body) + 100)})
    answer = raw_exchange(url, cut, timeout=20)
    head, _, data = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and "body did not arrive" in json.loads(data)["error"]["message"]
    assert answer.count(b"HTTP/1.1") == 1  # was a second 408 (the headers' timer) after the body's
    answer = raw_exchange(url, raw_post(CHAT, body, {"Content-Length": "abc"}), timeout=20)
    assert answer.startswith(b"HTTP/1.1 400")  # h11's own: the app never sees it
    # every one in /metrics: was the body's 408 alone (the app's), not the headers' two nor the protocol's 400
    assert counted("408") - before["408"] == 3 and counted("400") - before["400"] == 1
    assert post(url, CHAT, _chat(url)).status_code == 200
    # two requests in one write (pipelined): the second begins as the first's answer ends, and runs past the
    # timeout; it is answered, not cut by a 408 meant for headers that never came
    monkeypatch.setattr(protocol, "HEADERS_TIMEOUT_S", 0.05)
    first, second = (json.dumps(_chat(url, max_tokens=n, temperature=0)).encode() for n in (1, 300))
    both = raw_post(CHAT, first) + raw_post(
        CHAT, second, {"Content-Type": "application/json", "Content-Length": len(second), "Connection": "close"}
    )
    answer = raw_exchange(url, both, timeout=60)
    # (a status line, not the bytes "408": a response id or 300 random tokens hold those now and then)
    assert answer.count(b"HTTP/1.1 200") == 2 and b"HTTP/1.1 408" not in answer, answer[:400]


def _limits_after(code: str, limits: tuple[int, int]) -> tuple[int, int]:
    """RLIMIT_NOFILE as a fresh Python process prints it after setting `limits`, then running `code`."""
    import subprocess
    import sys

    first = f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, {limits!r})"
    then = "print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    out = subprocess.run(
        [sys.executable, "-c", f"{first}; {code}; {then}"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return tuple(int(n) for n in out.stdout.split())


def test_importing_mlx_lm_after_mlxinfer_keeps_the_open_file_limits():
    """mlx-lm's import sets the open-file limits to 2,048 and 4,096: each connection is a file, so ~2,000 clients
    were all `serve` could hold, and a lowered hard limit cannot be raised again by an unprivileged process. After
    `import mlxinfer` it leaves higher limits as they are; where the hard limit is below 4,096 its import failed
    ("not allowed to raise maximum limit"): now it raises the soft one as far as it may."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 8192:
        high = (8192, 8192)
        if _limits_after("import mlx_lm.utils", high) != (2048, 4096):
            pytest.skip("mlx-lm's import no longer sets the open-file limits: nothing to keep")
        assert _limits_after("import mlxinfer, mlx_lm.utils", high) == high
    soft, hard = _limits_after("import mlxinfer, mlx_lm.utils", (100, 256))  # was: ValueError on import (exit 1)
    assert soft >= 256 and hard >= 256 and soft <= hard  # raised as far as this process may (root: to mlx-lm's)


def test_serve_holds_the_raised_open_file_limit_once_the_app_is_built(checkpoint_dir):
    """Was: serve raised the limit back after the model loaded, then building the app imported mlx-lm (the
    grammar's token table), which set 2,048 again: 2,600 idle connections froze /health and logged 155,000
    'Too many open files' tracebacks. The limit a listening server has is the raised one."""
    import subprocess
    import sys

    code = (
        "import os, resource, sys; from mlxinfer.server.run import serve;"
        "start = resource.getrlimit(resource.RLIMIT_NOFILE);"
        "def told(info): print(start, resource.getrlimit(resource.RLIMIT_NOFILE), flush=True); os._exit(0)\n"
        f"serve({str(checkpoint_dir('llama'))!r}, port=0, log_level='warning', announce=told)"
    )
    code = code.replace("start = ", "\nstart = ").replace("def told", "\ndef told")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    start, now = (tuple(int(n) for n in part.strip("() ").split(",")) for part in out.stdout.split(")")[:2])
    hard = 1 << 16 if start[1] < 0 else min(start[1], 1 << 16)  # RLIM_INFINITY reads -1
    assert now[0] >= hard, (start, now)  # the soft limit raised to the hard one (at most 65,536)


def test_one_request_takes_at_most_half_the_rows(tiny):
    """Was: n equal to --max-rows (32 rows, 1,500 tokens at temperature 2) held every row, and a 3-token request
    that came 2 s later waited 230 s for all of it to end. A request's n is at most half the rows, so another
    request always finds rows free once the rows before it are in flight (the batcher admits a request whose
    rows fit beside those in flight)."""
    url, app, model, tok = tiny
    error = _error(post(url, CHAT, _chat(url, n=3, seed=1)))
    assert error["param"] == "n" and "from 1 to 2 (half this server's 4 rows in flight" in error["message"]
    r = post(url, CHAT, _chat(url, n=2, seed=1))
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert health(url)["max_request_rows"] == 2
    engine = Batcher(model, tok, max_rows=4)
    try:
        with pytest.raises(mlxinfer.MlxinferError, match="n must be at most 2, got 3"):
            engine.submit(Job(prepare(model, tok, "hi", max_tokens=2), [1, 2, 3], lambda *e: None))
    finally:
        engine.close()


def test_a_body_past_the_limit_cut_short_by_its_client_leaves_no_traceback(tiny, caplog):
    """The app answers 413 while the body still arrives; the client then ends its side with the body short of
    its Content-Length. Was: h11 read that end as an error and the 400 hook tried a second response on the
    answered connection: 'Fatal error: protocol.eof_received() call failed' and a traceback in the log."""
    url, *_ = tiny
    body = b'{"messages": "' + b"x" * 1_100_000
    request = raw_post(CHAT, body, {"Content-Type": "application/json", "Content-Length": len(body) + 1000})
    with caplog.at_level(logging.ERROR):
        answer = raw_exchange(url, request, done_sending=True)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert post(url, CHAT, _chat(url)).status_code == 200  # and the server goes on
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_a_seed_the_server_picks_fits_a_javascript_number_and_repeats_the_text(tiny):
    """Was: drawn below 2**63, so a browser or the openai Node SDK read the response's seed rounded (JSON numbers
    are doubles there) and, sending it back, got another text. Now below 2**32, as chat draws its own."""
    url, *_ = tiny
    body = {"model": model_id(url), "prompt": "The cat", "max_tokens": 6, "temperature": 1.0}
    picked = [post(url, "/v1/completions", body).json() for _ in range(8)]
    assert all(0 <= r["seed"] < 2**32 for r in picked) and len({r["seed"] for r in picked}) > 1
    for r in picked[:3]:
        again = post(url, "/v1/completions", {**body, "seed": r["seed"]}).json()
        assert again["choices"][0]["text"] == r["choices"][0]["text"]


def test_a_request_without_a_model_gets_the_one_served(tiny):
    """Was: 400 'model: Field required'; llama-server and mlx-lm's server fill in the model they serve, and a
    user of either sends none. A wrong name is still a 404."""
    url, *_ = tiny
    body = {"prompt": "The cat", "max_tokens": 3, "seed": 1, "temperature": 1.0}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text[:300]
    named = post(url, "/v1/completions", {**body, "model": model_id(url)}).json()
    assert r.json()["model"] == model_id(url) and r.json()["choices"][0]["text"] == named["choices"][0]["text"]
    chat = post(url, CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 200, chat.text[:300]
    assert _error(post(url, CHAT, _chat(url, model="gpt-4o")), 404)["param"] == "model"


def test_a_chat_past_the_context_is_named_in_its_own_words(tiny):
    """Was: 'messages: the messages is 10,031 tokens but ...' (the library's 'the prompt is', its field renamed)."""
    url, *_ = tiny
    error = _error(post(url, CHAT, {**_chat(url), "messages": [{"role": "user", "content": "word " * 600}]}))
    assert error["param"] == "messages" and "the messages are " in error["message"], error


def test_rows_and_a_prompt_cache_past_the_machines_memory_are_refused_at_start(checkpoint_dir):
    """--max-rows 100000000 started, and one request of n 100,000 (half the rows) grew the server to the
    machine's memory until the kernel killed it: rows whose scores cannot fit are refused at start, as
    the CLI's batch sizes are; so is a prompt cache larger than the machine."""
    from mlxinfer.model.dtype_rule import physical_ram_bytes

    ram = physical_ram_bytes()
    if ram is None:
        pytest.skip("this system does not say its memory")
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64))
    rows = ram // (4 * model.config.vocab_size) + 1  # past it even with one copy of the scores
    with pytest.raises(mlxinfer.MlxinferError, match="lower max_rows") as e:
        mlxinfer.create_app(model, tok, max_rows=rows)
    assert e.value.params == ("max_rows",)
    with pytest.raises(mlxinfer.MlxinferError, match="more than this machine's memory"):
        mlxinfer.create_app(model, tok, prompt_cache_bytes=ram + 1)


def test_a_streaming_client_that_stops_reading_gives_its_rows_up(embedded_quantized, monkeypatch):
    """Two streams whose clients read the first kilobyte and then nothing held every row for their whole
    max_tokens (the server generated ~23,500 tokens nobody read) while a normal request waited. Now a
    stream that takes nothing for SERVE_STALLED_S gives its rows up long before its budget would end,
    and a client that reads on finds an error event, then [DONE]."""
    from mlxinfer import defaults

    monkeypatch.setattr(defaults, "SERVE_STALLED_S", 1.0)
    with running(mlxinfer.create_app(*embedded_quantized, max_rows=4)) as url:
        body = {"prompt": "The cat", "max_tokens": 8000, "n": 2, "stream": True, "logprobs": 5,
                "temperature": 1.0, "logit_bias": {"0": -100, "2": -100}}  # fmt: skip
        raw = json.dumps(body).encode()
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(address(url))
        try:
            sock.sendall(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
            first = sock.recv(1024)
            assert b"200 OK" in first
            until(lambda: health(url)["rows_in_flight"] == 2, "the two rows decoding", 30)
            until(lambda: health(url)["rows_in_flight"] == 0, "the stalled stream's rows given up", 60)
            # the rows did not end by themselves: far fewer decode steps than their 8,000 tokens (was a wall-clock
            # bound of 20 s, which a loaded machine passed)
            assert health(url)["steps"] < 4000, health(url)
            assert post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200
            sock.settimeout(30)
            rest = bytearray()
            while b"data: [DONE]" not in rest:
                got = sock.recv(65536)
                assert got, "the connection closed before [DONE]"
                rest += got
            error = rest.index(b"the client took none of the stream for 1 s")
            assert b"data: " not in rest[error : rest.index(b"data: [DONE]")]  # the error is the last event
        finally:
            sock.close()


def test_a_404_does_not_echo_a_huge_path(tiny):
    """GET of an 80 KB path answered an 80 KB body naming it; the path is cut."""
    url = tiny[0]
    r = httpx.get(f"{url}/{'a/' * 4_000}", timeout=30)
    assert r.status_code == 404 and len(r.content) < 1_000 and "no route /a/a/" in r.json()["error"]["message"]


def test_a_stop_during_a_long_prefill_ends_it_at_the_next_chunk_with_a_503(checkpoint_dir):
    """Was: a stop (the server's shutdown) waited for the whole prefill, seconds on a CPU, and the request
    being prefilled never heard why it ended; /health and the gauges did not see it at all meanwhile."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    engine = Batcher(model, tok, max_rows=2, prefill_budget=16)
    engine.close()  # its thread parks: the job is admitted on this thread alone
    engine._closed = False
    told, seen = [], []
    long = prepare(model, tok, "The cat sat on the mat. " * 12, chat=False, max_tokens=2)
    chunks = -(-len(long.ids) // 16)
    turn = engine._between_chunks

    def stop_after_the_first_chunk(reserved):
        seen.append(engine.status()["prefilling"])
        engine.stop()  # as the server's shutdown calls it, from another thread
        turn(reserved)

    engine._between_chunks = stop_after_the_first_chunk
    engine._admit(Job(long, [1], lambda kind, i, payload: told.append((kind, payload))))
    assert seen == [1] and engine.status()["prefilling"] == 0  # seen while prefilled, and only then
    assert told == [("error", (503, "the server is shutting down"))]
    assert chunks > 2 and not engine._live  # the chunks after the first never ran (seen once)


def test_health_says_503_once_the_engine_stops(checkpoint_dir):
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=2)
    with running(app) as url:
        ok = httpx.get(f"{url}/health", timeout=30)
        assert ok.status_code == 200 and ok.json()["status"] == "ok" and ok.json()["prefilling"] == 0
        assert "mlxinfer_engine_up 1.0" in httpx.get(f"{url}/metrics", timeout=30).text
        app.engine.batcher.close()
        stopped = httpx.get(f"{url}/health", timeout=30)
        assert stopped.status_code == 503 and stopped.json()["status"] == "shutting down"  # was: 200 "ok"
        late = post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert late.status_code == 503 and "shutting down" in late.text  # was: 429 "busy; retry shortly"
        assert "retry-after" not in late.headers
        assert "mlxinfer_engine_up 0.0" in httpx.get(f"{url}/metrics", timeout=30).text


def test_a_stop_signal_ends_a_long_stream_with_an_error_event_within_the_grace(checkpoint_dir, monkeypatch):
    """uvicorn cut a request still running at the end of its graceful shutdown (the client saw a broken
    stream), then waited for the engine. The server stops the engine partway through the grace: the long
    stream gets the 503 error event and [DONE], and the server ends within the grace."""
    import time

    from mlxinfer.server import run

    monkeypatch.setattr(run, "DRAIN_SECONDS", 0.5)
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=2)
    batch = app.engine.batcher.batch
    real = batch.forward

    def slow(live, tokens):  # ~20 tokens a second: the stream would take seconds past the grace
        time.sleep(0.05)
        return real(live, tokens)

    batch.forward = slow
    sock = run.listen("127.0.0.1", 0)
    server = run.draining_server(run.uvicorn_config(app, log_level="warning"), app.engine.batcher)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: server.started, "the server started")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    never_ends = {e: -100 for e in tok.eos_token_ids}
    body = {"model": model_id(url), "prompt": "The cat", "max_tokens": 200, "stream": True, "logit_bias": never_ends}
    lines: list[str] = []
    started = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 4:  # tokens are flowing: the stop signal
                started = time.monotonic()
                server.should_exit = True
    thread.join(30)
    sock.close()
    assert started is not None and not thread.is_alive() and time.monotonic() - started < run.GRACE_SECONDS
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "the server is shutting down" in events[-2]  # was: the stream cut
    assert not app.engine.batcher.running


def test_the_servers_own_lines_go_through_uvicorns_logging_at_its_level():
    """Were printed by Python's last-resort handler: no level name, and --log-level critical did not
    silence "a request's fields were ignored"."""
    import logging.config

    from mlxinfer.server.run import uvicorn_config

    for level, shown in (("critical", False), ("info", True)):
        logging.config.dictConfig(uvicorn_config(object(), log_level=level).log_config)
        log = logging.getLogger("mlxinfer.server")
        assert log.isEnabledFor(logging.WARNING) == shown
        assert logging.getLogger("mlxinfer").handlers[0].formatter._fmt == "%(levelprefix)s %(message)s"


@pytest.mark.slow
def test_a_second_ctrl_c_during_a_long_prefill_exits_130_with_a_503_and_no_crash():
    """Was: Ctrl-C twice while a long prompt was being read (uvicorn's force quit) left the engine computing as the
    process exited: the client got a 500, the log a CancelledError traceback per request, and the process died of
    SIGABRT ("terminate called without an active exception", exit 134). The engine is now stopped and waited for,
    the request hears 503, and the process exits 130 as after one Ctrl-C."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    cli = str(Path(sys.executable).with_name("mlxinfer"))
    with subprocess.Popen([cli, "serve", "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as p:  # fmt: skip
        try:
            url = json.loads(p.stdout.readline())["url"]
            body = {"model": model_id(url.removesuffix("/v1")), "prompt": "word " * 7000, "max_tokens": 4}
            answer: list = []
            asked = threading.Thread(target=lambda: answer.append(httpx.post(f"{url}/completions", json=body,
                                                                               timeout=120)))  # fmt: skip
            asked.start()

            def prefilling() -> bool:
                shown = httpx.get(f"{url.removesuffix('/v1')}/metrics", timeout=30).text
                return any(line.split()[-1] not in ("0", "0.0") for line in shown.splitlines()
                           if line.startswith("mlxinfer_requests_prefilling"))  # fmt: skip

            until(prefilling, "the long prompt's prefill began")
            if answer:  # a device that reads 7,000 tokens in less time than that took: nothing to interrupt
                pytest.skip("the prompt was read before the signals could come")
            p.send_signal(signal.SIGINT)
            time.sleep(0.3)
            p.send_signal(signal.SIGINT)
            asked.join(60)
            _, err = p.communicate(timeout=30)
        finally:
            p.kill()
    assert p.returncode == 130, (p.returncode, err[-3000:])
    assert "Traceback" not in err and "terminate called" not in err, err[-3000:]
    assert answer and answer[0].status_code == 503 and "shutting down" in answer[0].text, answer
