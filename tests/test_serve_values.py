"""What the server returns, value by value, against the library run alone on the same request.

Log-probabilities against `generate(..., logprobs=K)` token by token; every sampler extra and the
model's generation_config.json defaults against `sample` with the same settings and seeds (the weights
as stored: a row's bits do not depend on its batch); docs/server.md's `extra_body` example as written; the
raw server-sent events (`data: ` lines, the usage chunk, `data: [DONE]`, an error mid-stream); the
error bodies' type and code. Each reference is computed while the engine is idle.
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import redirect_stdout
from io import StringIO

import httpx
import mlx.core as mx
import pytest

import checkpoints
import mlxinfer
from conftest import ROOT
from served import EngineGate, client, health, model_id, post, running, texts, until

FRUIT = "Name one fruit."


@pytest.fixture(scope="module")
def smol(embedded):
    app = mlxinfer.create_app(*embedded, max_rows=8)
    with running(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def tiny(checkpoint_dir):
    """The tiny 4-bit llama as stored (generation_config.json: temperature 0.6, top_k 20, top_p 0.95)."""
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=8, max_queue=32)
    with running(app) as url:
        yield url, app, model, tok


# ----------------------------------------------------------------------------- log-probabilities
def test_chat_logprobs_are_generates_token_by_token(smol, embedded):
    """Every token's log-probability and its top alternatives, as generate reports them for the seed."""
    url, _ = smol
    model, tok = embedded
    ref = mlxinfer.generate(model, tok, FRUIT, max_tokens=5, seed=1, settings={"temperature": 1.0}, logprobs=3)
    r = client(url).chat.completions.create(
        model=model_id(url), messages=[{"role": "user", "content": FRUIT}], max_tokens=5, seed=1, temperature=1.0,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == ref.text and len(content) == len(ref.steps) == 5
    for entry, step in zip(content, ref.steps):
        assert entry.token == tok.decode([step.token]) and entry.logprob == pytest.approx(step.logprob, abs=1e-5)
        top = [(a.token, a.logprob) for a in entry.top_logprobs]
        assert [t for t, _ in top] == [a.text for a in step.alternatives]
        assert [v for _, v in top] == pytest.approx([a.logprob for a in step.alternatives], abs=1e-5)


def test_completion_logprobs_are_generates_token_by_token(smol, embedded):
    url, _ = smol
    model, tok = embedded
    prompt = "The capital of France is"
    ref = mlxinfer.generate(model, tok, prompt, max_tokens=4, chat=False, settings={"temperature": 0.0}, logprobs=2)
    r = client(url).completions.create(model=model_id(url), prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([s.logprob for s in ref.steps], abs=1e-5)
    for top, step in zip(lp.top_logprobs, ref.steps):
        assert top == pytest.approx({a.text: a.logprob for a in step.alternatives}, abs=1e-5)


def test_completion_logprobs_keep_the_best_of_tokens_that_print_alike(smol, embedded):
    """/v1/completions' top_logprobs is OpenAI's dict keyed by text: the parts of an emoji all print as U+FFFD.
    Was: the least probable of them won the key (the page showed the chosen token at -4.4 for its -0.88)."""
    url, _ = smol
    model, tok = embedded
    emoji = "\U0001f600 \U0001f389 \U0001f680 \U0001f44b\U0001f3fd \U0001f1eb\U0001f1f7"
    prompt = f"Emoji list: {emoji} \U0001f600 \U0001f389"
    ref = mlxinfer.generate(model, tok, prompt, max_tokens=6, chat=False, seed=4, logprobs=5)
    alike = [s for s in ref.steps if len({a.text for a in s.alternatives}) < len(s.alternatives)]
    assert alike, "the prompt must give a step whose alternatives print alike"
    body = {"model": model_id(url), "prompt": prompt, "max_tokens": 6, "seed": 4, "logprobs": 5}
    lp = post(url, "/v1/completions", body).json()["choices"][0]["logprobs"]
    for top, step in zip(lp["top_logprobs"], ref.steps):
        best = {}
        for a in step.alternatives:
            best[a.text] = max(best.get(a.text, -float("inf")), a.logprob)
        assert top == pytest.approx(best, abs=1e-5)
        assert list(top) == list(best)  # best first, as OpenAI orders them


# ----------------------------------------------------------------------------- the sampler's fields
EXTRAS = [
    {"top_k": 2},
    {"min_p": 0.3},
    {"repetition_penalty": 3.0},
    {"presence_penalty": 2.0},
    {"frequency_penalty": 2.0},
    {"temperature": 2.0, "top_p": 0.6, "order": "mlx-lm"},  # the cut before or after the temperature
]


@pytest.mark.parametrize("extra", EXTRAS, ids=lambda e: "+".join(e))
def test_each_sampler_field_gives_samples_completions(tiny, extra):
    """Four seeds with the field set, against sample with the same settings; and the field matters:
    sample without it gives other completions (so a server that dropped it would fail)."""
    url, _, model, tok = tiny
    settings = {"temperature": 1.0, **extra, "logit_bias": {2: -100}}
    ref = texts(model, tok, "The cat", [20, 21, 22, 23], settings, 12, chat=False)
    without = texts(model, tok, "The cat", [20, 21, 22, 23], {"temperature": 1.0, "logit_bias": {2: -100}}, 12,
                    chat=False)  # fmt: skip
    assert ref != without
    body = {"model": model_id(url), "prompt": "The cat", "max_tokens": 12, "seed": 20, "n": 4, "temperature": 1.0,
            **extra, "logit_bias": {"2": -100}}  # fmt: skip
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])] == ref


def test_llama_servers_names_and_top_k_minus_one_are_read_as_ours(tiny):
    """n_predict, repeat_penalty and repeat_last_n (llama-server's names) give what max_tokens,
    repetition_penalty and penalty_window give, as sample does, and are not named as ignored; the window
    matters (all tokens penalised gives other texts), and top_k -1 is off, as top_k 0 is."""
    url, _, model, tok = tiny
    seeds, base = [20, 21, 22, 23], {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    ref = texts(model, tok, "The cat", seeds, {**base, "repetition_penalty": 3.0, "penalty_window": 2}, 12, chat=False)
    assert ref != texts(model, tok, "The cat", seeds, {**base, "repetition_penalty": 3.0}, 12, chat=False)
    body = {"prompt": "The cat", "seed": 20, "n": 4, **base, "top_k": -1}
    r = post(url, "/v1/completions", {**body, "n_predict": 12, "repeat_penalty": 3.0, "repeat_last_n": 2})
    assert r.status_code == 200, r.text
    assert [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])] == ref
    assert "mlxinfer-ignored-fields" not in r.headers


def test_llama_server_and_vllm_values_are_read_or_refused_never_dropped(tiny):
    """llama.cpp's -1s (n_predict: no limit; repeat_last_n: the whole context; seed: random) are read as
    the field unset, a null OpenAI field gives way to llama-server's name, two names that differ are a
    400; vLLM's guided_json constrains a chat as response_format json_schema; what was dropped in silence
    (OpenAI's deprecated functions, vLLM's guided_choice) is a 400 naming the fix; /v1/models/{id} answers."""
    url, _, model, tok = tiny
    base = {"prompt": "The cat", "temperature": 1.0, "logit_bias": {"2": -100}}

    def done(body, path="/v1/completions"):
        r = post(url, path, body)
        assert r.status_code == 200, r.text
        return r.json()

    a = done({**base, "seed": 3, "max_tokens": 5, "repetition_penalty": 3.0})
    b = done({**base, "seed": 3, "max_tokens": None, "n_predict": 5, "repeat_penalty": 3.0, "repeat_last_n": -1})
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and b["usage"]["completion_tokens"] == 5
    picked = done({**base, "seed": -1, "max_tokens": 2})["seed"]
    assert (
        done({**base, "seed": picked, "max_tokens": 2})["choices"]
        == done({**base, "seed": picked, "max_tokens": 2})["choices"]
    )
    whole = done({**base, "seed": 3, "n_predict": -1, "max_tokens": 3})
    assert whole["usage"]["completion_tokens"] <= 3  # -1 is no limit of its own: max_tokens rules
    for extra, field in [
        ({"max_tokens": 5, "n_predict": 9}, "n_predict"),
        ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
        ({"guided_choice": ["a", "b"]}, "guided_choice"),
        ({"guided_json": {"type": "object"}}, "guided_json"),  # completions: no response_format here
    ]:
        r = post(url, "/v1/completions", {**base, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    schema = {
        "type": "object",
        "properties": {"n": {"type": "boolean"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "seed": 1}
    guided = done({**chat, "guided_json": schema}, "/v1/chat/completions")
    response_format = {"type": "json_schema", "json_schema": {"name": "guided_json", "schema": schema}}
    formatted = done({**chat, "response_format": response_format}, "/v1/chat/completions")
    assert guided["choices"][0]["message"] == formatted["choices"][0]["message"]
    assert set(json.loads(guided["choices"][0]["message"]["content"])) == {"n"}
    name = model_id(url)
    assert httpx.get(f"{url}/v1/models/{name}", timeout=30).json()["id"] == name
    missing = httpx.get(f"{url}/v1/models/nope", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_generation_config_defaults_and_max_completion_tokens(tiny):
    """A request that sets no sampler field samples with the model's generation_config.json, as sample
    does (and not with plain temperature 1); max_completion_tokens is the budget, over max_tokens."""
    url, _, model, tok = tiny
    ref = texts(model, tok, "The cat", [5, 6, 7], None, 10, chat=False)
    assert ref != texts(model, tok, "The cat", [5, 6, 7], {"temperature": 1.0}, 10, chat=False)
    r = post(url, "/v1/completions", {"model": model_id(url), "prompt": "The cat", "max_tokens": 10, "seed": 5, "n": 3})
    assert [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])] == ref
    report = mlxinfer.sample(model, tok, "hi", seeds=[4], settings={"temperature": 1.0}, max_tokens=3)
    for budget in ({"max_completion_tokens": 3}, {"max_completion_tokens": 3, "max_tokens": 9}):
        r = client(url).chat.completions.create(
            model=model_id(url), messages=[{"role": "user", "content": "hi"}], seed=4, temperature=1.0, **budget
        )
        assert r.choices[0].message.content == report.completions[0].text
        assert r.usage.completion_tokens == len(report.completions[0].tokens)


def test_the_server_pages_extra_body_example_runs_as_written(smol, embedded):
    """The server page's openai snippet (docs/server.md), its base_url pointed at this server: its printed
    list is what its comment says, mlxinfer sample --seeds 3:5 --top-k 20 --temp 1 --max-tokens 8."""
    url, _ = smol
    text = (ROOT / "docs" / "server.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "extra_body" in b]
    assert 'base_url="http://127.0.0.1:8080/v1"' in block
    code = block.replace("http://127.0.0.1:8080/v1", f"{url}/v1")
    printed = StringIO()
    with redirect_stdout(printed):
        exec(compile(code, "docs/server.md", "exec"), {})
    ref = texts(*embedded, FRUIT, "3:5", {"top_k": 20, "temperature": 1.0}, 8)
    assert printed.getvalue().strip() == repr(ref)


# ----------------------------------------------------------------------------- many at once, for real
def test_sixteen_streams_overlap_and_each_equals_its_seed_alone(tiny):
    """The engine is held inside its first step until the other fifteen requests are queued, so they
    are in flight together (the gate records each step's rows: more than one); each stream's text is
    its seed's alone."""
    url, app, model, tok = tiny
    name, cases = model_id(url), [(100 + i, {"temperature": 1.0} if i % 2 else {"top_p": 0.9}) for i in range(16)]
    refs = [texts(model, tok, "The cat sat on", [s], {"temperature": 1.0, **st, "logit_bias": {2: -100}}, 8,
                  chat=False)[0] for s, st in cases]  # fmt: skip
    got: dict = {}

    def ask(case):
        seed, st = case
        body = {"model": name, "prompt": "The cat sat on", "max_tokens": 8, "seed": seed, "stream": True,
                "temperature": 1.0, **st, "logit_bias": {"2": -100}}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        got[seed] = "".join(c["text"] for e in events for c in e["choices"])

    gate = EngineGate(app.engine.batcher)
    threads = [threading.Thread(target=ask, args=(case,)) for case in cases]
    try:
        threads[0].start()
        until(gate.held.is_set, "the first stream is in a decode step")
        for thread in threads[1:]:
            thread.start()
        until(lambda: health(url)["queued"] == 15, "the other fifteen are queued")
    finally:
        gate.open()  # still counting rows
        for thread in threads:
            thread.join(120)
        gate.remove()
    assert [got[s] for s, _ in cases] == refs
    assert max(gate.rows) == app.engine.batcher.max_rows  # rows of several requests in one step
    assert health(url)["rows_in_flight"] == 0


# ----------------------------------------------------------------------------- the wire
def _events(response: httpx.Response) -> list[str]:
    """The stream's events: each must be one `data: ...` line and a blank line."""
    raw = response.read().decode()
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), raw[:400]
    return [e[6:] for e in events]


def test_the_raw_stream_is_data_lines_a_usage_chunk_and_done(tiny):
    url, _, model, tok = tiny
    ref = mlxinfer.sample(model, tok, "hi", seeds=[8], settings={"temperature": 1.0}, max_tokens=6).completions[0]
    body = {"model": model_id(url), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "seed": 8,
            "temperature": 1.0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    *pieces, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(ref.tokens)
    assert last["usage"]["prompt_tokens"] == len(mlxinfer.encode_prompt(tok, "hi"))
    assert all(c["usage"] is None for c in pieces) and pieces[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in pieces) == ref.text
    reasons = [c["choices"][0]["finish_reason"] for c in pieces]
    assert reasons[-1] == ref.finish_reason and reasons.count(None) == len(reasons) - 1


def test_an_error_mid_stream_is_an_error_event_then_done(tmp_path):
    """The model's scores turn NaN after the first token: the stream has begun (200), so the error is an
    event in OpenAI's shape (type server_error), then [DONE]."""
    model, tok = mlxinfer.load(checkpoints.write_checkpoint(tmp_path / "nan", "llama"), compute_dtype="bfloat16")
    bad = 299  # its embedding row is NaN; logit_bias makes it the first token drawn
    emb = model.model.embed_tokens
    emb.weight = mx.where((mx.arange(emb.weight.shape[0]) == bad)[:, None], float("nan"), emb.weight)
    mx.eval(emb.weight)
    with running(mlxinfer.create_app(model, tok)) as url:
        body = {"model": model_id(url), "prompt": "The cat", "max_tokens": 4, "stream": True,
                "logit_bias": {str(bad): 100}}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = _events(r)
    assert events[-1] == "[DONE]"
    *pieces, error = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in pieces)  # what came before it broke, if anything
    assert error["error"]["type"] == "server_error" and "NaN" in error["error"]["message"]


def test_error_types_and_codes_are_openais(checkpoint_dir):
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    page = "http://localhost:3000"  # a page on another origin, allowed by CORS
    with running(mlxinfer.create_app(model, tok, api_key="sesame", max_body_bytes=1000, cors=[page])) as url:
        key = {"authorization": "Bearer sesame"}
        name = client(url, "sesame").models.list().data[0].id
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        cases = [
            (post(url, "/v1/chat/completions", chat), 401, "invalid_request_error", "invalid_api_key"),
            (post(url, "/v1/chat/completions", {**chat, "n": 0}, headers=key), 400, "invalid_request_error", None),
            (post(url, "/v1/chat/completions", {**chat, "model": "gpt-4o"}, headers=key), 404,
             "invalid_request_error", "model_not_found"),
            (post(url, "/v1/nowhere", chat, headers=key), 404, "invalid_request_error", "not_found"),
            (httpx.get(f"{url}/v1/chat/completions", headers=key), 405, "invalid_request_error", None),
            (post(url, "/v1/chat/completions", {**chat, "x": "y" * 2000}, headers=key), 413,
             "invalid_request_error", "request_too_large"),
        ]  # fmt: skip
        for r, status, kind, code in cases:
            error = r.json()["error"]
            assert (r.status_code, error["type"], error["code"]) == (status, kind, code), r.text
        assert cases[0][0].headers["www-authenticate"] == "Bearer"
        # a browser's preflight carries no key: CORS answers it before the key is asked (it was a 401),
        # and the guard's own errors carry the CORS headers, so the page can read them
        ask = {"origin": page, "access-control-request-method": "POST"}
        ask["access-control-request-headers"] = "authorization"
        preflight = httpx.options(f"{url}/v1/chat/completions", headers=ask)
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == page
        other = httpx.options(f"{url}/v1/chat/completions", headers={**ask, "origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        for r in (
            post(url, "/v1/chat/completions", chat, headers={"origin": page}),
            post(url, "/v1/chat/completions", {**chat, "x": "y" * 2000}, headers={**key, "origin": page}),
        ):
            assert r.status_code in (401, 413) and r.headers["access-control-allow-origin"] == page
        for scheme in ("bearer", "BEARER"):  # the scheme is case-insensitive (RFC 9110); the key is not
            ok = post(url, "/v1/chat/completions", chat, headers={"authorization": f"{scheme} sesame"})
            assert ok.status_code == 200, ok.text
        assert post(url, "/v1/chat/completions", chat, headers={"authorization": "Bearer SESAME"}).status_code == 401
