"""What the server tests share: the app run in-process with uvicorn on 127.0.0.1, the clients, a raw
HTTP/1.1 exchange, and a gate that holds the engine thread mid-step so that a test can make requests
overlap (or a queue fill) on purpose instead of hoping they do.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import openai

import mlxinfer
from mlxinfer.server.run import draining_server, listen, uvicorn_config


@contextmanager
def running(app):
    """uvicorn serving `app` as `mlxinfer serve` does (uvicorn_config, draining_server), in a thread, on a
    loopback socket bound and listening here (no other process can take its port before uvicorn serves it): yields the
    base URL once the server has started, or fails saying it did not."""
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = draining_server(uvicorn_config(app, log_level="warning"), app.engine.batcher)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):  # 30 s: a loaded machine
        if server.started or not thread.is_alive():
            break
        time.sleep(0.05)
    try:
        assert server.started, "the server did not start within 30 s"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def model_id(url) -> str:
    return client(url).models.list().data[0].id


def post(url, path, body, headers: dict | None = None, **kw):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=60, **kw)


def health(url) -> dict:
    return httpx.get(f"{url}/health", timeout=30).json()


def texts(model, tok, prompt, seeds, settings, max_tokens, **kw) -> list[str]:
    report = mlxinfer.sample(model, tok, prompt, seeds=seeds, settings=settings, max_tokens=max_tokens, **kw)
    return [c.text for c in report.completions]


def raw_post(path: str, body: bytes, headers: dict | None = None) -> bytes:
    """An HTTP/1.1 POST as bytes: `headers` (default: a JSON body's type and length) are sent as given."""
    given = headers if headers is not None else {"Content-Type": "application/json", "Content-Length": len(body)}
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in given.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def raw_exchange(url: str, request: bytes, timeout: float = 30, done_sending: bool = False) -> bytes:
    """Send `request` as it is over one connection; everything the server sends until it closes.
    done_sending: then close the sending side (the server reads the end of the stream)."""
    with socket.create_connection(address(url), timeout=timeout) as s:
        s.sendall(request)
        if done_sending:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += data


def until(condition, what: str, seconds: float = 60.0) -> None:
    """Wait (bounded) for `condition()` to hold, or fail naming `what`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened within {seconds:g} s: {what}"
        time.sleep(0.02)


class EngineGate:
    """Holds the engine thread inside its next decode step until `open()`: rows already in flight stay
    there, and requests sent meanwhile queue up (or are refused, past the queue bound). `rows` records
    how many rows each step ran with."""

    def __init__(self, batcher):
        self.batch, self.real = batcher.batch, batcher.batch.forward  # the row core's one forward pass a step
        self.held, self.release = threading.Event(), threading.Event()
        self.rows: list[int] = []
        self.batch.forward = self._forward

    def _forward(self, live, tokens):
        self.rows.append(len(live))
        if not self.release.is_set():
            self.held.set()
            self.release.wait(120)
        return self.real(live, tokens)

    def open(self) -> None:
        self.release.set()

    def remove(self) -> None:
        self.release.set()
        self.batch.forward = self.real
