"""GET /metrics: requests are made, then the Prometheus text (read with prometheus_client's own parser) must
have moved by exactly what those requests did: their statuses, their usage's token counts, one first-token
time per row and one gap per later token, and the engine's queue and rows while it is held mid-step."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import mlxinfer
from served import EngineGate, post, running, until

KEY = "sesame"
AUTH = {"authorization": f"Bearer {KEY}"}


def scrape(url) -> dict:
    """{(sample name, sorted labels): value} of one GET /metrics."""
    r = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def moved(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def requests(endpoint: str, status: int):
    return ("mlxinfer_requests_total", (("endpoint", endpoint), ("status", str(status))))


def errors(endpoint: str, kind: str):
    return ("mlxinfer_request_errors_total", (("endpoint", endpoint), ("kind", kind)))


@pytest.fixture(scope="module")
def served(checkpoint_dir):
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, api_key=KEY, max_rows=4, max_queue=4)
    with running(app) as url:
        yield url, app


def test_metrics_need_the_key(served):
    url, _ = served
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
    assert httpx.get(f"{url}/metrics", headers={"authorization": "Bearer nope"}, timeout=30).status_code == 401


def test_counters_move_by_what_the_requests_did(served):
    url, _ = served
    name = model_id_with_key(url)
    before = scrape(url)
    usages, rows = [], 0
    for body in (
        {"model": name, "prompt": "The cat", "max_tokens": 5, "seed": 1, "n": 2, "temperature": 1.0},
        {"model": name, "prompt": "The cat sat", "max_tokens": 3, "seed": 2, "temperature": 1.0, "stream": True,
         "stream_options": {"include_usage": True}},
    ):  # fmt: skip
        r = post(url, "/v1/completions", body, AUTH)
        assert r.status_code == 200, r.text
        usages.append(_usage(r, body.get("stream", False)))
        rows += body.get("n", 1)
    chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 3}
    r = post(url, "/v1/chat/completions", chat, AUTH)
    assert r.status_code == 200, r.text
    usages.append(r.json()["usage"])
    rows += 1
    assert post(url, "/v1/completions", {"model": name, "prompt": "x", "temperature": -1}, AUTH).status_code == 400
    assert post(url, "/v1/completions", {"model": name, "prompt": "x"}).status_code == 401  # no key
    assert httpx.get(f"{url}/no/such/path", timeout=30).status_code == 404
    after = scrape(url)

    generated = sum(u["completion_tokens"] for u in usages)
    assert generated > rows  # every row has a first token and at least one more
    want = {
        requests("/metrics", 200): 1,  # the first scrape (a scrape counts once it has answered)
        requests("/v1/completions", 200): 2,
        requests("/v1/chat/completions", 200): 1,
        requests("/v1/completions", 400): 1,
        requests("/v1/completions", 401): 1,
        requests("other", 404): 1,
        errors("/v1/completions", "4xx"): 2,
        errors("other", "4xx"): 1,
        ("mlxinfer_prompt_tokens_total", ()): sum(u["prompt_tokens"] for u in usages),
        ("mlxinfer_generated_tokens_total", ()): generated,
        ("mlxinfer_time_to_first_token_seconds_count", ()): rows,
        ("mlxinfer_time_per_output_token_seconds_count", ()): generated - rows,
    }
    delta = moved(before, after)
    assert {k: delta.get(k, 0.0) for k in want} == want
    # the sums moved too (elapsed time), and nothing counted that was not asked for
    assert delta[("mlxinfer_time_to_first_token_seconds_sum", ())] > 0
    counters = {k for k in delta if k[0].endswith("_total")}
    assert counters == {k for k in want if k[0].endswith("_total")}


def test_queue_depth_and_rows_in_flight_while_the_engine_is_held(served):
    url, app = served
    name = model_id_with_key(url)
    gate = EngineGate(app.engine.batcher)
    body = {"model": name, "prompt": "The cat", "max_tokens": 3, "temperature": 1.0}
    threads = [threading.Thread(target=post, args=(url, "/v1/completions", {**body, "n": n}, AUTH)) for n in (2, 1)]
    try:
        threads[0].start()
        until(gate.held.is_set, "the first request is in a decode step")
        threads[1].start()  # the engine held in a step: the second request waits in the queue
        until(lambda: scrape(url)[("mlxinfer_queue_depth", ())] == 1, "the second request is queued")
        now = scrape(url)
        assert now[("mlxinfer_rows_in_flight", ())] == 2
    finally:
        gate.remove()
        for thread in threads:
            thread.join(60)
    idle = scrape(url)
    assert (idle[("mlxinfer_queue_depth", ())], idle[("mlxinfer_rows_in_flight", ())]) == (0, 0)


def test_two_apps_in_one_process_count_apart(served, checkpoint_dir):
    url, _ = served
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    with running(mlxinfer.create_app(model, tok)) as other:
        assert httpx.get(f"{other}/health", timeout=30).status_code == 200
        mine = httpx.get(f"{other}/metrics", timeout=30).text
        assert 'mlxinfer_requests_total{endpoint="/health",status="200"} 1.0' in mine
    assert scrape(url).get(requests("/health", 200), 0) == 0


def model_id_with_key(url) -> str:
    return httpx.get(f"{url}/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]


def _usage(r, stream: bool) -> dict:
    if not stream:
        return r.json()["usage"]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return chunks[-1]["usage"]
