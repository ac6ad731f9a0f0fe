"""The ASGI app: OpenAI's /v1/chat/completions, /v1/completions, /v1/models, and /health.

    app = create_app(model, tokenizer)          # Starlette; run it with uvicorn, or in-process

A request is read (one JSON object under the body limit), checked by pydantic (types) and by the
library (values: request.prepare, under the chat template's deadline), then handed to the engine
(engine/batcher.py) as one job of n rows with seeds s, s+1, ...; its events come back through an
asyncio queue and leave as one response or as server-sent events. Every error is OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Optional

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import defaults
from ..engine.batcher import Batcher, Job, QueueFull, check_bounds, check_whole
from ..engine.request import check_seed
from ..errors import MlxinferError
from .errors import ApiError, error_body, from_library, from_validation
from .inputs import ClientGone, Plan, budget, chat_plan, completion_plan, prepare_within
from .schemas import IGNORED_HEADER, ChatRequest, CompletionRequest, unknown_fields
from .stream import chat_response, completion_response

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat
log = logging.getLogger("mlxinfer.server")


class _State:
    def __init__(self, model, tokenizer, batcher: Batcher, model_id: str, default_max_tokens: Optional[int]):
        self.model, self.tokenizer, self.batcher, self.model_id = model, tokenizer, batcher, model_id
        self.names = {model_id, model.info.name}
        self.default_max_tokens = default_max_tokens
        self.preparing = 0  # requests whose schema or prompt is being prepared (or waits to be)
        self.abandoned = 0  # requests whose client left during preparation (dropped there)
        self.fingerprint = "mlxinfer-" + "-".join(model.info.definition.split()[1:]) + f"-{model.info.compute_dtype}"


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
        if self.key is not None and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
                e = ApiError(401, "a valid API key is required: Authorization: Bearer KEY", None)
                return await _send(send, e.status, e.body(), {"www-authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _send(
                send, 413, error_body(413, f"the body is over {self.limit:,} bytes", None, "request_too_large")
            )
        chunks, size = [], 0
        while scope["method"] in ("POST", "PUT", "PATCH"):
            message = await receive()
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


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _gone() -> JSONResponse:
    """The answer to a client that left during preparation: no one reads it (499, as nginx logs it)."""
    return JSONResponse(error_body(499, "the client closed the request"), status_code=499)


def _noted(response, body):
    """The response, with the body's fields that neither OpenAI nor this server defines named in a
    header (a misspelled "temprature" would otherwise pass unseen): OpenAI-compatible clients send
    other servers' extras, which a refusal would break."""
    unknown = unknown_fields(body) if body is not None else []
    if unknown:
        shown = ", ".join(unknown[:10]) + (f", and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        response.headers[IGNORED_HEADER] = shown.encode("ascii", "backslashreplace").decode("ascii")[:1000]
        log.warning("a request's fields were ignored: %s", shown)
    return response


# Deeper bodies are refused before validation: nothing OpenAI defines nests past a few levels (a
# json_schema a few dozen), and every later walk over the body (pydantic, the schema compiler) recurses.
MAX_JSON_DEPTH = 100


def _deeper_than(data, limit: int) -> bool:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


async def _body(http: HttpRequest, kind):
    raw = await http.body()
    too_deep = ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels", None)
    try:
        data = json.loads(raw)  # NaN and Infinity parse; the library refuses them, naming the field
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON ({getattr(e, 'msg', type(e).__name__)})", None) from None
    except RecursionError:  # past the parser's own limit
        raise too_deep from None
    if _deeper_than(data, MAX_JSON_DEPTH):
        raise too_deep
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", None)
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        raise from_validation(e.errors()) from None


def _check(state: _State, body) -> None:
    if body.model not in state.names:
        raise ApiError(404, f"the model '{body.model[:200]}' does not exist here; GET /v1/models lists it", "model")
    most = state.batcher.max_rows
    if not 1 <= body.n <= most:
        raise ApiError(400, f"n must be from 1 to {most} (this server's rows in flight), got {body.n}", "n")
    if body.seed is not None:
        try:
            check_seed(body.seed)
        except MlxinferError as e:
            raise from_library(e) from None
        if body.seed + body.n > defaults.SEED_LIMIT:
            raise ApiError(400, "seed + n must stay below 2**63 (rows use seeds seed..seed+n-1)", "seed")
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
    stops = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    if len(stops) > 4 or any(len(s) > 256 for s in stops):
        raise ApiError(400, "stop takes at most 4 strings of at most 256 characters", "stop")


async def _start(state: _State, http, body, plan: Plan, asked: Optional[int], fields: dict, want_lp: bool, top: int):
    """prepare (under the template deadline), the budget, the seeds, and the job queued. At most
    max_rows + max_queue requests in preparation (more could not all be served): past it, a 429."""
    if state.preparing >= state.batcher.max_rows + state.batcher.max_queue:
        raise ApiError(429, f"the server is busy ({state.preparing} requests in preparation); retry shortly",
                       None, Retry_After="1")  # fmt: skip
    state.preparing += 1
    try:
        request = await prepare_within(
            http,
            fields,
            state.model,
            state.tokenizer,
            plan.prompt,
            settings=body.settings(),
            max_tokens=asked if asked is not None else 1,
            json_schema=plan.json_schema,
            tool=plan.tool,
            or_text=plan.or_text,
            chat=plan.chat,
            system=plan.system,
            parts=plan.parts,
        )
    except ClientGone:
        state.abandoned += 1
        raise
    finally:
        state.preparing -= 1
    request = budget(request, state.model, asked, state.default_max_tokens)
    base = body.seed if body.seed is not None else secrets.randbelow(defaults.SEED_LIMIT - body.n)
    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def emit(kind, index, payload):  # on the engine thread
        loop.call_soon_threadsafe(events.put_nowait, (kind, index, payload))

    job = Job(request, [base + i for i in range(body.n)], emit, logprobs=want_lp, top_logprobs=top)
    try:
        state.batcher.submit(job)
    except QueueFull as e:
        raise ApiError(429, f"the server is busy ({e}); retry shortly", None, Retry_After="1") from None
    except MlxinferError as e:
        raise from_library(e) from None
    return request, job, events, base


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
        if self.model_name is not None and not (isinstance(self.model_name, str) and self.model_name.strip()):
            raise MlxinferError(f"model_name must be a non-empty string, got {self.model_name!r}", "model_name")
        check_bounds(self.max_rows, self.max_queue, self.prompt_cache_bytes)
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
    try:
        token_table(tokenizer)  # here, once: the grammar's token table for json_schema/tools (see inputs._Parked)
    except MlxinferError:
        pass  # a tokenizer llguidance cannot read: JSON requests say so (400), plain text is served
    batcher = Batcher(
        model, tokenizer, max_rows=o.max_rows, max_queue=o.max_queue, prompt_cache_bytes=o.prompt_cache_bytes
    )
    state = _State(model, tokenizer, batcher, o.model_name or model_id_for(model), o.default_max_tokens)

    async def health(http):
        preparation = {"preparing": state.preparing, "abandoned": state.abandoned}
        return JSONResponse({"status": "ok", "model": state.model_id, **batcher.status(), **preparation})

    async def models(http):
        card = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "mlxinfer"}
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(http):
        body = None
        try:
            body = await _body(http, ChatRequest)
            _check(state, body)
            context = state.model.config.max_position_embeddings
            if len(body.messages) > context:  # each message is at least one token of the prompt
                raise ApiError(
                    400, f"messages: {len(body.messages):,} messages cannot fit the model's context of {context:,} "
                    "tokens; send fewer", "messages",
                )  # fmt: skip
            if body.top_logprobs is not None and not (0 <= body.top_logprobs <= MAX_TOP_LOGPROBS):
                raise ApiError(400, f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
            if body.top_logprobs and not body.logprobs:
                raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
            plan = chat_plan(body)
            asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
            field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            fields = {"max_tokens": field, "logprobs": "top_logprobs"}
            if plan.wrapped and not plan.or_json:  # the one grammar is the tools' calls
                fields["json_schema"] = "tools"
            started = await _start(state, http, body, plan, asked, fields, body.logprobs, body.top_logprobs or 0)
        except ApiError as e:
            return _noted(_error(e), body)
        except ClientGone:
            return _gone()
        return _noted(await chat_response(state, http, body, plan, *started), body)

    async def completions(http):
        body = None
        try:
            body = await _body(http, CompletionRequest)
            _check(state, body)
            if body.logprobs is not None and not (0 <= body.logprobs <= MAX_TOP_LOGPROBS):
                raise ApiError(400, f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
            plan = completion_plan(body)
            fields = {"prompt": "prompt", "max_tokens": "max_tokens"}
            started = await _start(
                state, http, body, plan, body.max_tokens, fields, body.logprobs is not None, body.logprobs or 0
            )
        except ApiError as e:
            return _noted(_error(e), body)
        except ClientGone:
            return _gone()
        return _noted(await completion_response(state, http, body, plan, *started), body)

    @asynccontextmanager
    async def lifespan(app):
        yield
        batcher.close()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: _not_found, 405: _not_allowed})
    if o.cors:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(o.cors), allow_methods=["*"], allow_headers=["*"])
    guarded = _Guard(app, o.max_body_bytes, o.api_key)
    guarded.engine = state  # for tests and embedding: the model, the batcher, the served id
    return guarded


async def _not_found(http, exc):
    return JSONResponse(error_body(404, f"no route {http.url.path}", None, "not_found"), status_code=404)


async def _not_allowed(http, exc):
    return JSONResponse(error_body(405, f"{http.method} is not allowed on {http.url.path}", None), status_code=405)


__all__ = ["ServerOptions", "create_app"]
