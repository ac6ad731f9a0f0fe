"""POST /mlxinfer/answers over HTTP: the report `mlxinfer.answers` returns for the same request, walked on the
engine thread a step per engine call (a stream decodes between its steps), bounded by the server's caps
(a capped walk says where it stopped, and its remainder bounds what it did not walk), every bad field a
400 naming it, and the API key required as on /v1.

References come from the library run in this process while the engine is idle (MLX runs on one thread at a
time), on a tiny 4-bit llama whose generation_config.json sets top-k 20 and top-p 0.95: a cut the walk can
finish (remainder exactly 0) in a few passes. The browser's view: tests/test_explorer_browser.py.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import mlxinfer
from mlxinfer import defaults
from mlxinfer.engine import answers as engine_answers
from mlxinfer.server import answers as served_answers
from mlxinfer.server import explorer
from conftest import ROOT
from served import post, running, until

PROMPT = "Name one fruit."
KEY = "walk-key"
AUTH = {"authorization": f"Bearer {KEY}"}
VARIES = ("seconds", "peak_memory_bytes")  # what two runs of one walk do not share


@pytest.fixture(scope="module")
def tiny(checkpoint_dir):
    model, tok = mlxinfer.load(checkpoint_dir("llama", 4, 64), compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=4, api_key=KEY)
    with running(app) as url:
        yield url, app, model, tok


def walk(url: str, **body) -> httpx.Response:
    return post(url, "/mlxinfer/answers", {"prompt": PROMPT, **body}, headers=AUTH)


def library(model, tok, temperatures, cut, **kw) -> dict:
    settings = [{**cut, "temperature": t} for t in temperatures]
    # the server's walk passes hold defaults.BATCH_SIZE paths (other requests' decode steps wait for a pass), and
    # a walk there ends after its MAX_SECONDS at most
    kw = {"max_seconds": served_answers.MAX_SECONDS, **kw}
    return mlxinfer.answers(model, tok, PROMPT, settings=settings, batch_size=defaults.BATCH_SIZE, **kw).to_dict()


def same(report: dict) -> dict:
    return {k: v for k, v in json.loads(json.dumps(report)).items() if k not in VARIES}


def test_the_endpoint_is_answers_own_report_a_step_per_engine_call(tiny, monkeypatch):
    url, app, model, tok = tiny
    steps, calls = [], []
    real_step, real_call = engine_answers.AnswerWalk.step, app.engine.batcher.call

    def step(self):
        steps.append(threading.get_ident())
        return real_step(self)

    def call(fn):
        calls.append(fn)
        return real_call(fn)

    monkeypatch.setattr(engine_answers.AnswerWalk, "step", step)
    monkeypatch.setattr(app.engine.batcher, "call", call)
    r = walk(url, temperatures=[0.7, 1.3], top_k=3, max_tokens=2, min_mass=1.0)
    assert r.status_code == 200, r.text
    got = r.json()
    monkeypatch.undo()
    want = library(model, tok, [0.7, 1.3], {"top_k": 3}, max_tokens=2, min_mass=1.0)
    assert same(got["report"]) == same(want)
    report = got["report"]
    assert report["stopped"] == "complete" and all(m["complete"] and m["remainder"] == 0 for m in report["mass"])
    for i in range(2):  # the whole tree walked: the answers' probabilities sum to 1 under each setting
        assert sum(a["probs"][i] for a in report["answers"]) == pytest.approx(1.0, abs=1e-9)
    for a in report["answers"]:  # a path's probability is the product of its steps'
        for p in a["paths"]:
            for i in range(2):
                product = 1.0
                for s in p["steps"]:
                    product *= s[i]
                assert product == pytest.approx(p["probs"][i], rel=1e-9)
    # the walk's start, then one engine call per step, every step on the engine thread
    assert got["engine_calls"] == len(calls) == len(steps) + 1 >= 3
    assert len(set(steps)) == 1 and steps[0] != threading.get_ident()


def test_a_capped_walk_says_so_and_its_remainder_bounds_the_rest(tiny, monkeypatch):
    url, _, model, tok = tiny
    # top-k 40 (less top-p's tail) first tokens at T = 0.5, each ending at the next: a batch of 32 expanded,
    # then one more, and on the way to it the ended answers heavier than it are resolved
    full = walk(url, temperatures=[0.5], top_k=40, max_tokens=2, min_mass=1.0).json()["report"]
    assert full["stopped"] == "complete" and full["nodes"] > 33
    r = walk(url, temperatures=[0.5], top_k=40, max_tokens=2, min_mass=1.0, max_nodes=33)
    assert r.status_code == 200, r.text
    got = r.json()
    capped = got["report"]
    assert same(capped) == same(library(model, tok, [0.5], {"top_k": 40}, max_tokens=2, min_mass=1.0, max_nodes=33))
    assert capped["stopped"] == "max_nodes" and capped["nodes"] == 33 and capped["max_nodes"] == 33
    (mass,) = capped["mass"]
    assert not mass["complete"] and 0 < mass["remainder"] < 1 and capped["answers"]
    assert mass["explored"] + mass["remainder"] == pytest.approx(1.0, abs=1e-12)
    assert sum(a["probs"][0] for a in capped["answers"]) == pytest.approx(mass["explored"], abs=1e-12)
    exact = {a["answer"]: a["probs"][0] for a in full["answers"]}
    found = {a["answer"]: a["probs"][0] for a in capped["answers"]}
    for answer, p in exact.items():  # each answer's exact probability lies within what the capped walk bounds
        assert found.get(answer, 0.0) - 1e-12 <= p <= found.get(answer, 0.0) + mass["remainder"] + 1e-12
    assert got["limits"]["max_nodes"] == served_answers.MAX_NODES

    monkeypatch.setattr(served_answers, "MAX_SECONDS", 1e-9)  # the server's time budget, spent at once
    timed = walk(url, temperatures=[1.0], top_k=3, max_tokens=2, min_mass=1.0)
    assert timed.status_code == 200, timed.text
    t = timed.json()
    assert t["report"]["stopped"] == "max_seconds" and t["limits"]["max_seconds"] == 1e-9
    assert t["report"]["nodes"] == 0 and t["report"]["mass"][0]["remainder"] == 1.0 and t["report"]["answers"] == []


def test_a_stream_decodes_between_the_walks_steps(tiny, monkeypatch):
    url, app, model, tok = tiny
    ref = mlxinfer.sample(model, tok, "The cat", seeds=[3], settings={"temperature": 1.0}, max_tokens=60, chat=False)
    want = library(model, tok, [1.0], {"top_k": 0, "top_p": 1.0}, max_tokens=3, max_nodes=96)
    events: list[str] = []
    real_step, real_forward = engine_answers.AnswerWalk.step, app.engine.batcher.batch.forward
    monkeypatch.setattr(engine_answers.AnswerWalk, "step", lambda self: events.append("walk") or real_step(self))
    monkeypatch.setattr(app.engine.batcher.batch, "forward", lambda *a: events.append("decode") or real_forward(*a))
    body = {"model": app.engine.model_id, "prompt": "The cat", "max_tokens": 60, "seed": 3, "temperature": 1.0}
    body["stream"] = True
    parts, first = [], threading.Event()

    def stream():
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    parts.extend(c["text"] for c in json.loads(line[6:])["choices"])
                    first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(60)
    r = walk(url, temperatures=[1.0], top_k=0, top_p=1.0, max_tokens=3, max_nodes=96)
    reader.join(120)
    assert r.status_code == 200, r.text
    assert same(r.json()["report"]) == same(want) and "".join(parts) == ref.completions[0].text
    walked = [i for i, e in enumerate(events) if e == "walk"]
    assert len(walked) >= 3 and "decode" in events[walked[0] : walked[-1]]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperatures": []}, "temperatures"),
        ({"temperatures": [1.0] * (explorer.MAX_TEMPERATURES + 1)}, "temperatures"),
        ({"temperatures": [-0.5]}, "temperatures"),
        ({"temperatures": ["1"]}, "temperatures[0]"),
        ({"top_p": 2.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": served_answers.MAX_TOKENS + 1}, "max_tokens"),
        ({"min_mass": 0.0}, "min_mass"),
        ({"min_mass": 1.5}, "min_mass"),
        ({"max_nodes": 0}, "max_nodes"),
        ({"max_nodes": 2.5}, "max_nodes"),
        ({"max_nodes": served_answers.MAX_NODES + 1}, "max_nodes"),
        ({"max_seconds": 0}, "max_seconds"),
        ({"max_seconds": served_answers.MAX_SECONDS + 1}, "max_seconds"),
        ({"group": "word"}, "group"),
        ({"chat": False, "system": "Be brief."}, "system"),
        ({"temps": [1.0]}, "temps"),  # a misspelled field is refused, not ignored
        ({"prompt": 3}, "prompt"),
        ({"prompt": " \n"}, "prompt"),  # was answered (the chat template alone), where the CLI refuses -p ''
        ({"temperatures": [1.0, 1.0]}, "temperatures"),  # was two equal columns, where the CLI refuses --temps 1,1
        ({"prompt": "x " * 5000}, "prompt"),  # past the tiny model's context
    ],
)
def test_bad_requests_are_openai_errors_naming_the_field(tiny, body, param):
    r = walk(tiny[0], **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "\n" not in error["message"]


def test_the_key_is_required_and_the_card_says_the_caps(tiny):
    url = tiny[0]
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = post(url, "/mlxinfer/answers", {"prompt": PROMPT, "max_tokens": 1}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"
    card = httpx.get(f"{url}/mlxinfer/card", headers=AUTH, timeout=60).json()
    assert card["views"] == ["next-token", "answers", "draws", "generate"]
    server = card["server"]
    assert (server["max_answer_nodes"], server["max_answer_seconds"], server["max_answer_tokens"]) == (
        served_answers.MAX_NODES,
        served_answers.MAX_SECONDS,
        served_answers.MAX_TOKENS,
    )


def test_a_walk_whose_client_leaves_stops(tiny, monkeypatch):
    url = tiny[0]
    steps: list[int] = []
    real_step = engine_answers.AnswerWalk.step

    def slow(self):  # 20 ms a step: 10,000 paths would take seconds
        steps.append(self.nodes)
        time.sleep(0.02)
        return real_step(self)

    monkeypatch.setattr(engine_answers.AnswerWalk, "step", slow)
    body = {"prompt": PROMPT, "temperatures": [1.0], "top_k": 0, "top_p": 1.0, "max_tokens": 5, "min_mass": 1.0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/mlxinfer/answers", json=body, headers=AUTH, timeout=0.5)
    until(lambda: steps, "the walk started")
    time.sleep(0.2)
    seen = len(steps)
    time.sleep(1.5)
    assert len(steps) <= seen + 1, (seen, len(steps))  # it stopped at its next step, not at max_nodes
    assert steps[-1] < served_answers.MAX_NODES


def test_the_docs_state_the_caps():
    page = (ROOT / "docs" / "explorer.md").read_text()
    for name in ("MAX_NODES", "MAX_SECONDS", "MAX_TOKENS"):
        assert f"{getattr(served_answers, name):,g} (`{name}`)" in page, name


def test_a_walk_waiting_on_a_full_queue_ends_with_its_budget(tiny, monkeypatch):
    """After its first step the engine's queue stays full: the walk waits and retries, but only within its
    own time budget; then the request is the queue's 429, not a wait with no end."""
    url, app, model, tok = tiny
    real, calls = served_answers.on_engine, []

    async def busy_after_one(batcher, fn, http=None):
        calls.append(time.perf_counter())
        if len(calls) > 1:
            raise served_answers.ApiError(429, "the server is busy (queue full); retry shortly", None)
        return await real(batcher, fn, http)

    monkeypatch.setattr(served_answers, "on_engine", busy_after_one)
    start = time.perf_counter()
    r = walk(url, temperatures=[1.0], top_k=40, max_tokens=2, min_mass=1.0, max_seconds=1.0)
    waited = time.perf_counter() - start
    assert r.status_code == 429 and "busy" in r.json()["error"]["message"]
    assert len(calls) > 2 and 1.0 <= waited < 30  # it retried, and stopped once the budget was spent


def _arrays(obj, seen: set) -> list:
    """The MLX arrays reachable from obj through attributes, lists, tuples and dicts."""
    import mlx.core as mx

    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return [a for item in items for a in _arrays(item, seen)]


def test_a_released_walk_holds_no_mlx_array(tiny):
    """The route drops a walk's arrays on the engine thread (_release): after it, nothing the walk holds but
    its model and tokenizer reaches an MLX array (the passes' buffers included)."""
    _, _, model, tok = tiny
    request = engine_answers.prepare(model, tok, PROMPT, max_tokens=4)
    settings = [mlxinfer.settings.resolve_settings({"temperature": 1.0, "top_k": 4}, model.info.generation_config)[0]]
    walk = engine_answers.AnswerWalk(model, tok, request, settings, 0.99, 200, 8, "text")
    while walk.step():
        pass
    seen = {id(model), id(tok)}
    assert walk.passes > 1 and _arrays(walk, set(seen))  # reused buffers, keys and values, the prompt's cache
    served_answers._release(walk)
    assert _arrays(walk, seen) == []
