"""The explorer: the page at `/` and the JSON endpoints under /mlxinfer/ that only it needs.

    GET  /                     the page (static/index.html); its assets under /explorer/
    GET  /mlxinfer/card        the model card: what runs (model.info), `count`, `system_info`, the limits
    POST /mlxinfer/next-token  one forward pass read as `topk` reads it, with every score of the vocabulary
    POST /mlxinfer/answers     every whole answer's exact probability, as `answers --json` (server/answers.py)

The page draws seeds and generates through /v1 like any client, so those views show the server's
own engine. The JSON endpoints call the library functions the CLI calls (next_token_scores,
table_from_scores, explain, count, system_info, the answers walk), each on the engine thread (Batcher.call), and
answer errors in OpenAI's shape; with an API key they need it as /v1 does (app._Guard).

`next-token` returns the table `topk --json` prints and the scores themselves (float32,
little-endian, base64): the page recomputes softmax(s / T) and the sampler's cut from them, so a
temperature slider moves without another forward pass. The page is plain HTML, CSS and
JavaScript modules (static/), read from the package and served with a policy that lets it load
nothing but its own files.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from importlib import resources
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import defaults
from ..counting import count
from ..engine.tables import (
    check_table_args,
    explain,
    expert_routing,
    next_token_scores,
    of_model,
    table_from_scores,
)
from ..errors import MlxinferError
from ..formats.sources import embedded_model_path
from ..model.system import system_info
from ..settings import resolve_settings
from ..tokenizer import control_tokens
from . import answers
from .engine_call import on_engine
from .errors import ApiError, error_body, error_response, from_library, gone_response
from .inputs import ClientGone, prepare_within

MAX_ROWS_SHOWN = 200  # rows of the next-token table one request may ask for (each token is decoded)
MAX_TEMPERATURES = 8
# The views the page shows, in its order; the card lists them so the page builds only those the server serves.
VIEWS = ["next-token", "answers", "draws", "generate"]

ASSETS = {  # file in static/ -> its content type; nothing else is served
    "index.html": "text/html; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "sampler.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "next.js": "text/javascript; charset=utf-8",
    "answers.js": "text/javascript; charset=utf-8",
    "draws.js": "text/javascript; charset=utf-8",
    "generate.js": "text/javascript; charset=utf-8",
}
# The page loads its own files and talks to this server only; an inline script or style (text a
# prompt smuggled into the page) does not run.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class NextTokenBody(BaseModel):
    """POST /mlxinfer/next-token: `topk`'s options. Unknown fields are refused (400), so a misspelled
    setting is not silently ignored."""

    model_config = ConfigDict(strict=True, extra="forbid")
    prompt: str
    chat: bool = True
    system: Optional[str] = None
    raw_special_tokens: bool = False  # control tokens' names in the prompt read as those tokens (topk's flag)
    k: int = 10  # rows shown, by score
    temperatures: list[float] = Field(default_factory=lambda: list(defaults.TOPK_TEMPERATURES))
    # the sampler whose cut the explanation shows (unset: the model's generation_config.json, as in topk)
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None

    def settings(self) -> dict:
        return {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "min_p") if getattr(self, k) is not None}


FIELDS = {
    "prompt": "prompt",
    "system": "system",
    "chat=False": '"chat": false',
    "raw_special_tokens": "prompt",
    "raw_special_tokens=True": '"raw_special_tokens": true',
}


def routes(state, read_body) -> list[Route]:
    """The explorer's routes for create_app. state: handlers.Endpoints (model, tokenizer, batcher, model_id);
    read_body(http, Model): the app's body reader (one JSON object, checked by pydantic, errors as ApiError)."""
    model, tokenizer, batcher = state.model, state.tokenizer, state.batcher
    card: dict = {}

    def decode(i: int) -> str:
        return tokenizer.decode([i])

    async def card_route(http: HttpRequest):
        try:
            if not card:
                card.update(await on_engine(batcher, lambda: model_card(state)))
        except ApiError as e:
            return error_response(e)
        return JSONResponse(card)

    async def next_token(http: HttpRequest):
        try:
            body = await read_body(http, NextTokenBody)
            temperatures = _checked_table(body, model.config.vocab_size)
            if body.system is not None and not body.chat:
                raise ApiError(400, "system needs the chat template: send chat: true, or no system", "system")
            request = await prepare_within(
                http,
                FIELDS,
                model,
                tokenizer,
                body.prompt,
                settings=body.settings(),
                max_tokens=1,
                chat=body.chat,
                system=body.system,
                raw_special_tokens=body.raw_special_tokens,
            )

            def compute():  # on the engine thread: topk's table (cli/commands/topk.py) and the scores it came from
                scores = next_token_scores(model, request.ids)
                table = table_from_scores(scores, temperatures, body.k, decode)
                table = of_model(table, model, body.prompt, request.ids)
                table.explanation = explain(
                    scores, request.settings, body.k, decode, history=request.ids, fast=model.info.cpu_kernels
                )
                table.settings_note = request.note
                table.routing = expert_routing(model, request.ids)
                return table.to_dict(), np.asarray(scores, dtype=np.float32).astype("<f4").tobytes()

            table, raw = await on_engine(batcher, compute, http)
        except ApiError as e:
            return error_response(e)
        except ClientGone:  # it left while its prompt was prepared or prefilled: no one reads an answer
            return gone_response()
        scores = {"dtype": "float32", "byteorder": "little", "count": len(raw) // 4, "base64": _b64(raw)}
        return JSONResponse(
            {"object": "mlxinfer.next_token", "model": state.model_id, "table": table, "scores": scores}
        )

    async def answers_route(http: HttpRequest):
        try:
            found = await answers.answers_route(state, read_body, FIELDS, MAX_TEMPERATURES, http)
        except ApiError as e:
            return error_response(e)
        except ClientGone:
            return gone_response()
        return JSONResponse(found)

    async def page(http: HttpRequest):
        return _asset("index.html", http)

    async def asset(http: HttpRequest):
        name = http.path_params["name"]
        if name not in ASSETS or name == "index.html":
            return JSONResponse(error_body(404, f"no route {http.url.path}", None, "not_found"), status_code=404)
        return _asset(name, http)

    return [
        Route("/", page, methods=["GET"]),
        Route("/explorer/{name}", asset, methods=["GET"]),
        Route("/mlxinfer/card", card_route, methods=["GET"]),
        Route("/mlxinfer/next-token", next_token, methods=["POST"]),
        Route("/mlxinfer/answers", answers_route, methods=["POST"]),
    ]


def _checked_table(body: NextTokenBody, vocab: int) -> list[float]:
    answers.check_prompt_text(body.prompt)
    if isinstance(body.k, int) and not 1 <= body.k <= MAX_ROWS_SHOWN:
        raise ApiError(400, f"k must be from 1 to {MAX_ROWS_SHOWN} (rows shown), got {body.k}", "k")
    if len(body.temperatures) > MAX_TEMPERATURES:
        raise ApiError(
            400, f"temperatures takes at most {MAX_TEMPERATURES}, got {len(body.temperatures)}", "temperatures"
        )
    try:
        return check_table_args(body.temperatures, body.k, vocab)
    except MlxinferError as e:
        raise from_library(e) from None


def model_card(state) -> dict:
    """What the page's corner shows: the model, how it runs, its size (`count`) and the machine
    (`system_info`, as `mlxinfer info` prints it). On the engine thread: system_info checks the BLAS
    with an MLX matmul."""
    info, config, batcher = state.model.info, state.model.config, state.batcher
    source = info.source
    try:
        counted = count(source.path if source is not None and source.path is not None else None).to_dict()
    except MlxinferError as e:  # a model this server holds but `count` cannot read: said, not fatal
        counted = {"error": str(e)}
    return {
        "object": "mlxinfer.card",
        "model": state.model_id,
        "name": info.name,
        "architecture": config.model_type,
        "definition": info.definition,
        "compute_dtype": info.compute_dtype,
        "weights": info.weights,
        "source": None if source is None else {"kind": source.kind, "path": str(source.path or "") or None},
        "cli_model": _cli_model(source),  # what --model takes to load this model again (None: the embedded one)
        "vocab_size": config.vocab_size,
        "context": config.max_position_embeddings,
        "count": counted,
        "system": system_info(),
        "sampler": _model_sampler(info.generation_config),
        "server": {
            "max_rows": batcher.max_rows,
            "max_request_rows": batcher.max_request_rows,  # a request's n at most
            "max_queue": batcher.max_queue,
            "default_max_tokens": state.default_max_tokens,
            "max_rows_shown": MAX_ROWS_SHOWN,
            "max_temperatures": MAX_TEMPERATURES,
            "max_top_logprobs": 20,
            "max_answer_nodes": answers.MAX_NODES,
            "max_answer_seconds": answers.MAX_SECONDS,
            "answer_batch_size": defaults.BATCH_SIZE,  # paths a pass: smaller than the CLI's (server/answers.py)
            "max_answer_tokens": answers.MAX_TOKENS,
        },
        "defaults": {
            "temperatures": list(defaults.TOPK_TEMPERATURES),
            "max_tokens_sample": defaults.MAX_TOKENS_SAMPLE,
            "max_tokens_generate": defaults.MAX_TOKENS_GENERATE,
            "group": defaults.ANSWER_GROUP,
            "min_mass": defaults.EXACT_MIN_MASS,
            "max_nodes": defaults.EXACT_MAX_NODES,
        },
        "views": VIEWS,
        # the page refuses a prompt already rendered by a chat template in every view, as the CLI does
        # (tokenizer._check_not_templated); /v1's messages take such text as text
        "control_tokens": sorted(control_tokens(state.tokenizer)),
    }


def _model_sampler(generation_config) -> dict:
    """What a request that sets nothing samples with (the page starts its controls there), and why."""
    settings, note = resolve_settings(None, generation_config)
    return {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p,
            "min_p": settings.min_p, "note": note}  # fmt: skip


def _cli_model(source) -> Optional[str]:
    if source is None:
        return None
    try:
        if source.path is not None and source.path == embedded_model_path():
            return None
    except MlxinferError:  # the embedded model is not installed: this one is not it
        pass
    return str(source.path) if source.path is not None else source.name


@lru_cache(maxsize=None)
def _static(name: str) -> tuple[bytes, str]:
    data = (resources.files(__package__) / "static" / name).read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:20] + '"'


def _asset(name: str, http: HttpRequest) -> Response:
    data, etag = _static(name)
    headers = {
        "Content-Security-Policy": POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
        "ETag": etag,
    }
    if http.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=ASSETS[name], headers=headers)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
