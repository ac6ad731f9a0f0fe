"""Responses in OpenAI's shapes: chat.completion(.chunk), text_completion, logprobs, tool calls.

`Choice` gathers one row's events (the engine's Steps, their text already cut at a stop string) the
way the response reports it: text, the chat or legacy logprobs, and for a tool call the JSON returned
as tool_calls.
A log-probability that is not finite (a token the grammar mask refused) is reported as -9999.0,
as OpenAI does for "practically impossible": JSON has no -inf.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from typing import Optional

from ..tokenizer import token_bytes

IMPOSSIBLE = -9999.0


def _lp(value: float) -> float:
    return value if math.isfinite(value) else IMPOSSIBLE


class Choice:
    """One row of a response as it arrives."""

    def __init__(self, index: int, tokenizer, chat: bool, want_logprobs: bool, top: int):
        self.index, self.tokenizer, self.chat = index, tokenizer, chat
        self.want_logprobs, self.top = want_logprobs, top
        self.text: list[str] = []
        self.tokens = 0
        self.logprobs: list[dict] = []  # chat: content entries; completions: token, logprob, top, offset
        self.finish_reason: Optional[str] = None
        self.json = None  # constrain.JsonResult for a constrained row
        self.head = ""  # the first character shown: "{" opens a call when tool_choice is auto

    def add(self, step) -> str:
        """A Step in, the text to show now out (finish_reason set when the row ended)."""
        if step.token is not None:
            self.tokens += 1
            if self.want_logprobs:
                self.logprobs.append(self._entry(step))
        else:
            self.finish_reason = step.finish_reason
        self.text.append(step.text)
        self.head = self.head or step.text[:1]
        return step.text

    def _entry(self, step) -> dict:
        token = self.tokenizer.decode([step.token])
        top = [(a.text, _lp(a.logprob)) for a in step.alternatives[: self.top]]
        if self.chat:
            raw = [token_bytes(self.tokenizer, a.id) for a in step.alternatives[: self.top]]
            return {
                "token": token,
                "logprob": _lp(step.logprob),
                "bytes": list(token_bytes(self.tokenizer, step.token)),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(b)} for (t, v), b in zip(top, raw)],
            }
        # text_offset: where the token's text starts in the returned text (a token decoded alone may
        # carry a leading space that the text, detokenized as a whole, does not)
        # OpenAI's dict keys a token by its text: pieces that print alike ("\ufffd" for parts of a character)
        # share a key, which keeps the most probable one's logprob (was: the least probable's)
        best: dict[str, float] = {}
        for text, logprob in top:  # best first
            best.setdefault(text, logprob)
        return {"token": token, "logprob": _lp(step.logprob), "top": best, "offset": step.offset}

    # -- the response pieces
    def chat_logprobs(self, entries: Optional[list[dict]] = None) -> Optional[dict]:
        if not self.want_logprobs:
            return None
        return {"content": self.logprobs if entries is None else entries, "refusal": None}

    def completion_logprobs(self, entries: Optional[list[dict]] = None) -> Optional[dict]:
        if not self.want_logprobs:
            return None
        entries = self.logprobs if entries is None else entries
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [e["top"] for e in entries],
            "text_offset": [e["offset"] for e in entries],
        }


def tool_calls(choice: Choice, names: list[str], wrapped: bool) -> list[dict]:
    """The row's JSON as OpenAI's tool_calls. A call cut short (by the token budget or a stop string)
    is returned as far as it got, as a stream sends it: its arguments are then not valid JSON and the
    finish_reason says why; a cut call whose name is not yet complete is no call."""
    result = choice.json
    if result is not None and result.valid:
        if wrapped:
            name = result.parsed["name"]
            arguments = json.dumps(result.parsed["arguments"], separators=(",", ":"))
        else:
            name, arguments = names[0], result.text
    else:
        name, arguments = cut_call("".join(choice.text), names, wrapped)
        if name is None:
            return []
    return [{"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}]


def call_state(text: str, names: list[str]) -> Optional[bool]:
    """tool_choice auto beside a JSON response_format: True once the JSON so far opens a call of one
    of `names` ({"name": ..., "arguments": ..., the grammar's order), False once it cannot, None while
    it may still. One rule for a stream's prefix and a whole answer, so both read a row alike. (A
    response schema whose own JSON opens that way, with a tool's name, reads as a call.)"""
    head = _WRAPPED_HEAD.match(text)  # cut_call's reading of a call's head
    if head:
        return json.loads(head.group(1)) in names
    # not a whole head yet: undecided while it is the start of one (whitespace between tokens is free)
    compact = re.sub(r"\s+", "", text[:4096])
    return (
        None
        if any(f'{{"name":{json.dumps(n, ensure_ascii=False)},"arguments":'.startswith(compact) for n in names)
        else False
    )


def is_call(choice: Choice, names: list[str]) -> bool:
    """Beside a JSON response_format: whether the row called (call_state of its whole text), else its
    JSON is the answer."""
    return call_state("".join(choice.text), names) is True


_WRAPPED_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def cut_call(text: str, names: list[str], wrapped: bool) -> tuple[Optional[str], str]:
    """(name, arguments so far) of a call cut short; several tools: read from {"name": ..., "arguments": ...}."""
    if not wrapped:
        return (names[0], text) if text else (None, "")  # nothing written: no call, as a stream sends none
    head = _WRAPPED_HEAD.match(text)
    name = json.loads(head.group(1)) if head else None
    return (name, text[head.end() :]) if name in names else (None, "")


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def response_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def head(rid: str, kind: str, model: str, fingerprint: str) -> dict:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "system_fingerprint": fingerprint}


def usage(prompt_tokens: int, choices: list[Choice]) -> dict:
    completion = sum(c.tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
