"""The explorer's endpoints over HTTP (no browser): /mlxinfer/next-token is `topk`'s table and the scores
it came from, computed on the engine's own thread; the card is `count` and `system_info`; the page and
its assets are served whole, offline, under a policy, and the API key guards the JSON, not the page.

References come from the library run in this process while the engine is idle (MLX runs on one thread
at a time), on a tiny 4-bit llama whose generation_config.json sets its sampler (top-k 20, top-p 0.95,
T 0.6), so settings left unset are seen to resolve as the CLI resolves them. The browser's view of the
same page: tests/test_explorer_browser.py.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import mlxinfer
from mlxinfer.engine.batcher import Job
from mlxinfer.server import explorer
from served import EngineGate, model_id, until
from test_serve import running  # uvicorn on a free loopback port, in a thread

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "mlxinfer" / "server" / "static"
PROMPT = "Name one fruit."


def post(url: str, path: str, body, key: str | None = None) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=120)


def scores_of(response: dict) -> np.ndarray:
    s = response["scores"]
    assert (s["dtype"], s["byteorder"]) == ("float32", "little")
    values = np.frombuffer(base64.b64decode(s["base64"]), dtype="<f4")
    assert values.shape == (s["count"],)
    return values


@pytest.fixture(scope="module")
def tiny(checkpoint_dir):
    path = checkpoint_dir("llama", 4, 64)
    model, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    app = mlxinfer.create_app(model, tok, max_rows=4, max_body_bytes=50_000)
    with running(app) as url:
        yield url, app, model, tok, path


def test_next_token_is_topks_table_and_every_score(tiny):
    url, _, model, tok, _ = tiny
    body = {"prompt": PROMPT, "k": 8, "temperatures": [0.7, 1.3], "top_p": 0.9, "temperature": 1.3}
    r = post(url, "/mlxinfer/next-token", body)
    assert r.status_code == 200, r.text
    got = r.json()
    settings = {"temperature": 1.3, "top_p": 0.9}
    want = mlxinfer.next_token_table(model, tok, PROMPT, temperatures=[0.7, 1.3], k=8, settings=settings)
    assert got["table"] == json.loads(json.dumps(want.to_dict()))
    ids = mlxinfer.encode_prompt(tok, PROMPT)
    assert got["table"]["prompt_ids"] == ids
    assert np.array_equal(scores_of(got), np.array(mlxinfer.next_token_scores(model, ids)))  # bit for bit
    assert [row["id"] for row in got["table"]["rows"]] == list(np.argsort(-scores_of(got), kind="stable")[:8])

    # unset: the sampler of the model's generation_config.json, as `topk --explain` resolves it
    got = post(url, "/mlxinfer/next-token", {"prompt": PROMPT, "chat": False, "k": 3}).json()
    want = mlxinfer.next_token_table(model, tok, PROMPT, k=3, chat=False, explain_sampler=True)
    assert got["table"]["explanation"] == json.loads(json.dumps(want.explanation.to_dict()))
    assert got["table"]["explanation"]["settings"]["top_k"] == 20
    assert "generation_config" in got["table"]["settings_note"]


def test_a_penalty_of_the_models_config_reads_the_prompt(tiny, monkeypatch):
    """A generation_config.json may set a penalty (Qwen2.5's sets repetition_penalty 1.05): the explanation
    applies it over the prompt's tokens, as topk's table and a draw of the first token do."""
    url, _, model, tok, _ = tiny
    monkeypatch.setitem(model.info.generation_config, "repetition_penalty", 3.0)
    body = {"prompt": "hi hi hi", "chat": False, "k": 64, "temperature": 1.0, "top_k": 0}
    got = post(url, "/mlxinfer/next-token", body).json()
    settings = {"temperature": 1.0, "top_k": 0}
    want = mlxinfer.next_token_table(model, tok, "hi hi hi", k=64, chat=False, settings=settings)
    assert got["table"]["explanation"]["settings"]["repetition_penalty"] == 3.0
    assert got["table"]["explanation"] == json.loads(json.dumps(want.explanation.to_dict()))
    monkeypatch.setitem(model.info.generation_config, "repetition_penalty", 1.0)
    plain = mlxinfer.next_token_table(model, tok, "hi hi hi", k=64, chat=False, settings=settings)
    assert got["table"]["explanation"]["rows"] != json.loads(json.dumps(plain.explanation.to_dict()))["rows"]


def test_the_forward_pass_runs_on_the_engine_thread(tiny, monkeypatch):
    """The batcher's thread is the one that tells a job its tokens (batcher.py's promise); the explorer's
    forward pass must run there, never beside it on a request's thread."""
    url, app, model, tok, _ = tiny
    seen = {}
    real = explorer.next_token_scores

    def recorded(*args):
        seen["forward"] = threading.get_ident()
        return real(*args)

    monkeypatch.setattr(explorer, "next_token_scores", recorded)
    assert post(url, "/mlxinfer/next-token", {"prompt": PROMPT, "k": 2}).status_code == 200
    told = threading.Event()

    def emit(kind, index, payload):
        seen["engine"] = threading.get_ident()
        told.set()

    request = mlxinfer.prepare(model, tok, PROMPT, max_tokens=1)
    app.engine.batcher.submit(Job(request, [0], emit))
    assert told.wait(60)
    assert seen["forward"] == seen["engine"] != threading.get_ident()


def test_next_token_beside_a_running_stream(tiny):
    """A forward pass asked for while another request decodes: both answers are what each gives alone,
    whichever comes first."""
    url, app, model, tok, _ = tiny
    ref = mlxinfer.sample(model, tok, "The cat", seeds=[3], settings={"temperature": 1.0}, max_tokens=60, chat=False)
    table = mlxinfer.next_token_table(model, tok, PROMPT, k=5, temperatures=[1.0])
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": "The cat", "max_tokens": 60, "seed": 3, "temperature": 1.0, "stream": True}
    parts = []

    def stream():
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    parts.extend(c["text"] for c in json.loads(line[6:])["choices"])

    reader = threading.Thread(target=stream)
    reader.start()
    answers = [post(url, "/mlxinfer/next-token", {"prompt": PROMPT, "k": 5, "temperatures": [1.0]}) for _ in range(3)]
    reader.join(120)
    assert all(a.json()["table"]["rows"] == json.loads(json.dumps(table.to_dict()))["rows"] for a in answers)
    assert "".join(parts) == ref.completions[0].text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": PROMPT, "k": 0}, "k"),
        ({"prompt": PROMPT, "k": explorer.MAX_ROWS_SHOWN + 1}, "k"),
        ({"prompt": PROMPT, "k": 2.5}, "k"),
        ({"prompt": PROMPT, "temperatures": []}, "temperatures"),
        ({"prompt": PROMPT, "temperatures": [1.0] * (explorer.MAX_TEMPERATURES + 1)}, "temperatures"),
        ({"prompt": PROMPT, "temperatures": [-1.0]}, "temperatures"),
        ({"prompt": PROMPT, "top_p": 2.0}, "top_p"),
        ({"prompt": PROMPT, "top_k": -2}, "top_k"),
        ({"prompt": PROMPT, "min_p": 1.0}, "min_p"),
        ({"prompt": PROMPT, "temperature": "1"}, "temperature"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": ""}, "prompt"),  # was a table for the chat template alone, where the CLI refuses -p ''
        ({"prompt": PROMPT, "temperatures": [1.0, 0.5, 1.0]}, "temperatures"),  # as the CLI refuses --temps 1,1
        ({}, "prompt"),
        ({"prompt": PROMPT, "temprature": 1.0}, "temprature"),  # a misspelled field is refused, not ignored
        ({"prompt": PROMPT, "chat": False, "system": "Be brief."}, "system"),
        ({"prompt": "x " * 5000}, "prompt"),  # past the tiny model's context
        ("[1, 2]", None),
        ("{not json", None),
    ],
)
def test_bad_requests_are_openai_errors_naming_the_field(tiny, body, param):
    url = tiny[0]
    r = post(url, "/mlxinfer/next-token", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "\n" not in error["message"]


def test_the_card_is_count_and_system_info(tiny):
    url, app, model, _, path = tiny
    card = httpx.get(f"{url}/mlxinfer/card", timeout=60).json()
    assert card["model"] == httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    assert card["count"] == json.loads(json.dumps(mlxinfer.count(path).to_dict()))
    assert set(card["system"]) == set(mlxinfer.system_info())
    assert card["cli_model"] == str(path) and card["compute_dtype"] == model.info.compute_dtype
    assert (card["definition"], card["architecture"]) == (model.info.definition, "llama")
    assert card["server"]["max_rows"] == app.engine.batcher.max_rows == 4
    assert card["views"] == ["next-token", "answers", "draws", "generate"]


def test_the_page_and_its_assets_are_served_whole_under_a_policy(tiny):
    url = tiny[0]
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    for name, kind in explorer.ASSETS.items():
        r = httpx.get(f"{url}/" if name == "index.html" else f"{url}/explorer/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == kind
        assert r.content == (STATIC / name).read_bytes()
        assert r.headers["x-content-type-options"] == "nosniff"
        again = httpx.get(str(r.url), headers={"if-none-match": r.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    for bad in ("/explorer/nope.js", "/explorer/index.html", "/explorer/..%2Fexplorer.py", "/explorer/"):
        r = httpx.get(f"{url}{bad}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_the_page_names_only_its_own_files_and_no_other_host():
    """Every file the page loads is one the server serves (index.html's links, the modules' imports),
    and no asset names a host: the page works offline."""
    html = (STATIC / "index.html").read_text()
    linked = {Path(p).name for p in re.findall(r'(?:src|href)="/explorer/([^"]+)"', html)}
    imported = set()
    for js in STATIC.glob("*.js"):
        imported |= set(re.findall(r'from "\./([\w.-]+\.js)"', js.read_text()))
    assert linked | imported | {"index.html"} == set(explorer.ASSETS)
    for f in STATIC.iterdir():
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", f.read_text()), f.name


def test_the_package_ships_every_asset():
    line = re.search(r'^"mlxinfer\.server" = (\[.*?\])', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    globs = json.loads(line.group(1))
    files = {f.name for f in STATIC.iterdir()}
    assert files == set(explorer.ASSETS)
    assert all(any(fnmatch.fnmatch(f"static/{f}", g) for g in globs) for f in files)


def test_the_key_guards_the_json_endpoints_not_the_page(tiny):
    _, _, model, tok, _ = tiny
    with running(mlxinfer.create_app(model, tok, api_key="sesame")) as url:
        assert httpx.get(f"{url}/").status_code == 200
        assert httpx.get(f"{url}/explorer/api.js").status_code == 200
        for method, path in (("GET", "/mlxinfer/card"), ("POST", "/mlxinfer/next-token")):
            r = httpx.request(method, f"{url}{path}", json={"prompt": PROMPT}, headers={"authorization": "Bearer x"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/mlxinfer/card", headers={"authorization": "Bearer sesame"}).status_code == 200
        assert post(url, "/mlxinfer/next-token", {"prompt": PROMPT, "k": 2}, key="sesame").status_code == 200
    app = mlxinfer.create_app(model, tok, max_rows=1, max_queue=0)  # no room: the same 429 as /v1
    gate = EngineGate(app.engine.batcher)
    with running(app) as url, ThreadPoolExecutor(2) as pool:
        held = pool.submit(post, url, "/v1/completions", {"model": model_id(url), "prompt": PROMPT, "max_tokens": 2})
        until(gate.held.is_set, "a request is in a decode step")
        first = pool.submit(post, url, "/mlxinfer/next-token", {"prompt": PROMPT})  # runs at the next turn
        until(lambda: len(app.engine.batcher._calls) == 1, "the first call waits for the step")
        r = post(url, "/mlxinfer/next-token", {"prompt": PROMPT})  # would wait behind it: refused
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        gate.open()
        assert first.result(60).status_code == 200 and held.result(60).status_code == 200


@pytest.mark.slow
def test_explore_serves_on_loopback_and_opens_the_page(tmp_path, checkpoint_dir):
    """`mlxinfer explore` as a user runs it, its browser a script that writes down what it was asked to
    open (python's webbrowser runs $BROWSER)."""
    opened = tmp_path / "opened"
    browser = tmp_path / "browser.py"
    browser.write_text(f"import sys, pathlib\npathlib.Path({str(opened)!r}).write_text(sys.argv[1])\n")
    env = {**os.environ, "BROWSER": f"{sys.executable} {browser} %s"}
    model = checkpoint_dir("llama", 4, 64)
    args = ["explore", "--model", str(model), "--compute-dtype", "bfloat16", "--api-key", "k/1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxinfer", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = proc.stdout.readline().decode()
        page = re.search(r"at (http://127\.0\.0\.1:\d+/)$", line.strip()).group(1)
        assert "k/1" not in line  # the key is not printed
        for _ in range(200):
            if opened.exists():
                break
            time.sleep(0.05)
        assert opened.read_text() == f"{page}#key=k%2F1"
        assert httpx.get(page).status_code == 200
        assert httpx.get(f"{page}mlxinfer/card", headers={"authorization": "Bearer k/1"}).json()["cli_model"] == str(
            model
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_templated_prompt_gets_advice_the_page_can_follow(tiny):
    """The library's fix ("chat=False with raw_special_tokens=True") read "chat with raw_special_tokens=True",
    and the field did not exist (400: extra inputs); it is the body's own words now, and following it works."""
    url, _, model, tok, _ = tiny
    rendered = tok.decode(mlxinfer.encode_prompt(tok, [{"role": "user", "content": PROMPT}]))
    refused = post(url, "/mlxinfer/next-token", {"prompt": rendered})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "prompt", error
    assert '"chat": false with "raw_special_tokens": true' in error["message"], error["message"]
    body = {"prompt": rendered, "chat": False, "raw_special_tokens": True}
    table = post(url, "/mlxinfer/next-token", body).json()["table"]
    assert table["prompt_ids"] == mlxinfer.encode_prompt(tok, [{"role": "user", "content": PROMPT}])
