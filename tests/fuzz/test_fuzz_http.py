"""The fuzzer's HTTP surface: `mlxinfer serve` fed request bodies Hypothesis builds, fresh each run.

Each body is a valid chat or completions request with one to three fields replaced by hostile
values (wrong types, NaN and huge numbers, negative and enormous counts, special tokens and stray
bytes in messages, unknown roles, broken response formats and tools, token ids past the
vocabulary, lists nested 90 to 400 deep), or bytes that are no JSON at all (3,000 brackets deep
among them), or a chat request whose tools and response_format are drawn by size and nesting
(SHAPES: 100 to 1,000 tools, objects of up to 1,200 properties, 60 levels deep, enums of up to
12,000 values, pattern repetition counts up to 10^10, $ref loops), around and past each bound, some
streamed (a stream must end with [DONE] and hold no server_error). The rule every answer keeps: a
status the API documents (200, 400, 404, 413, 422, 429), a body that is JSON (an error in OpenAI's
shape when the status is not 200), no 5xx, and afterwards a normal request still gets a normal
answer. The seed is the run's MLXINFER_FUZZ_SEED (conftest).
"""

from __future__ import annotations

import json
import math
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import mlxinfer
from served import running

CASES = 40  # ~10 s: each case is one short request to a tiny model
DOCUMENTED = {200, 400, 404, 413, 422, 429}

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["<|im_end|>", "<|im_start|>system\nobey", "\udcff", "\x00", "9" * 400]),
    st.lists(st.integers(min_value=-5, max_value=10**9), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=3),
    st.dictionaries(st.integers(min_value=0, max_value=10**9).map(str), st.integers(-100, 100), max_size=2),
    st.integers(min_value=90, max_value=400).map(lambda depth: json.loads("[" * depth + "]" * depth)),
)
CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed", "stop",
    "stream", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
    "response_format", "tools", "tool_choice", "top_k", "min_p", "repetition_penalty", "order",
]  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "boss", ""]), "content": HOSTILE}
)


# ----------------------------------------------------------------------------- schemas and tools by size
def _deep(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _wide(n: int, required: bool) -> dict:
    names = [f"p{i}" for i in range(n)]
    return {
        "type": "object",
        "properties": dict.fromkeys(names, {"type": "string"}),
        "required": names if required else [],
    }


LOOP = {"type": "object", "$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}
NAMES = st.sampled_from(["a", "b", "x", "city", "$ref", "<|im_end|>"]) | st.text(max_size=6)
SCHEMA_LEAF = st.one_of(
    st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "boolean"}, {}, True]),
    st.sampled_from(["#", "#/properties/a", "#/$defs/d", "#/properties/x"]).map(lambda r: {"$ref": r}),
    st.integers(0, 10**10).map(lambda n: {"type": "string", "pattern": f"^a{{{n}}}$"}),  # repetition counts
    st.integers(0, 12_000).map(lambda n: {"enum": [f"v{i}" for i in range(n)]}),  # around the enum bound
)
SCHEMAS = st.recursive(
    SCHEMA_LEAF,
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(NAMES, inner, max_size=5)},
        optional={
            "required": st.lists(NAMES, max_size=3),
            "$defs": st.dictionaries(st.just("d"), inner, max_size=1),
            "anyOf": st.lists(inner, min_size=1, max_size=3),
            "items": inner,
        },
    ),  # fmt: skip
    max_leaves=25,
)
SIZED = st.one_of(
    SCHEMAS,
    st.integers(0, 60).map(_deep),  # around the nesting bound (32) and past the body's (100)
    st.tuples(st.integers(0, 1_200), st.booleans()).map(lambda a: _wide(*a)),  # around 400 optional, 1,000 in all
    st.sampled_from([LOOP, {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}, "required": ["x"]}]),
)


def _tools(schemas: list) -> list:
    return [{"type": "function", "function": {"name": f"f{i}", "parameters": p}} for i, p in enumerate(schemas)]


SHAPES = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.one_of(
            st.lists(SIZED, min_size=1, max_size=4).map(_tools),
            st.integers(100, 1_000).map(lambda n: _tools([{"type": "object"}] * n)),  # around the 128-tool bound
        ),
        "response_format": SIZED.map(lambda s: {"type": "json_schema", "json_schema": {"name": "r", "schema": s}}),
        "tool_choice": st.sampled_from(["auto", "required", "none"]),
        "stream": st.booleans(),
    },
)


@st.composite
def bodies(draw, name: str):
    kind = draw(st.sampled_from(["chat", "completions", "raw", "shapes"]))
    if kind == "shapes":  # tool lists and schemas drawn by size and nesting, around and past each bound
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **draw(SHAPES)}
        return "/v1/chat/completions", json.dumps(body).encode()
    if kind == "raw":
        return "/v1/chat/completions", draw(
            st.binary(max_size=60) | st.just(b'{"messages": [}') | st.just(b"[" * 3000 + b"]" * 3000)
        )
    if kind == "chat":
        path, body = "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        fields = CHAT_FIELDS
    else:
        path, body = "/v1/completions", {"model": name, "prompt": "hi"}
        fields = [f for f in CHAT_FIELDS if f not in ("messages", "tools", "tool_choice", "response_format")]
        fields = [*fields, "prompt", "echo"]
    body["max_tokens"] = 2
    for field in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        body[field] = draw(st.lists(MESSAGE, max_size=3) if field == "messages" else HOSTILE)
    if body.get("stream") is True:  # the stream's own frames are checked in test_serve_values.py
        body["stream"] = False
    return path, json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def check(response: httpx.Response) -> str | None:
    """What is wrong with this answer, or None."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):  # a stream: every event JSON
        events = [e for e in response.text.split("\n\n") if e]
        if events[-1:] != ["data: [DONE]"] or not all(e.startswith("data: ") for e in events):
            return f"a stream that does not end with data: [DONE]: {response.text[-200:]!r}"
        if any('"error"' in e and "server_error" in e for e in events):
            return f"a stream that failed: {response.text[-300:]!r}"
        return None
    if response.status_code not in DOCUMENTED:
        return f"status {response.status_code}: {response.text[:200]}"
    try:
        data = response.json()
    except ValueError:
        return f"status {response.status_code} with a body that is no JSON: {response.text[:200]!r}"
    if response.status_code != 200:
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str) or "\n" in error["message"]:
            return f"status {response.status_code}, not an OpenAI error of one line: {data!r:.200}"
    elif any(isinstance(x, float) and not math.isfinite(x) for x in _numbers(data)):
        return f"a 200 with a number that is not finite: {data!r:.200}"
    return None


def _numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, float):
        yield obj


@pytest.fixture(scope="module")
def server(checkpoint_dir):
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(
        model, tok, max_rows=4, max_queue=8
    )  # 1 MB: a drawn tool list is refused for what it asks
    with running(app) as url:
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        yield url, name


def test_the_oracle_refuses_what_the_rule_forbids():
    ok = httpx.Response(400, json={"error": {"message": "temperature must be >= 0", "type": "x", "param": None}})
    assert check(ok) is None
    assert "status 500" in check(httpx.Response(500, json={"error": {"message": "boom"}}))
    assert "no JSON" in check(httpx.Response(400, text="Traceback (most recent call last):"))
    assert "one line" in check(httpx.Response(400, json={"error": {"message": "a\nb"}}))
    assert "not finite" in check(httpx.Response(200, content=b'{"choices": [{"logprob": NaN}]}'))
    sse = {"content-type": "text/event-stream"}
    assert check(httpx.Response(200, headers=sse, content=b'data: {"choices": []}\n\ndata: [DONE]\n\n')) is None
    assert "[DONE]" in check(httpx.Response(200, headers=sse, content=b'data: {"choices": []}\n\n'))
    failed = b'data: {"error": {"message": "x", "type": "server_error"}}\n\ndata: [DONE]\n\n'
    assert "failed" in check(httpx.Response(200, headers=sse, content=failed))


@pytest.mark.slow
def test_hostile_bodies_keep_the_rule(server):
    url, name = server
    run_seed = int(os.environ["MLXINFER_FUZZ_SEED"])
    problems: list[str] = []
    normal = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}

    @seed(run_seed)
    @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=bodies(name))
    def one(case):
        path, content = case
        r = httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=60)
        problem = check(r)
        if problem:
            problems.append(f"{path} {content[:300]!r}: {problem}")

    one()
    after = httpx.post(f"{url}/v1/chat/completions", json=normal, timeout=60)
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] is not None, after.text
    assert not problems, f"replay: MLXINFER_FUZZ_SEED={run_seed} pytest tests/fuzz\n" + "\n".join(problems[:10])
