"""GET /metrics: the server's counters in Prometheus' text format (prometheus_client).

Each app has a registry of its own (not prometheus_client's global one), so that several apps in one
process (tests, an embedding) count apart. What is counted:

- requests by endpoint and status, and 4xx/5xx by endpoint (at the outermost layer, so the API key's
  401 and the body limit's 413 count too; a path no route serves is endpoint "other", as are the answers
  protocol.py sends without the app: a 400 for what is no HTTP, a 408 for headers that never arrive whole);
- prompt tokens per request queued, generated tokens as the engine draws them;
- time to first token (from the start of the request's preparation to its row's first token) and the
  time between a row's tokens, as histograms;
- the engine's queue depth, rows in flight and requests in preparation, read at each scrape.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.responses import Response

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self, endpoints):
        self.routes: list = []  # the app's routes (set once they are made): a request's endpoint is its route's path
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mlxinfer_requests", "HTTP requests answered, by endpoint and status.", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "mlxinfer_request_errors", "Requests answered 4xx or 5xx, by endpoint.", ["endpoint", "kind"], registry=r
        )
        self.prompt_tokens = Counter("mlxinfer_prompt_tokens", "Prompt tokens of the requests queued.", registry=r)
        self.generated_tokens = Counter("mlxinfer_generated_tokens", "Tokens generated, every row.", registry=r)
        self.ttft = Histogram(
            "mlxinfer_time_to_first_token_seconds",
            "From a request's preparation to each of its rows' first token.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.per_token = Histogram(
            "mlxinfer_time_per_output_token_seconds",
            "Time between two tokens of one row.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        status = endpoints.batcher.status
        Gauge("mlxinfer_queue_depth", "Requests waiting for rows.", registry=r).set_function(lambda: status()["queued"])
        Gauge("mlxinfer_rows_in_flight", "Rows (seeds) being decoded.", registry=r).set_function(
            lambda: status()["rows_in_flight"]
        )
        Gauge(
            "mlxinfer_requests_preparing", "Requests whose prompt or schema is being prepared.", registry=r
        ).set_function(lambda: endpoints.preparing)
        Gauge(
            "mlxinfer_requests_prefilling",
            "Requests whose prompt the engine is prefilling (or explorer calls it runs).",
            registry=r,
        ).set_function(lambda: status()["prefilling"])
        Gauge(
            "mlxinfer_engine_up", "1 while the engine takes work, 0 once it is stopping or stopped.", registry=r
        ).set_function(lambda: float(endpoints.batcher.running))

    def answered(self, path: str, status: int) -> None:
        endpoint = next((r.path for r in self.routes if r.path_regex.match(path)), "other")
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint, "5xx" if status >= 500 else "4xx").inc()

    def timed(self, emit: Callable, started: float) -> Callable:
        """`emit` (a job's listener, called on the engine thread), also timing each row's tokens."""
        last: dict[Optional[int], float] = {}

        def timed_emit(kind, index, payload):
            if kind == "step" and payload.token is not None:
                now = time.perf_counter()
                before = last.get(index)
                if before is None:
                    self.ttft.observe(now - started)
                else:
                    self.per_token.observe(now - before)
                last[index] = now
                self.generated_tokens.inc()
            emit(kind, index, payload)

        return timed_emit

    async def endpoint(self, http):
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class Counted:
    """Pure ASGI middleware, outermost: every response's status, by endpoint."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = {"status": None}

        async def counted_send(message):
            if message["type"] == "http.response.start" and seen["status"] is None:
                seen["status"] = message["status"]
                self.metrics.answered(scope["path"], message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        except Exception:
            if seen["status"] is None:  # Starlette's error middleware answers 500 after this
                self.metrics.answered(scope["path"], 500)
            raise
