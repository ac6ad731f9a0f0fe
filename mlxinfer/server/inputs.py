"""A request body -> the arguments of engine/request.py's `prepare`, and prepare run off the event loop.

Nothing here re-checks what the library checks (settings, schemas, the context, special tokens in
user text): the body is translated into prepare's arguments and prepare's MlxinferError becomes a
400 naming the request's field (errors.from_library). What is bounded here is what one request may
ask of preparation before the library sees it: at most MAX_TOOLS tools (OpenAI's bound), each tool's
name by OpenAI's rule (engine/schema.py's TOOL_NAME), at most one message per token of the context,
each tool's schema within the grammar engine's bounds (engine/schema_bounds.py) and named by its own field.

Preparation runs on two worker threads, off the event loop: a request's schema compiles on the
grammar thread, then its prompt is rendered and encoded on the template thread (the chat template
under the library's own deadline, tokenizer.py; one at a time, because transformers' encode sets a
flag on the shared tokenizer, split_special_tokens: two encodes at once could read each other's).
A plain request therefore never waits behind another's grammar. A request whose client leaves while
it waits is dropped before its next stage starts (a stage already running finishes: a Rust compile
cannot be interrupted, and the bounds keep it short).
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..engine.constrain import compile_schema
from ..engine.request import Request, prepare
from ..engine.schema import MAX_TOOL_NAME, Constraint, tool_name_problem
from ..engine.schema_bounds import check_schema
from ..errors import MlxinferError
from ..tokenizer import system_message
from .errors import ApiError, from_library
from .schemas import ChatRequest, CompletionRequest, Message

MAX_TOOLS = 128  # OpenAI's bound on tools
POLL_S = 0.25  # how often a request in preparation checks that its client is still there


class _Parked:
    """One daemon thread that runs jobs in order and never exits. Not a ThreadPoolExecutor: its thread
    exits at interpreter exit, and a thread that built llguidance's token table (or ran MLX's compiled
    functions) and then exits makes the process abort ("terminate called without an active exception")."""

    def __init__(self, name: str):
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, future = self._inbox.get()
            if future.set_running_or_notify_cancel():  # False: cancelled while it waited (its client left)
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: B036 - handed to the caller, who re-raises it
                    future.set_exception(e)

    def submit(self, fn) -> Future:
        future: Future = Future()
        self._inbox.put((fn, future))
        return future


_GRAMMAR = _Parked("mlxinfer-grammar")
_TEMPLATE = _Parked("mlxinfer-prepare")


class ClientGone(Exception):
    """The client left while its request was in preparation: nothing more is done for it."""


async def _run_on(worker: _Parked, fn, http) -> Any:
    """fn() on `worker`, awaited; every POLL_S, whether the client is still there (http: a Starlette
    request, or None). Gone: the stage is cancelled if it has not started, and ClientGone raised."""
    waiting = asyncio.wrap_future(worker.submit(fn))
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=POLL_S)
        if done:
            return waiting.result()
        if http is not None and await http.is_disconnected():
            waiting.cancel()  # the worker skips it if it has not started; a running one finishes
            raise ClientGone


async def prepare_within(http, fields: dict, model, tokenizer, *args, parts=(), **kwargs) -> Request:
    """`prepare(model, tokenizer, *args, **kwargs)` off the event loop: the constraint compiled on the
    grammar thread (cached: prepare finds it), then prepare on the template thread; its MlxinferError
    as a 400 naming the field. parts: Plan.parts, tried alone when their one grammar fails to compile,
    so that the error names the tool or the response_format at fault, not the grammar they were nested
    in. ClientGone when the client leaves first."""
    try:
        if kwargs.get("json_schema") is not None or kwargs.get("tool") is not None:
            await _run_on(_GRAMMAR, functools.partial(_compile, tokenizer, **kwargs), http)
        return await _run_on(_TEMPLATE, functools.partial(prepare, model, tokenizer, *args, **kwargs), http)
    except MlxinferError as e:
        if parts and "json_schema" in getattr(e, "params", ()):
            e = await _run_on(_GRAMMAR, functools.partial(_culprit, tokenizer, parts, e), None)
        raise from_library(e, fields) from None


def _compile(tokenizer, json_schema=None, tool=None, or_text=False, **_) -> None:
    """The request's grammar for this tokenizer, into constrain's cache (prepare's own compile finds it)."""
    constraint = Constraint.read(json_schema, tool, or_text=or_text)
    compile_schema(tokenizer, constraint.schema, constraint.where, constraint.param, or_text)


def _culprit(tokenizer, parts, error: MlxinferError) -> MlxinferError:
    """The first part that fails to compile alone, its error naming it; else the grammar's own."""
    for where, schema in parts:
        try:
            compile_schema(tokenizer, schema, where, where)
        except MlxinferError as e:
            return e
    return error


# ----------------------------------------------------------------------------- what prepare is given
@dataclass
class Plan:
    """A request body translated: prepare's arguments and what the response needs to know."""

    prompt: Any  # text, token ids, or a list of {"role", "content"} messages
    system: Optional[str]
    chat: bool
    json_schema: Optional[dict] = None
    tool: Optional[dict] = None
    tools: Optional[list[str]] = None  # function names when the answer is a tool call
    wrapped: bool = False  # several tools, or auto: the JSON is {"name": ..., "arguments": ...}
    or_text: bool = False  # tool_choice auto: plain text is an answer too
    or_json: bool = False  # tool_choice auto beside a JSON response_format: a call, or JSON in that format
    parts: list = field(default_factory=list)  # wrapped: (request field, schema) of each schema nested in it


def _text(message: Message, where: str) -> str:
    content = message.content
    if content is None:
        if message.role == "assistant" and message.tool_calls:  # OpenAI: content may be null beside a call
            return ""
        need = "an assistant message needs content or tool_calls" if message.role == "assistant" else "needs content"
        raise ApiError(400, f"{where}.content: {need} (a string or a list of text parts), got null", f"{where}.content")
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"{where}.content[{j}]: only text parts are supported here", f"{where}.content")
        parts.append(part.text)
    return "".join(parts)


def chat_plan(body: ChatRequest) -> Plan:
    messages = []
    for i, m in enumerate(body.messages):
        text = _text(m, f"messages[{i}]")
        for j, c in enumerate(m.tool_calls or []):  # an earlier call's name, by the rule a tool's follows
            _check_tool_name(c.function.name, f"messages[{i}].tool_calls[{j}].function.name")
        if m.tool_calls:  # an earlier call, as the text the model wrote for it
            text += "".join(
                json.dumps({"name": c.function.name, "arguments": c.function.arguments}) for c in m.tool_calls
            )
        role = "system" if m.role == "developer" else m.role
        messages.append({"role": role, "content": text})
    plan = Plan(messages, None, True)  # a system message the tool adds goes first, if there is none
    _constraint(body, plan)
    return plan


def _check_tool_name(name: str, where: str) -> None:
    """A function's name by OpenAI's rule (engine/schema.py's TOOL_NAME), or a 400 naming `where`."""
    problem = tool_name_problem(name)
    if problem:
        code = "string_above_max_length" if len(name) > MAX_TOOL_NAME else "invalid_value"
        raise ApiError(400, f"{where}{problem}", where, code=code)


def _constraint(body: ChatRequest, plan: Plan) -> None:
    """response_format and tools -> prepare's json_schema or tool (both through the grammar mask)."""
    choice = body.tool_choice
    tools = body.tools or []
    if choice is not None and not tools:
        raise ApiError(400, "tool_choice is only allowed when tools are given", "tool_choice")
    if len(tools) > MAX_TOOLS:
        raise ApiError(
            400, f"tools: at most {MAX_TOOLS} functions, got {len(tools):,}", "tools", code="array_above_max_length"
        )
    for i, t in enumerate(tools):  # every one, used or not, as OpenAI checks them, before any is compiled
        _check_tool_name(t.function.name, f"tools[{i}].function.name")
    answer = _response_schema(body.response_format)
    if not tools or choice == "none":
        plan.json_schema = answer
        return
    named = choice is not None and not isinstance(choice, str)
    auto = not named and choice != "required"  # "auto", OpenAI's default with tools: a call, or an answer
    # a forced call (required, or one named function) is the answer: a response_format does not apply to it
    plan.or_text, plan.or_json = auto and answer is None, auto and answer is not None
    at = [i for i, t in enumerate(tools) if not named or t.function.name == choice.function.name]
    chosen = [tools[i] for i in at]
    if not chosen:
        raise ApiError(400, f"tool_choice names '{choice.function.name}', which is not in tools", "tool_choice")
    names = [t.function.name for t in chosen]
    if len(set(names)) != len(names):
        raise ApiError(400, "tools: two functions have the same name", "tools")
    plan.tools = names
    # OpenAI: "Omitting parameters defines a function with an empty parameter list" (was: an object of any keys)
    none = {"type": "object", "properties": {}, "additionalProperties": False}
    params = [t.function.parameters or dict(none, properties={}) for t in chosen]
    wheres = [f"tools[{i}].function.parameters" for i in at]
    for where, schema in zip(wheres, params):  # each by its own field, before they are nested in one grammar
        _bounded(schema, where)
    if len(chosen) == 1 and not auto:
        f = chosen[0].function
        plan.tool = {"name": f.name, "description": f.description or "", "input_schema": params[0], "strict": True}
        return
    plan.wrapped = True
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": n}, "arguments": _placed(p, f"/anyOf/{i}/properties/arguments")},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, (n, p) in enumerate(zip(names, params))
    ]
    answers = [_placed(answer, f"/anyOf/{len(calls)}")] if plan.or_json else []
    if plan.or_json:
        _bounded(answer, "response_format")
    plan.parts = list(zip(wheres, params))
    plan.parts += [("response_format", answer)] if plan.or_json else []
    plan.json_schema = {"type": "object", "anyOf": calls + answers}
    listed = "; ".join(f"{t.function.name}: {t.function.description or ''}" for t in chosen)
    system = system_message(plan.prompt)
    if not auto:  # the request's own system message, where it has one, stands
        if system is None:
            plan.system = f"You call one of these tools: {listed}. Answer with the call as JSON: name and arguments."
        return
    otherwise = "answer with JSON in the response's format" if plan.or_json else "answer in plain text"
    text = (
        f"You can call these tools: {listed}. To call one, answer with only the call as JSON: name and "
        f"arguments. Otherwise {otherwise}."
    )
    if system is not None:  # auto: the model must know its tools to choose
        system["content"] = f"{system['content']}\n\n{text}".strip()
    else:
        plan.system = text


def _bounded(schema, where: str) -> None:
    """A schema within the grammar engine's bounds and with a finite instance, named by its field."""
    if isinstance(schema, dict):
        try:
            check_schema(schema, where, where)
        except MlxinferError as e:
            raise ApiError(400, str(e), where) from None


_DATA = ("const", "enum", "default", "examples")  # values, not schemas: a {"$ref": ...} there is data


def _placed(schema, at: str):
    """`schema` copied for a place inside a larger schema (at: its JSON pointer there, "/anyOf/0"):
    its own references ("#", "#/$defs/X", as pydantic writes them) rebased so that they still point
    into it from the new root. Bodies nest at most MAX_JSON_DEPTH levels (app._body), so this
    recursion is bounded."""
    if isinstance(schema, list):
        return [_placed(v, at) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            out[k] = "#" + at + v[1:]
        else:
            out[k] = v if k in _DATA else _placed(v, at)
    return out


def _response_schema(fmt) -> Optional[dict]:
    """response_format's JSON Schema (json_object: any object), None for text."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, "response_format json_schema needs json_schema.schema", "response_format")
    return fmt.json_schema.schema_


def completion_plan(body: CompletionRequest) -> Plan:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise ApiError(400, "prompt: send one prompt per request (a list of one is fine)", "prompt")
        prompt = prompt[0]
    if body.suffix is not None or (body.best_of or 1) != 1:
        field = "suffix" if body.suffix is not None else "best_of"
        fix = "leave it out" if field == "suffix" else "leave it out, or ask for n choices and pick one"
        raise ApiError(400, f"{field} is not supported by this server; {fix}", field)
    if body.echo and body.stream:
        raise ApiError(400, "echo is answered whole: set stream to false (or leave echo out)", "echo")
    return Plan(prompt, None, False)


def budget(request: Request, model, asked: Optional[int], default: Optional[int]) -> Request:
    """The token budget: what was asked (prepare checked it against the context), or, unset, up to
    the context (capped by the server's default): such a request ends with finish_reason "length"."""
    if asked is not None:
        return request
    room = model.config.max_position_embeddings - len(request.ids)
    if room < 1:
        raise ApiError(400, "the prompt fills the model's context; shorten it", "messages")
    return replace(request, max_tokens=min(room, default) if default else room)
