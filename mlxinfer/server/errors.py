"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, with the right status.

The library's MlxinferError names its Python parameters (`max_tokens`, `json_schema`, `tool`,
`prompt`); `from_library` puts the request field a client sent in their place, as cli/flags.py
does for the CLI's flags.
"""

from __future__ import annotations

import re
from typing import Optional

from starlette.responses import JSONResponse

from ..engine.batcher import EngineStopped, QueueFull
from ..errors import MlxinferError

# library parameter -> the OpenAI field it comes from (chat; completions swaps prompt back)
FIELDS = {
    "prompt": "messages",
    "system": "messages",
    "chat=False": "messages",
    "raw_special_tokens": "messages",
    "json_schema": "response_format",
    "tool": "tools",
    "settings": None,
    "history": "messages",
    "allowed": "response_format",
}
TYPES = {429: "rate_limit_error"}  # else invalid_request_error below 500, server_error from it
CODES = {401: "invalid_api_key", 404: "model_not_found", 413: "request_too_large", 429: "rate_limit_exceeded"}


class ApiError(Exception):
    """An HTTP error with OpenAI's body; `headers` for Retry-After and WWW-Authenticate."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None, **headers):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or CODES.get(status)
        self.headers = {k.replace("_", "-"): v for k, v in headers.items()}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """OpenAI's error shape. The message is one line, and text a request put in it (a model name, a
    field's value) cannot break the body: a lone surrogate, which JSON may carry but UTF-8 cannot, is
    escaped."""
    kind = TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def clean(text: str) -> str:
        return " ".join(text.split()).encode("utf-8", "backslashreplace").decode("utf-8")

    param = None if param is None else clean(param)  # a field path can hold a key the request chose
    return {"error": {"message": clean(message), "type": kind, "param": param, "code": code}}


def from_library(e: MlxinferError, fields: Optional[dict] = None) -> ApiError:
    """A 400 whose message and param name the request's fields, not the library's parameters."""
    names = {**FIELDS, **(fields or {})}
    message, params = str(e), list(getattr(e, "params", ()))
    for p in params:
        field = names.get(p, p)
        if field and field != p:
            message = re.sub(rf"(?<![\w-]){re.escape(p)}(?![\w-])", field, message, count=1)
    for chat_false in ("pass chat=False", "try chat=False"):  # the library's advice, in this API's words
        message = message.replace(chat_false, "use /v1/completions for plain text")
    message = message.replace("the messages is ", "the messages are ")  # "the prompt is ..." named as chat's field
    first = next((names.get(p, p) for p in params if names.get(p, p)), None)
    if first is not None and first.startswith('"'):  # a field written with its value ('"chat": false'): its name
        first = first.split('"')[1]
    return ApiError(400, " ".join(message.split()), first)


def refused(e: QueueFull) -> ApiError:
    """The engine would not take a request: it is shutting down (503), or its queue is full (429, retry)."""
    if isinstance(e, EngineStopped):
        return ApiError(503, "the server is shutting down", None)
    return ApiError(429, f"the server is busy ({e}); retry shortly", None, Retry_After="1")


def from_validation(errors: list[dict]) -> ApiError:
    """pydantic's first error as one line naming the field: messages[0].content, temperature, ..."""
    err = errors[0]
    loc = [part for part in err.get("loc", ()) if isinstance(part, int) or not _TYPE_TAG.search(part)]
    param = ""
    for part in loc:
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    got = err.get("input")
    shown = "" if err.get("type") == "missing" else f" (got {_short(got)})"
    return ApiError(400, f"{param or 'body'}: {err.get('msg', 'invalid')}{shown}", param or None)


_TYPE_TAG = re.compile(r"^(str|int|float|bool|dict|list|none|literal|union)\b|[\[\(-]", re.IGNORECASE)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def gone_response() -> JSONResponse:
    """The answer to a client that left during preparation: no one reads it (499, as nginx logs it)."""
    return JSONResponse(error_body(499, "the client closed the request"), status_code=499)
