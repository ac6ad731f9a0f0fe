"""POST /mlxinfer/answers: `mlxinfer answers` for the explorer's view of whole answers.

The body takes what the command takes (the prompt and its chat options, the temperatures, one cut for
all of them, max_tokens, min_mass, max_nodes, group), is checked as the library checks it (each error a
400 naming the field), and the answer is the report `answers --json` prints. The walk is the library's
own (engine/answers.AnswerWalk), run on the engine thread one step at a time: its start (the prompt's
prefill and the first children) is one engine call and each batch of paths is another, so decode steps
and other requests run between two of its steps. No request can hold the server long: max_nodes is
bounded by MAX_NODES, and a walk ends after MAX_SECONDS (or the body's max_seconds, when less), saying
so (`stopped`: "max_nodes", "max_seconds") with its remainder, which bounds whatever it did not walk.
A walk whose client leaves stops at its next step.
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request as HttpRequest

from .. import defaults
from ..engine.answers import AnswerWalk, check_walk
from ..errors import MlxinferError, check_listed_once
from ..settings import check_temperature, resolve_settings
from .engine_call import on_engine
from .errors import ApiError, from_library
from .inputs import ClientGone, prepare_within

MAX_NODES = defaults.EXACT_MAX_NODES  # paths one walk may expand (each keeps its last token's keys and values)
MAX_SECONDS = 60.0  # a walk's time budget, waiting between its steps included
MAX_TOKENS = 64  # tokens per answer at most
BUSY_WAIT_S = 0.05  # a walk under way whose next step finds the queue full waits this long and asks again


class AnswersBody(BaseModel):
    """The body: `answers`' options. Unknown fields are refused (400)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    prompt: str
    chat: bool = True
    system: Optional[str] = None
    temperatures: list[float] = Field(default_factory=lambda: list(defaults.TOPK_TEMPERATURES))
    # one cut for every temperature (unset: the model's generation_config.json, as in the CLI)
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    max_tokens: int = defaults.MAX_TOKENS_SAMPLE
    min_mass: float = defaults.EXACT_MIN_MASS
    max_nodes: int = defaults.EXACT_MAX_NODES
    max_seconds: Optional[float] = None  # at most MAX_SECONDS, the default
    group: str = defaults.ANSWER_GROUP

    def cut(self) -> dict:
        return {k: getattr(self, k) for k in ("top_k", "top_p", "min_p") if getattr(self, k) is not None}


def check_prompt_text(prompt: str) -> None:
    """The page's prompt is text to read, as the CLI's -p is: not empty or blank."""
    if not prompt.strip():
        raise ApiError(400, "prompt is empty; give the text to read", "prompt")


def checked_settings(body: AnswersBody, generation_config, max_temperatures: int) -> list:
    """The body's bounds and settings checked, before anything runs: one SamplerSettings per temperature."""
    temperatures = body.temperatures
    check_prompt_text(body.prompt)
    if not temperatures:
        raise ApiError(400, "temperatures is empty; give at least one, e.g. [0.5, 1, 1.5]", "temperatures")
    try:
        check_listed_once(temperatures, "temperatures")
    except MlxinferError as e:
        raise from_library(e) from None
    if len(temperatures) > max_temperatures:
        raise ApiError(400, f"temperatures takes at most {max_temperatures}, got {len(temperatures)}", "temperatures")
    if not 1 <= body.max_tokens <= MAX_TOKENS:
        raise ApiError(400, f"max_tokens must be from 1 to {MAX_TOKENS} here, got {body.max_tokens}", "max_tokens")
    if body.max_nodes > MAX_NODES:
        raise ApiError(400, f"max_nodes is at most {MAX_NODES:,} on this server, got {body.max_nodes:,}", "max_nodes")
    if body.max_seconds is not None and body.max_seconds > MAX_SECONDS:
        raise ApiError(
            400, f"max_seconds is at most {MAX_SECONDS:g} on this server, got {body.max_seconds:g}", "max_seconds"
        )
    if body.system is not None and not body.chat:
        raise ApiError(400, "system needs the chat template: send chat: true, or no system", "system")
    try:
        check_walk(body.min_mass, body.max_nodes, body.group, body.max_seconds)
        grid = [{**body.cut(), "temperature": check_temperature(t, "temperatures")} for t in temperatures]
        return [resolve_settings(s, generation_config)[0] for s in grid]
    except MlxinferError as e:
        raise from_library(e) from None


async def answers_route(state, read_body, fields: dict, max_temperatures: int, http: HttpRequest) -> dict:
    """The walk for one request, a step per engine call; the JSON answer (or an ApiError, ClientGone)."""
    model, tokenizer, batcher = state.model, state.tokenizer, state.batcher
    body = await read_body(http, AnswersBody)
    settings = checked_settings(body, model.info.generation_config, max_temperatures)
    request = await prepare_within(
        http, fields, model, tokenizer, body.prompt, max_tokens=body.max_tokens, chat=body.chat, system=body.system
    )
    budget = MAX_SECONDS if body.max_seconds is None else body.max_seconds
    # passes of the sampling batch's size, not the library walk's larger default: the decode steps of other
    # requests wait while a pass runs (the explorer's copied command says --batch-size, so it walks alike)
    walk = await on_engine(
        batcher,
        lambda: AnswerWalk(
            model, tokenizer, request, settings, body.min_mass, body.max_nodes, defaults.BATCH_SIZE, body.group,
            None, budget,
        ),
        http,
    )  # fmt: skip
    calls = 1

    def advance():  # one batch of paths; at the end, the report (and the walk's arrays let go here)
        if walk.step():
            return None
        report = walk.report(body.prompt).to_dict()
        _release(walk)
        return report

    try:
        while True:
            if await http.is_disconnected():
                raise ClientGone
            try:
                report = await on_engine(batcher, advance)
            except ApiError as e:
                if e.status != 429 or time.perf_counter() - walk.started >= budget:
                    raise  # a queue full past the walk's whole budget: the 429, as a full queue at the start
                await asyncio.sleep(BUSY_WAIT_S)  # the queue is full: the walk waits, its budget runs on
                continue
            calls += 1
            if report is not None:
                break
    except BaseException:
        walk.stopped = walk.stopped or "interrupted"
        _release_later(batcher, walk)
        raise
    return {
        "object": "mlxinfer.answers",
        "model": state.model_id,
        "report": report,
        "engine_calls": calls,
        "limits": {"max_nodes": MAX_NODES, "max_seconds": budget, "max_tokens": MAX_TOKENS},
    }


def _release(walk: AnswerWalk) -> None:
    """Drop the walk's MLX arrays (every node's keys and values, the prompt's cache, the passes' buffers) on
    the engine thread."""
    walk.root = walk.prompt = walk.rows = None
    walk.frontiers, walk.found = [], {}


def _release_later(batcher, walk: AnswerWalk) -> None:
    try:
        batcher.call(lambda: _release(walk))
    except Exception:  # noqa: BLE001 - the engine is full or closing: the arrays go with the walk
        pass
