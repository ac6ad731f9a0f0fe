"""A job's events -> one JSON response, or server-sent events (`data: {...}` lines, then [DONE]).

Streaming: a chunk per piece of text (or of a tool call's arguments), a last chunk per choice with
its finish_reason, and with stream_options.include_usage a final chunk with no choices and the
usage. An engine error after the stream began is an `error` event (the openai client raises it);
a client that goes away cancels the job, and its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse

from ..engine.batcher import Job

from . import outputs
from .errors import error_body
from .inputs import Plan

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
POLL_S = 0.25  # how often a plain (not streaming) response checks that its client is still there


class EngineError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


async def _events(
    http: HttpRequest, job: Job, events: asyncio.Queue, choices: list, constrained: bool, poll: bool = True
):
    """(choice index, text to show now, whether that choice has ended) until every choice has ended;
    a client gone cancels the job. A constrained row ends with its JSON, or at a stop string.

    poll: ask every POLL_S whether the client is still there (a plain response; a streaming one is
    told by Starlette, which cancels the stream, and two readers of `receive` would race)."""
    done, asked = set(), time.monotonic()
    try:
        while len(done) < len(choices):
            if poll and time.monotonic() - asked > POLL_S:
                asked = time.monotonic()
                if await http.is_disconnected():
                    return
            if not poll:  # no deadline to keep: wait_for would make a task and a timer for every token
                kind, i, payload = await events.get()
            else:
                try:
                    kind, i, payload = await asyncio.wait_for(events.get(), POLL_S)
                except asyncio.TimeoutError:
                    continue
            if kind == "error":
                raise EngineError(*payload)
            choice = choices[i]
            if i in done:
                continue
            if kind == "json":
                choice.json = payload
                done.add(i)
                yield i, "", True
                continue
            shown = choice.add(payload)
            if choice.finish_reason is not None and (payload.token is not None or not constrained):
                job.drop(i)  # a stop string, or the end of a free-text row: nothing more to read
                done.add(i)
            yield i, shown, i in done
    finally:
        job.cancel()  # every row has ended (no-op) or the client left (its rows go at the next step)


def _text_answer(choice: outputs.Choice, plan: Plan) -> bool:
    """tool_choice auto: the model answered, not called (its text does not open the call's JSON; beside
    a JSON response_format, its JSON does not open with a call's head)."""
    if plan.or_json:
        return not outputs.is_call(choice, plan.tools)
    return plan.or_text and choice.head != "{"


def _finish_reason(choice: outputs.Choice, plan: Plan) -> str:
    if _text_answer(choice, plan):
        if plan.or_json and choice.json is not None:
            return choice.json.finish_reason  # the grammar's word, as for any JSON answer
        return choice.finish_reason or "stop"
    if choice.json is not None:
        # the grammar's word: a JSON closed exactly at the budget is complete ("stop"), a cut one "length"
        return "tool_calls" if plan.tools and choice.json.valid else choice.json.finish_reason
    return choice.finish_reason or "stop"


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"


def _choices(state, body, chat: bool, want_lp: bool, top: int) -> list[outputs.Choice]:
    return [outputs.Choice(i, state.tokenizer, chat, want_lp, top) for i in range(body.n)]


async def chat_response(state, http, body, plan, request, job, events, seed):
    choices = _choices(state, body, True, body.logprobs, body.top_logprobs or 0)
    rid = outputs.response_id("chatcmpl")
    head = {**outputs.head(rid, "chat.completion", state.model_id, state.fingerprint), "seed": seed}
    constrained = request.constraint is not None
    if not body.stream:
        try:
            async for _ in _events(http, job, events, choices, constrained):
                pass
        except EngineError as e:
            return JSONResponse(error_body(e.status, e.message), status_code=e.status)
        out = []
        for c in choices:
            call = plan.tools is not None and not _text_answer(c, plan)
            calls = outputs.tool_calls(c, plan.tools, plan.wrapped) if call else None
            message = {"role": "assistant", "content": None if call else "".join(c.text)}
            if calls:
                message["tool_calls"] = calls
            reason = _finish_reason(c, plan)
            out.append({"index": c.index, "message": message, "logprobs": c.chat_logprobs(), "finish_reason": reason})
        return JSONResponse({**head, "choices": out, "usage": outputs.usage(len(request.ids), choices)})

    usage_chunk = body.stream_options is not None and body.stream_options.include_usage
    chunk = {**head, "object": "chat.completion.chunk"}

    def piece(i: int, delta: dict, reason=None, logprobs=None) -> str:
        data = {**chunk, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}
        return _sse({**data, "usage": None} if usage_chunk else data)

    async def gen():
        sent = [0] * len(choices)  # logprob entries already sent per choice
        opened = [False] * len(choices)  # one tool: whether the call's id and name went out
        held = [[] for _ in choices]  # or_json: the text, until its head says call or answer
        called: list = [None] * len(choices)  # or_json: outputs.call_state once it is decided
        try:
            for c in choices:
                yield piece(c.index, {"role": "assistant", "content": ""})
            async for i, text, ended in _events(http, job, events, choices, constrained, poll=False):
                c = choices[i]
                entries = c.logprobs[sent[i] :]
                sent[i] = len(c.logprobs)
                lp = c.chat_logprobs(entries) if entries else None
                if text and plan.or_json:
                    held[i].append(text)
                    if called[i] is None:
                        called[i] = outputs.call_state("".join(held[i]), plan.tools)
                    if called[i] is False:  # an answer: what was held, then each piece as it comes
                        yield piece(i, {"content": "".join(held[i])}, None, lp)
                        held[i] = []
                    elif lp:
                        yield piece(i, {}, None, lp)
                elif text and (not plan.tools or _text_answer(c, plan)):
                    yield piece(i, {"content": text}, None, lp)
                elif text and plan.tools and not plan.wrapped:  # one tool: its arguments as they come
                    call = {"index": 0, "function": {"arguments": text}}
                    if not opened[i]:
                        opened[i] = True
                        call = {
                            "index": 0,
                            "id": outputs.call_id(),
                            "type": "function",
                            "function": {"name": plan.tools[0], "arguments": text},
                        }
                    yield piece(i, {"tool_calls": [call]}, None, lp)
                elif lp:
                    yield piece(i, {}, None, lp)
                if ended:
                    if plan.or_json and held[i] and _text_answer(c, plan):
                        yield piece(i, {"content": "".join(held[i])})
                    if plan.wrapped and not _text_answer(c, plan):  # the call (as far as it got): at the end
                        calls = outputs.tool_calls(c, plan.tools, True)
                        if calls:
                            yield piece(i, {"tool_calls": [{"index": 0, **call} for call in calls]})
                    yield piece(i, {}, _finish_reason(c, plan))
            if usage_chunk:
                yield _sse({**chunk, "choices": [], "usage": outputs.usage(len(request.ids), choices)})
            yield "data: [DONE]\n\n"
        except EngineError as e:
            yield _sse(error_body(e.status, e.message))
            yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream", headers=SSE_HEADERS)


async def completion_response(state, http, body, plan, request, job, events, seed):
    want = body.logprobs is not None
    choices = _choices(state, body, False, want, body.logprobs or 0)
    rid = outputs.response_id("cmpl")
    head = {**outputs.head(rid, "text_completion", state.model_id, state.fingerprint), "seed": seed}
    if not body.stream:
        try:
            async for _ in _events(http, job, events, choices, False):
                pass
        except EngineError as e:
            return JSONResponse(error_body(e.status, e.message), status_code=e.status)
        out = [
            {
                "text": "".join(c.text),
                "index": c.index,
                "logprobs": c.completion_logprobs(),
                "finish_reason": c.finish_reason or "stop",
            }
            for c in choices
        ]
        return JSONResponse({**head, "choices": out, "usage": outputs.usage(len(request.ids), choices)})

    usage_chunk = body.stream_options is not None and body.stream_options.include_usage

    async def gen():
        sent = [0] * len(choices)
        try:
            async for i, text, _ in _events(http, job, events, choices, False, poll=False):
                c = choices[i]
                entries = c.logprobs[sent[i] :]
                sent[i] = len(c.logprobs)
                reason = c.finish_reason
                if text or entries or reason:
                    lp = c.completion_logprobs(entries) if entries else None
                    item = {"text": text, "index": i, "logprobs": lp, "finish_reason": reason}
                    data = {**head, "choices": [item]}
                    yield _sse({**data, "usage": None} if usage_chunk else data)
            if usage_chunk:
                yield _sse({**head, "choices": [], "usage": outputs.usage(len(request.ids), choices)})
            yield "data: [DONE]\n\n"
        except EngineError as e:
            yield _sse(error_body(e.status, e.message))
            yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream", headers=SSE_HEADERS)
