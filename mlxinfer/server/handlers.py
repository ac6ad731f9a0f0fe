"""The endpoints: /health, /v1/models, /v1/chat/completions and /v1/completions, as methods of one
object that holds what they share (the model, the engine, the served id, preparation's counts).

A request is read (one JSON object under the body limit), checked by pydantic (types) and by the
library (values: request.prepare, off the event loop, inputs.py), then handed to the engine
(engine/batcher.py) as one job of n rows with seeds s, s+1, ...; its events come back through an
asyncio queue and leave as one response or as server-sent events (stream.py). Every error is
OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager
from typing import Optional

from pydantic import ValidationError
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse

from .. import defaults
from ..engine.batcher import Batcher, Job, QueueFull
from ..engine.request import check_seed
from ..errors import MlxinferError
from .errors import ApiError, error_response, from_library, from_validation, gone_response, refused
from .inputs import ClientGone, Plan, budget, chat_plan, completion_plan, prepare_within
from .schemas import IGNORED_HEADER, ChatRequest, CompletionRequest, peer_fields, unknown_fields
from .stream import Exchange, chat_response, completion_response, scored_response

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat
log = logging.getLogger("mlxinfer.server")


class Endpoints:
    """The app's state, and its routes as methods."""

    def __init__(self, model, tokenizer, batcher: Batcher, model_id: str, default_max_tokens: Optional[int]):
        self.model, self.tokenizer, self.batcher, self.model_id = model, tokenizer, batcher, model_id
        self.names = {model_id, model.info.name}
        self.default_max_tokens = default_max_tokens
        self.metrics = None  # metrics.Metrics, set by create_app
        self.preparing = 0  # requests whose schema or prompt is being prepared (or waits to be)
        self.abandoned = 0  # requests whose client left during preparation (dropped there)
        self.fingerprint = "mlxinfer-" + "-".join(model.info.definition.split()[1:]) + f"-{model.info.compute_dtype}"

    def check(self, body) -> None:
        """What both endpoints check before preparation: the model's name, n, the seeds, stream options, stop."""
        if body.model is not None and body.model not in self.names:
            raise self._no_model(body.model)
        most = self.batcher.max_request_rows
        if not 1 <= body.n <= most:
            raise ApiError(
                400,
                f"n must be from 1 to {most} (half this server's {self.batcher.max_rows} rows in flight: the rest stay "
                f"for other clients), got {body.n}; send more requests, each seed n past the last (choice i draws "
                "with seed + i, so seeds closer than n share draws)",
                "n",
            )
        if body.seed is not None:
            try:
                check_seed(body.seed)
            except MlxinferError as e:
                raise from_library(e) from None
            if body.seed + body.n > defaults.SEED_LIMIT:
                raise ApiError(400, "seed + n must stay below 2**63 (rows use seeds seed..seed+n-1)", "seed")
        if body.stream_options is not None and not body.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
        stops = _stops(body)
        if len(stops) > 4 or any(len(s) > 256 for s in stops):
            raise ApiError(400, "stop takes at most 4 strings of at most 256 characters", "stop")

    async def prepared(self, http, fields: dict, plan: Plan, **kwargs):
        """prepare(plan's prompt, chat and system, **kwargs) off the event loop (inputs.prepare_within). At most
        max_rows + max_queue requests in preparation (more could not all be served): past it, a 429."""
        if self.preparing >= self.batcher.max_rows + self.batcher.max_queue:
            raise ApiError(429, f"the server is busy ({self.preparing} requests in preparation); retry shortly",
                           None, Retry_After="1")  # fmt: skip
        self.preparing += 1
        try:
            return await prepare_within(
                http, fields, self.model, self.tokenizer, plan.prompt, chat=plan.chat, system=plan.system, **kwargs
            )
        except ClientGone:
            self.abandoned += 1
            raise
        finally:
            self.preparing -= 1

    async def start(self, http, body, plan: Plan, asked: Optional[int], fields: dict, want_lp: bool, top: int):
        """prepare (under the template deadline), the budget, the seeds, and the job queued."""
        started = time.perf_counter()
        request = await self.prepared(
            http,
            fields,
            plan,
            settings=body.settings(),
            max_tokens=asked if asked is not None else 1,
            json_schema=plan.json_schema,
            tool=plan.tool,
            or_text=plan.or_text,
            parts=plan.parts,
            stop=[s for s in _stops(body) if s] or None,  # an empty string stops nothing: dropped
        )
        request = budget(request, self.model, asked, self.default_max_tokens)
        # a seed it picks fits 32 bits, as chat's: a JavaScript client reads a larger one rounded (JSON numbers
        # are doubles there), and the same seed sent back drew another text
        base = body.seed if body.seed is not None else secrets.randbelow(defaults.FRESH_SEEDS)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def emit(kind, index, payload):  # on the engine thread
            loop.call_soon_threadsafe(events.put_nowait, (kind, index, payload))

        if self.metrics is not None:
            emit = self.metrics.timed(emit, started)
        job = Job(request, [base + i for i in range(body.n)], emit, logprobs=want_lp, top_logprobs=top)
        try:
            self.batcher.submit(job)
            if self.metrics is not None:
                self.metrics.prompt_tokens.inc(len(request.ids))
        except QueueFull as e:
            raise refused(e) from None
        except MlxinferError as e:
            raise from_library(e) from None
        return Exchange(self, http, body, plan, request, job, events, base)

    async def health(self, http):
        """200 while the engine takes work; 503 once it is shutting down or has stopped (a load balancer
        then sends no more requests here)."""
        preparation = {"preparing": self.preparing, "abandoned": self.abandoned}
        up = self.batcher.running
        state = "ok" if up else "shutting down" if self.batcher.stopping else "engine stopped"
        body = {"status": state, "model": self.model_id, **self.batcher.status(), **preparation}
        return JSONResponse(body, status_code=200 if up else 503)

    @staticmethod
    def _no_model(name: str) -> ApiError:
        return ApiError(404, f"the model '{name[:200]}' does not exist here; GET /v1/models lists it", "model")

    def _card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "mlxinfer"}

    async def models(self, http):
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model_card(self, http):
        """GET /v1/models/{id}: OpenAI's models.retrieve (gateways and health checks call it)."""
        name = http.path_params["name"]
        if name not in self.names:
            return JSONResponse(self._no_model(name).body(), status_code=404)
        return JSONResponse(self._card())

    async def chat(self, http):
        body = None
        try:
            body = await read_body(http, ChatRequest)
            self.check(body)
            context = self.model.config.max_position_embeddings
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
            exchange = await self.start(http, body, plan, asked, fields, body.logprobs, body.top_logprobs or 0)
        except ApiError as e:
            return _noted(error_response(e), body)
        except ClientGone:
            return gone_response()
        return _noted(await chat_response(exchange), body)

    async def completions(self, http):
        body = None
        try:
            body = await read_body(http, CompletionRequest)
            self.check(body)
            if body.logprobs is not None and not (0 <= body.logprobs <= MAX_TOP_LOGPROBS):
                raise ApiError(400, f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
            plan = completion_plan(body)
            fields = {"prompt": "prompt", "max_tokens": "max_tokens"}
            if body.echo and body.max_tokens == 0:  # the prompt scored, nothing generated (lm-evaluation-harness)
                return _noted(await scored_response(await self.scored(http, body, plan, fields)), body)
            exchange = await self.start(
                http, body, plan, body.max_tokens, fields, body.logprobs is not None, body.logprobs or 0
            )
            return _noted(await completion_response(exchange), body)
        except ApiError as e:  # an echo's prompt log-probabilities are computed once the rows have ended
            return _noted(error_response(e), body)
        except ClientGone:
            return gone_response()

    async def scored(self, http, body, plan: Plan, fields: dict) -> Exchange:
        """echo with max_tokens 0, as OpenAI's legacy completions take it: the prompt prepared as any (a token
        of room asked for: the same context check), for its log-probabilities alone; no job, no draw."""
        request = await self.prepared(http, fields, plan, settings=body.settings(), max_tokens=1)
        seed = body.seed if body.seed is not None else 0
        return Exchange(self, http, body, plan, request, None, None, seed)

    @asynccontextmanager
    async def lifespan(self, app):
        yield
        await asyncio.to_thread(self.batcher.close)  # the engine ends its step or chunk: the loop goes on meanwhile


def _stops(body) -> list:
    """The request's stop strings as a list (OpenAI takes one string, a list of them, or null)."""
    return [body.stop] if isinstance(body.stop, str) else (body.stop or [])


def _noted(response, body):
    """The response, with the body's fields that neither OpenAI nor this server defines named in a
    header (a misspelled "temprature" would otherwise pass unseen): OpenAI-compatible clients send
    other servers' extras, which a refusal would break."""
    unknown = unknown_fields(body) if body is not None else []
    if unknown:
        shown = ", ".join(unknown[:10]) + (f", and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        # escaped: a header holds printable ASCII only (a name with a line break was no response at all)
        shown = shown.encode("unicode_escape").decode("ascii")
        response.headers[IGNORED_HEADER] = shown[:1000]
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


async def read_body(http: HttpRequest, kind):
    raw = await http.body()
    too_deep = ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels", None)
    try:
        data = json.loads(raw)  # NaN and Infinity parse; the library refuses them, naming the field
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON ({getattr(e, 'msg', type(e).__name__)})", None) from None
    except RecursionError:  # past the parser's own limit
        raise too_deep from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits (was a 500)
        raise ApiError(400, f"the body holds a number too long to read ({e})", None) from None
    if _deeper_than(data, MAX_JSON_DEPTH):
        raise too_deep
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", None)
    try:
        openai = kind in (ChatRequest, CompletionRequest)  # the explorer's bodies are its own
        return kind.model_validate(peer_fields(data, chat=kind is ChatRequest) if openai else data)
    except ValidationError as e:
        raise from_validation(e.errors()) from None
