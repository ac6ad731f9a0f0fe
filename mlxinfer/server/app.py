"""The ASGI app: OpenAI's /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics.

    app = create_app(model, tokenizer)          # Starlette; run it with uvicorn, or in-process

create_app checks the options (ServerOptions), starts the engine (engine/batcher.py) and routes each
path to a method of handlers.Endpoints; _Guard, in front, keeps the body limit and the API key; CORS,
where allowed, is in front of the guard (a browser's preflight carries no key, and a 401 or 413 must
carry the CORS headers for the page to read it); metrics.Counted, in front of all, counts every
response for /metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from dataclasses import dataclass, fields
from typing import Optional

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import defaults
from ..engine.batcher import Batcher, check_bounds
from ..engine.decode import check_pass_fits
from ..errors import MlxinferError, check_whole
from ..model.dtype_rule import physical_ram_bytes
from .errors import ApiError, error_body
from .explorer import routes as explorer_routes
from .handlers import Endpoints, read_body
from .metrics import Counted, Metrics

BODY_TIMEOUT_S = 60.0  # a request's whole body, from its headers on
GUARDED = ("/v1", "/mlxinfer/", "/metrics")  # the paths an API key guards (the explorer's page and assets are open)


def model_id_for(model) -> str:
    """The id clients send as `model`: the model's name without its parenthesised note."""
    return model.info.name.split(" (")[0].strip() or "mlxinfer"


class _Guard:
    """Pure ASGI middleware: the body limit (413) and the Bearer key (401), before any parsing.

    The body is read here up to the limit and handed on whole; after it, the app's receive is the
    server's own again, so a streaming response still hears the client disconnect."""

    def __init__(self, app, max_body_bytes: int, api_key: Optional[str]):
        self.app, self.limit, self.key = app, max_body_bytes, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.key is not None and scope["path"].startswith(GUARDED):
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            # the scheme is case-insensitive (RFC 9110, 11.1); the key is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.lstrip(" ").encode(), self.key.encode()):
                e = ApiError(401, "a valid API key is required: Authorization: Bearer KEY", None)
                return await _send(send, e.status, e.body(), {"www-authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _send(
                send, 413, error_body(413, f"the body is over {self.limit:,} bytes", None, "request_too_large")
            )
        chunks, size = [], 0
        deadline = time.monotonic() + BODY_TIMEOUT_S
        while scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:  # a body cut short held its request and connection for ever
                e = ApiError(408, f"the request's body did not arrive within {BODY_TIMEOUT_S:g} s; send it whole")
                return await _send(send, e.status, e.body(), {"connection": "close"})
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await _send(
                    send, 413, error_body(413, f"the body is over {self.limit:,} bytes", None, "request_too_large")
                )
            if not message.get("more_body", False):
                break
        body, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _send(send, status: int, body: dict, headers: Optional[dict] = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-fA-F:.]+\]|[^/?#:@\s\[\]]+)(:\d{1,5})?")


@dataclass(frozen=True)
class ServerOptions:
    """What create_app and serve take besides the model, declared once: each is checked when the
    options are made (serve makes them before a model loads)."""

    api_key: Optional[str] = None  # required as a Bearer token on /v1
    max_rows: int = defaults.SERVE_MAX_ROWS  # rows (seeds) in flight at most
    max_queue: int = defaults.SERVE_MAX_QUEUE  # requests waiting at most; past it: 429
    cors: Optional[list[str]] = None  # origins allowed by CORS; none by default
    model_name: Optional[str] = None  # the id clients send as `model` (default: the model's name)
    max_body_bytes: int = defaults.SERVE_MAX_BODY_BYTES  # the largest request body; past it: 413
    default_max_tokens: Optional[int] = None  # the budget when a request sets none (None: up to the context)
    prompt_cache_bytes: int = defaults.SERVE_PROMPT_CACHE_BYTES  # prefilled prompts kept for repeats; 0: none

    def __post_init__(self):
        key = self.api_key
        if key is not None and not (
            isinstance(key, str) and key and key.isascii() and key.isprintable() and " " not in key
        ):
            # an empty key would let "Authorization: Bearer " in, with no warning that the server is open
            raise MlxinferError("api_key must be printable ASCII without spaces, not empty (Bearer KEY)", "api_key")
        cors = self.cors
        if cors is not None and not (isinstance(cors, (list, tuple)) and all(isinstance(o, str) and o for o in cors)):
            raise MlxinferError(f"cors must be a list of origins, e.g. ['http://localhost:3000'], got {cors!r}", "cors")
        for origin in cors or ():  # a browser sends scheme://host[:port] exactly (null from a file): else no match
            if origin not in ("*", "null") and not _ORIGIN.fullmatch(origin):
                why = "scheme://host[:port] with no path, null or *"
                raise MlxinferError(f"cors takes origins as a browser sends them ({why}), got {origin!r:.80}", "cors")
        if self.model_name is not None and not (isinstance(self.model_name, str) and self.model_name.strip()):
            raise MlxinferError(f"model_name must be a non-empty string, got {self.model_name!r}", "model_name")
        check_bounds(self.max_rows, self.max_queue, self.prompt_cache_bytes)
        ram = physical_ram_bytes()
        if ram is not None and self.prompt_cache_bytes > ram:
            raise MlxinferError(
                f"prompt_cache_bytes ({self.prompt_cache_bytes / 1e9:,.1f} GB) is more than this machine's memory "
                f"({ram / 1e9:,.1f} GB); keep it well under that",
                "prompt_cache_bytes",
            )
        check_whole(self.max_body_bytes, "max_body_bytes", 1, "at least 1")
        if self.default_max_tokens is not None:
            check_whole(self.default_max_tokens, "default_max_tokens", 1, "at least 1 (or unset: up to the context)")

    @classmethod
    def of(cls, given: dict) -> "ServerOptions":
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise MlxinferError(f"the server has no option {unknown[0]!r}; its options: {', '.join(names)}")
        return cls(**given)


def create_app(model, tokenizer, options: Optional[ServerOptions] = None, **given):
    """An ASGI app serving `model`: one engine thread (batcher.Batcher) with at most `max_rows` rows in
    flight and `max_queue` requests waiting. `options`: a ServerOptions, or its fields as keywords
    (create_app(model, tokenizer, max_rows=8, api_key="..."))."""
    from ..engine.constrain import token_table

    if options is not None and given:
        raise MlxinferError("give create_app a ServerOptions or its fields as keywords, not both")
    o = options if options is not None else ServerOptions.of(given)
    check_pass_fits(model, o.max_rows, "max_rows")  # a request of n rows runs them in one pass
    try:
        token_table(tokenizer)  # here, once: the grammar's token table for json_schema/tools (see inputs._Parked)
    except MlxinferError:
        pass  # a tokenizer llguidance cannot read: JSON requests say so (400), plain text is served
    batcher = Batcher(
        model, tokenizer, max_rows=o.max_rows, max_queue=o.max_queue, prompt_cache_bytes=o.prompt_cache_bytes
    )
    endpoints = Endpoints(model, tokenizer, batcher, o.model_name or model_id_for(model), o.default_max_tokens)
    endpoints.metrics = metrics = Metrics(endpoints)

    routes = [
        Route("/health", endpoints.health, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Route("/v1/models", endpoints.models, methods=["GET"]),
        Route("/v1/models/{name:path}", endpoints.model_card, methods=["GET"]),
        Route("/v1/chat/completions", endpoints.chat, methods=["POST"]),
        Route("/v1/completions", endpoints.completions, methods=["POST"]),
        *explorer_routes(endpoints, read_body),
    ]
    metrics.routes = routes
    app = Starlette(routes=routes, lifespan=endpoints.lifespan, exception_handlers={404: _not_found, 405: _not_allowed})
    guarded = _Guard(app, o.max_body_bytes, o.api_key)
    if o.cors:
        from starlette.middleware.cors import CORSMiddleware

        guarded = CORSMiddleware(guarded, allow_origins=list(o.cors), allow_methods=["*"], allow_headers=["*"])
    counted = Counted(guarded, metrics)
    counted.engine = endpoints  # for tests and embedding: the model, the batcher, the served id, the metrics
    return counted


async def _not_found(http, exc):
    path = http.url.path if len(http.url.path) <= 200 else http.url.path[:200] + "..."  # not an 80 KB echo
    return JSONResponse(error_body(404, f"no route {path}", None, "not_found"), status_code=404)


async def _not_allowed(http, exc):
    return JSONResponse(error_body(405, f"{http.method} is not allowed on {http.url.path}", None), status_code=405)


__all__ = ["ServerOptions", "create_app"]
