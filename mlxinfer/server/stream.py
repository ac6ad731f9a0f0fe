"""A job's events -> one JSON response, or server-sent events (`data: {...}` lines, then [DONE]).

Streaming: a chunk per piece of text (or of a tool call's arguments), a last chunk per choice with
its finish_reason, and with stream_options.include_usage a final chunk with no choices and the
usage. An engine error after the stream began is an `error` event (the openai client raises it);
a client that goes away cancels the job, and its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse

from .. import defaults
from ..engine.batcher import Job
from ..engine.reading import prompt_logprobs
from ..engine.request import Request

from . import outputs
from .engine_call import on_engine
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


@dataclass
class Exchange:
    """One request on its way out: the endpoints' state (the tokenizer, the served id), the client,
    the body and its plan, the prepared request, its job in the engine, the engine's events for it,
    and its first seed."""

    endpoints: Any
    http: HttpRequest
    body: Any
    plan: Plan
    request: Request
    job: Job
    events: asyncio.Queue
    seed: int

    def choices(self, chat: bool, want_lp: bool, top: int) -> list[outputs.Choice]:
        """One per row; the engine has cut their text at the stop strings (core.Row)."""
        return [outputs.Choice(i, self.endpoints.tokenizer, chat, want_lp, top) for i in range(self.body.n)]

    def head(self, prefix: str, kind: str) -> dict:
        e = self.endpoints
        return {**outputs.head(outputs.response_id(prefix), kind, e.model_id, e.fingerprint), "seed": self.seed}

    def usage(self, choices: list) -> dict:
        return outputs.usage(len(self.request.ids), choices)

    def events_of(self, choices: list, constrained: bool, poll: bool = True):
        return _events(self.http, self.job, self.events, choices, constrained, poll)

    @property
    def include_usage(self) -> bool:
        return self.body.stream_options is not None and self.body.stream_options.include_usage

    async def whole(self, choices: list, constrained: bool) -> Optional[JSONResponse]:
        """Every event read into `choices` (a plain response); an engine error as its response."""
        try:
            async for _ in self.events_of(choices, constrained):
                pass
        except EngineError as e:
            return JSONResponse(error_body(e.status, e.message), status_code=e.status)
        return None

    def stream(self, pieces: AsyncIterator[str], usage: Callable[[], dict]) -> StreamingResponse:
        """The response's events: each piece, then with include_usage the usage chunk, then [DONE]; an
        engine error after the stream began is an error event before [DONE]."""

        sending = [None]  # since when the last piece has waited for the client to take it (None: not waiting)

        async def framed():
            watch = asyncio.create_task(self._stalled(sending))
            try:
                async for piece in pieces:
                    sending[0] = time.monotonic()
                    yield piece
                    sending[0] = None
                if self.include_usage:
                    yield _sse(usage())
            except EngineError as e:
                yield _sse(error_body(e.status, e.message))
            finally:
                watch.cancel()
            yield "data: [DONE]\n\n"

        return StreamingResponse(framed(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _stalled(self, sending: list) -> None:
        """A client that keeps its connection but takes none of the stream for defaults.SERVE_STALLED_S
        (the socket's buffers full) gives its rows up: held, they made every other request wait for its
        max_tokens. If it reads again, its stream ends with an error event."""
        limit = defaults.SERVE_STALLED_S
        while True:
            await asyncio.sleep(limit / 4)
            since = sending[0]
            if since is not None and time.monotonic() - since > limit:
                self.job.cancel()  # its rows leave the batch at the next step
                message = f"the client took none of the stream for {limit:g} s; the rest of it is dropped"
                self.events.put_nowait(("error", 0, (408, message)))
                return


class _StreamedRow:
    """One choice as it streams: its Choice, the logprob entries already sent, and for a chat (tools):
    whether one tool's call id and name went out, and beside a JSON response_format the text held until
    its head says call or answer (outputs.call_state, once decided)."""

    def __init__(self, choice: outputs.Choice):
        self.choice, self.sent = choice, 0
        self.opened = False
        self.held: list[str] = []
        self.called: Optional[bool] = None

    def new_entries(self) -> list:
        entries = self.choice.logprobs[self.sent :]
        self.sent = len(self.choice.logprobs)
        return entries


# ----------------------------------------------------------------------------- chat
async def chat_response(ex: Exchange):
    plan, body = ex.plan, ex.body
    choices = ex.choices(True, body.logprobs, body.top_logprobs or 0)
    head = ex.head("chatcmpl", "chat.completion")
    constrained = ex.request.constraint is not None
    if not body.stream:
        failed = await ex.whole(choices, constrained)
        return failed or JSONResponse(
            {**head, "choices": [_chat_choice(c, plan) for c in choices], "usage": ex.usage(choices)}
        )
    chunk = {**head, "object": "chat.completion.chunk"}

    def piece(i: int, delta: dict, reason=None, logprobs=None) -> str:
        data = {**chunk, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}
        return _sse({**data, "usage": None} if ex.include_usage else data)

    async def pieces():
        rows = [_StreamedRow(c) for c in choices]
        for c in choices:
            yield piece(c.index, {"role": "assistant", "content": ""})
        async for i, text, ended in ex.events_of(choices, constrained, poll=False):
            row, c = rows[i], choices[i]
            entries = row.new_entries()
            lp = c.chat_logprobs(entries) if entries else None
            for out in _chat_pieces(row, plan, text, lp, piece):
                yield out
            if ended:
                for out in _chat_end(row, plan, piece):
                    yield out

    return ex.stream(pieces(), lambda: {**chunk, "choices": [], "usage": ex.usage(choices)})


def _chat_choice(c: outputs.Choice, plan: Plan) -> dict:
    """One choice of a plain chat response: the text, or the tool call."""
    call = plan.tools is not None and not _text_answer(c, plan)
    calls = outputs.tool_calls(c, plan.tools, plan.wrapped) if call else None
    message = {"role": "assistant", "content": None if call else "".join(c.text)}
    if calls:
        message["tool_calls"] = calls
    return {
        "index": c.index,
        "message": message,
        "logprobs": c.chat_logprobs(),
        "finish_reason": _finish_reason(c, plan),
    }


def _chat_pieces(row: _StreamedRow, plan: Plan, text: str, lp, piece):
    """The chunks for one piece of a row's text: content, one tool's arguments as they come, or held."""
    c, i = row.choice, row.choice.index
    if text and plan.or_json:
        row.held.append(text)
        if row.called is None:
            row.called = outputs.call_state("".join(row.held), plan.tools)
        if row.called is False:  # an answer: what was held, then each piece as it comes
            yield piece(i, {"content": "".join(row.held)}, None, lp)
            row.held = []
        elif lp:
            yield piece(i, {}, None, lp)
    elif text and (not plan.tools or _text_answer(c, plan)):
        yield piece(i, {"content": text}, None, lp)
    elif text and plan.tools and not plan.wrapped:  # one tool: its arguments as they come
        call = {"index": 0, "function": {"arguments": text}}
        if not row.opened:
            row.opened = True
            call = {"index": 0, "id": outputs.call_id(), "type": "function",
                    "function": {"name": plan.tools[0], "arguments": text}}  # fmt: skip
        yield piece(i, {"tool_calls": [call]}, None, lp)
    elif lp:
        yield piece(i, {}, None, lp)


def _chat_end(row: _StreamedRow, plan: Plan, piece):
    """A row's last chunks: what was held, a wrapped call (as far as it got), the finish_reason."""
    c, i = row.choice, row.choice.index
    if plan.or_json and row.held and _text_answer(c, plan):
        yield piece(i, {"content": "".join(row.held)})
    if plan.wrapped and not _text_answer(c, plan):
        calls = outputs.tool_calls(c, plan.tools, True)
        if calls:
            yield piece(i, {"tool_calls": [{"index": 0, **call} for call in calls]})
    yield piece(i, {}, _finish_reason(c, plan))


# ----------------------------------------------------------------------------- completions
async def completion_response(ex: Exchange):
    body = ex.body
    choices = ex.choices(False, body.logprobs is not None, body.logprobs or 0)
    head = ex.head("cmpl", "text_completion")
    if not body.stream:
        failed = await ex.whole(choices, False)
        if failed:
            return failed
        prompt, read = await _echoed(ex) if body.echo else ("", None)
        out = [  # a completion's text continues its prompt's (core.continues): echo puts the prompt before it
            {"text": prompt + "".join(c.text), "index": c.index,
             "logprobs": _after(read, c.completion_logprobs(), len(prompt)), "finish_reason": c.finish_reason or "stop"}
            for c in choices
        ]  # fmt: skip
        return JSONResponse({**head, "choices": out, "usage": ex.usage(choices)})

    async def pieces():
        rows = [_StreamedRow(c) for c in choices]
        async for i, text, _ in ex.events_of(choices, False, poll=False):
            c, entries = choices[i], rows[i].new_entries()
            if text or entries or c.finish_reason:
                lp = c.completion_logprobs(entries) if entries else None
                item = {"text": text, "index": i, "logprobs": lp, "finish_reason": c.finish_reason}
                data = {**head, "choices": [item]}
                yield _sse({**data, "usage": None} if ex.include_usage else data)

    return ex.stream(pieces(), lambda: {**head, "choices": [], "usage": ex.usage(choices)})


async def scored_response(ex: Exchange):
    """echo with max_tokens 0: each choice is the prompt with its log-probabilities, nothing generated."""
    prompt, read = await _echoed(ex)
    head = ex.head("cmpl", "text_completion")
    out = [{"text": prompt, "index": i, "logprobs": read, "finish_reason": "length"} for i in range(ex.body.n)]
    return JSONResponse({**head, "choices": out, "usage": outputs.usage(len(ex.request.ids), [])})


async def _echoed(ex: Exchange) -> tuple[str, Optional[dict]]:
    """echo: the prompt's text, and with logprobs each prompt token's log-probability given those before
    it (the first has none: null), as OpenAI's legacy completions and vLLM return them; what
    lm-evaluation-harness reads to score a continuation. One forward pass over the prompt, on the engine.
    The text and each token's offset come from one streaming detokenizer over the prompt's ids (a running
    sum of tokens decoded alone drifts: a BOS token the text lacks, a character split across tokens)."""
    e = ex.endpoints
    text, offsets = _detokenized(e.tokenizer, ex.request.ids)
    sent = ex.plan.prompt if isinstance(ex.plan.prompt, str) else e.tokenizer.decode(ex.request.ids)  # (ids)
    if sent != text and sent.endswith(text):  # the first token's leading space
        lead = len(sent) - len(text)  # (the detokenizer drops it at the start of a text) is the prompt's
        text, offsets = sent, offsets[:1] + [o + lead for o in offsets[1:]]
    if ex.body.logprobs is None:
        return text, None
    top = ex.body.logprobs
    read = await on_engine(e.batcher, lambda: prompt_logprobs(e.model, e.tokenizer, ex.request.ids, top=top), ex.http)
    return text, {
        "tokens": [t.text for t in read.tokens],
        "token_logprobs": [t.logprob for t in read.tokens],
        "top_logprobs": [
            None if t.logprob is None else {a.text: a.logprob for a in t.alternatives} for t in read.tokens
        ],
        "text_offset": offsets,
    }


def _detokenized(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """The text of `ids` as the engine's rows detokenize, and where each token's text starts in it."""
    detok = copy.copy(tokenizer.detokenizer)
    detok.reset()
    offsets = []
    for t in ids:
        offsets.append(len(detok.text))
        detok.add_token(t)
    detok.finalize()
    return detok.text, [min(o, len(detok.text)) for o in offsets]


def _after(prompt: Optional[dict], completion: Optional[dict], shift: int) -> Optional[dict]:
    """The prompt's log-probabilities, then the completion's (its text offsets moved past the prompt)."""
    if prompt is None or completion is None:
        return completion
    return {
        "tokens": prompt["tokens"] + completion["tokens"],
        "token_logprobs": prompt["token_logprobs"] + completion["token_logprobs"],
        "top_logprobs": prompt["top_logprobs"] + completion["top_logprobs"],
        "text_offset": prompt["text_offset"] + [o + shift for o in completion["text_offset"]],
    }
