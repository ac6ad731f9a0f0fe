"""`mlxinfer serve` under load (a benchmark, not a test): concurrency, time to first token, memory.

Starts the server as a child process on 127.0.0.1 (and, with --mlx-lm DIR, `mlx_lm.server` on the
same weights), then:

1. N seeded streaming clients at once vs the same N requests one after another: aggregate
   tokens/s and its ratio, p50/p99 time to first token, and how many texts equal the one-at-a-time
   run's (the seed's own stream: all N on the weights as stored, nearly all on the float32 path).
   The load comes from one asyncio loop on httpx (`--client raw`, as vLLM's benchmark_serving
   streams with aiohttp) or from N official openai clients (`--client openai`); both phases use the
   same one. The clients run on the server's own cores here: the share of them the client took
   during the concurrent phase is printed beside the figures (~0.04 raw, ~0.19 openai, 2 cores).
   `--rounds R` runs the two phases in turn R times on one server and prints each round's ratio,
   then their median and range: this machine drifts 20-30% within minutes, adjacent phases do not.
2. R small requests in a row, the server's RSS sampled every 50: flat memory means no leak.
3. With --mlx-lm: the same concurrent load against mlx_lm.server, and whether a seeded request
   gives the same text twice, alone and under load.
4. With --llama-server BIN: the same against llama.cpp's server on the same GGUF file (the embedded
   model's by default), `--parallel N` slots with continuous batching, the machine's thread count.
   Build it for the CPU it runs on (docs/performance.md gives the recipe, `GGML_NATIVE=ON`); its
   `/props` build id is printed (`mlxinfer bench` prints the same sources' system-info line, through
   llama-cpp-python, built with the same flags).

    python bench/serve_load.py                                   # embedded model, 32 clients
    python bench/serve_load.py --compute-dtype bfloat16 --clients 8 --requests 200
    python bench/serve_load.py --model smol-bf16 --mlx-lm smol-bf16   # beside mlx_lm.server
    python bench/serve_load.py --llama-server ~/llama.cpp/build/bin/llama-server   # beside llama-server

Every request goes to 127.0.0.1; every loop is bounded; the servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Name one fruit.", "Name one herb to add to tomato soup.", "Tell me about cats.", "Say hello."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, timeout: float = 300) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not start in time")


def client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)


def body(model: str, prompt: str, seed: int, max_tokens: int) -> dict:
    """The seeded streaming chat request both clients send."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "seed": seed, "temperature": 1.0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


def cases(n: int) -> list[tuple[str, int]]:
    """The n requests' (prompt, seed), the same in every phase and for either client."""
    return [(PROMPTS[i % len(PROMPTS)], 1000 + i) for i in range(n)]


def result(start: float, text: list[str], first: float | None, tokens: int) -> dict:
    total = time.perf_counter() - start
    return {"text": "".join(text), "tokens": tokens or len(text), "ttft": first or total, "seconds": total}


def one(url: str, model: str, prompt: str, seed: int, max_tokens: int, http=None) -> dict:
    """One seeded streaming chat request: its text, tokens, time to first token, total time.
    `http`: the openai client to send it with (a new one if None)."""
    http = http or client(url)
    start = time.perf_counter()
    stream = http.chat.completions.create(**body(model, prompt, seed, max_tokens))
    text, first, tokens = [], None, 0
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                first = first if first is not None else time.perf_counter() - start
                text.append(c.delta.content)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return result(start, text, first, tokens)


async def one_raw(http, model: str, prompt: str, seed: int, max_tokens: int) -> dict:
    """`one` on a bare async HTTP client: the same request and the same fields read from its
    server-sent events, parsed with json.loads (the openai client builds a pydantic object per chunk)."""
    start, text, first, tokens = time.perf_counter(), [], None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body(model, prompt, seed, max_tokens)) as r:
        if r.status_code != 200:
            raise SystemExit(f"status {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - start
                    text.append(piece)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return result(start, text, first, tokens)


def load_raw(
    url: str, model: str, n: int, max_tokens: int, concurrent: bool, keep_alive: bool = True
) -> tuple[list[dict], float]:
    """`load` with one_raw: one event loop, one connection per request in flight (a new one per request
    without keep_alive: llama-server closes a kept connection after a few requests, which a client can
    find only by sending on it)."""
    import asyncio

    import httpx

    requests = cases(n)

    async def run() -> tuple[list[dict], float]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n if keep_alive else 0)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
            start = time.perf_counter()
            if concurrent:
                out = await asyncio.gather(*(one_raw(http, model, *c, max_tokens) for c in requests))
            else:
                out = [await one_raw(http, model, *c, max_tokens) for c in requests]
            return list(out), time.perf_counter() - start

    return asyncio.run(run())


def load(url: str, model: str, n: int, max_tokens: int, concurrent: bool) -> tuple[list[dict], float]:
    """The n requests, one after another on one client or all at once on n clients (made before the
    clock starts: ~25 ms of CPU each, on the server's cores, is the client's cost, not the
    server's), and the seconds from the first request sent to the last response read."""
    requests = cases(n)
    if not concurrent:
        http = client(url)
        start = time.perf_counter()
        out = [one(url, model, *c, max_tokens, http) for c in requests]
        return out, time.perf_counter() - start
    clients = [client(url) for _ in range(n)]
    with ThreadPoolExecutor(n) as pool:
        start = time.perf_counter()
        out = list(pool.map(lambda i: one(url, model, *requests[i], max_tokens, clients[i]), range(n)))
    return out, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def compare(
    url: str,
    model: str,
    n: int,
    max_tokens: int,
    label: str,
    client_kind: str = "raw",
    rounds: int = 1,
    keep_alive: bool = True,
) -> list:
    """Both phases through the same client, `raw` (one_raw) or `openai` (one), `rounds` times in turn
    (one after another, then at once, then again): a ratio from two phases minutes apart would carry
    the machine's drift (20-30% here), one from adjacent phases does not. A row per round, then, for
    several, their median and range."""
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    one(url, model, PROMPTS[0], 1, 2)  # warm-up
    run = partial(load_raw, keep_alive=keep_alive) if client_kind == "raw" else load
    rows = []
    for i in range(rounds):
        seq, seq_s = run(url, model, n, max_tokens, concurrent=False)
        before = cpu()
        con, con_s = run(url, model, n, max_tokens, concurrent=True)
        rows.append(measured(label, client_kind, n, seq, seq_s, con, con_s, cpu() - before, i + 1))
    if rounds > 1:
        ratios = sorted(r["ratio"] for r in rows)
        median = round(statistics.median(ratios), 2)
        summary = {"server": label, "client": client_kind, "rounds": rounds, "ratio_median": median,
                   "ratio_min": ratios[0], "ratio_max": ratios[-1]}  # fmt: skip
        print(json.dumps(summary), flush=True)
    return rows


def measured(label: str, client_kind: str, n: int, seq, seq_s, con, con_s, client_cpu, round_: int) -> dict:
    seq_tps, con_tps = sum(r["tokens"] for r in seq) / seq_s, sum(r["tokens"] for r in con) / con_s
    ttft = [r["ttft"] for r in con]
    row = {
        "server": label,
        "client": client_kind,
        "round": round_,
        "clients": n,
        "sequential_tok_s": round(seq_tps, 1),
        "concurrent_tok_s": round(con_tps, 1),
        "ratio": round(con_tps / seq_tps, 2),
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_p99_s": round(pct(ttft, 0.99), 3),
        "same_text_as_one_at_a_time": f"{sum(a['text'] == b['text'] for a, b in zip(seq, con))}/{n}",
        "client_cpu_share_concurrent": round(client_cpu / (con_s * (os.cpu_count() or 1)), 2),  # of all cores
    }
    print(json.dumps(row), flush=True)
    return row


def soak(url: str, model: str, pid: int, requests: int) -> dict:
    import httpx
    import psutil

    proc, samples = psutil.Process(pid), []
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, "seed": 0}
    with httpx.Client(timeout=120) as http:
        for i in range(requests):
            r = http.post(f"{url}/v1/chat/completions", json={**body, "seed": i})
            assert r.status_code == 200, r.text
            if i % 50 == 0 or i == requests - 1:
                samples.append(proc.memory_info().rss)
    mib = [s / 2**20 for s in samples]
    later = mib[len(mib) // 2 :]  # after the warm-up: growth here would be a leak
    row = {"requests": requests, "rss_first_mib": round(mib[0], 1), "rss_mid_mib": round(later[0], 1),
           "rss_last_mib": round(mib[-1], 1), "rss_max_mib": round(max(mib), 1),
           "growth_second_half_mib": round(later[-1] - later[0], 1)}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def reproducible(url: str, model: str, max_tokens: int) -> dict:
    """The same seeded request alone twice, then once under load: does the text stay the same?"""
    a = one(url, model, PROMPTS[0], 7, max_tokens)["text"]
    b = one(url, model, PROMPTS[0], 7, max_tokens)["text"]
    with ThreadPoolExecutor(8) as pool:
        others = [pool.submit(one, url, model, PROMPTS[1], 100 + i, max_tokens) for i in range(7)]
        c = one(url, model, PROMPTS[0], 7, max_tokens)["text"]
        [f.result() for f in others]
    d = one(url, model, PROMPTS[0], 8, max_tokens)["text"]
    row = {"alone_twice_same": a == b, "under_load_same": a == c, "other_seed_differs": a != d}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model source for mlxinfer (default: the embedded model)")
    p.add_argument("--compute-dtype", default="auto")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=1000, help="small requests in a row for the memory check")
    p.add_argument("--mlx-lm", default=None, help="a model directory to serve with mlx_lm.server as well")
    p.add_argument("--llama-server", default=None, help="a llama-server binary to run on the same GGUF file")
    p.add_argument("--gguf", default=None, help="the GGUF file llama-server serves (default: the embedded model's)")
    p.add_argument(
        "--client",
        choices=("raw", "openai"),
        default="raw",
        help="load generator: raw (one asyncio loop, json.loads per event, as vLLM's benchmark_serving "
        "uses aiohttp) or openai (the official client, a thread each; its parsing shares the server's cores)",
    )
    p.add_argument("--rounds", type=int, default=1, help="load rounds in turn (one after another, then at once)")
    p.add_argument("--phases", default="load,seeds,memory", help="which of load, seeds, memory to run (mlxinfer)")
    a = p.parse_args()
    phases = set(a.phases.split(","))
    if not 1 <= a.clients <= 64 or not 1 <= a.requests <= 5000 or not 1 <= a.rounds <= 20:
        raise SystemExit("--clients must be 1..64, --requests 1..5000 and --rounds 1..20")

    port = free_port()
    code = (
        "import mlxinfer; "
        f"mlxinfer.serve({a.model!r}, port={port}, compute_dtype={a.compute_dtype!r}, max_rows={a.clients}, "
        "log_level='warning')"
    )
    proc = start([sys.executable, "-c", code], port)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        if "load" in phases:
            compare(url, model, a.clients, a.max_tokens, "mlxinfer serve", a.client, a.rounds)
        if "seeds" in phases:
            reproducible(url, model, a.max_tokens)
        if "memory" in phases:
            soak(url, model, proc.pid, a.requests)
    finally:
        proc.terminate()
        proc.wait(30)
    if a.mlx_lm:
        port = free_port()
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", a.mlx_lm, "--host", "127.0.0.1", "--port", str(port)]
        proc = start(cmd, port)
        url = f"http://127.0.0.1:{port}"
        try:
            compare(url, a.mlx_lm, a.clients, a.max_tokens, "mlx_lm.server", a.client, a.rounds)
            reproducible(url, a.mlx_lm, a.max_tokens)
        finally:
            proc.terminate()
            proc.wait(30)
    if a.llama_server:
        llama_server(a)


def llama_server(a) -> None:
    """The same load against llama.cpp's own server: N slots (`--parallel`), continuous batching, each slot
    a context for one request's prompt and tokens, as many threads as MLX uses here."""
    import httpx

    import mlxinfer

    gguf = a.gguf or str(mlxinfer.embedded_model_path())
    threads = str(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    port = free_port()
    cmd = [a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(a.clients),
           "--cont-batching", "-c", str(a.clients * 256), "-t", threads, "-tb", threads, "--log-disable"]  # fmt: skip
    proc = start(cmd, port)
    url = f"http://127.0.0.1:{port}"
    try:
        props = httpx.get(f"{url}/props", timeout=10).json()
        print(json.dumps({"server": "llama-server", "build": props.get("build_info")}), flush=True)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        compare(url, model, a.clients, a.max_tokens, "llama-server", a.client, a.rounds, keep_alive=False)
        reproducible(url, model, a.max_tokens)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
