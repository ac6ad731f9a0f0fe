"""A chat: the conversation so far, its sampling settings and the turn logic, all returned as data.

    session = ChatSession(model, tokenizer, settings={"temperature": 0.7})
    turn = session.reply("Name one fruit.")   # the whole conversation, rendered by the chat template
    for text in turn: print(text, end="")     # streamed through stream_generate
    turn.record                               # its seed (fresh per reply unless fixed), tokens, finish
    session.command("/temp 0.5")              # a slash command: an Outcome (kind, message, data)

A reply's seed makes it reproducible: `generate(model, tokenizer, turn.messages, seed=turn.seed, ...)`
with the session's settings writes the same text. A turn stopped part-way (`turn.stop()`, e.g. on
Ctrl-C) keeps the text written so far, as llama.cpp's chat does.
"""

from __future__ import annotations

import difflib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from .. import atomic, defaults
from ..errors import MlxinferError, check_bool, is_utf8
from ..settings import SamplerSettings, user_settings
from ..tokenizer import encode_prompt
from .generate import stream_generate
from .request import check_max_tokens, check_pair, check_seed, stop_strings
from .tables import next_token_table


# a slash command per sampler setting with a number and a flag, named by its first flag (/temp, /top-k, /min-p,
# /repetition-penalty, ...): from their one declaration, as the CLI's options are
_SETTINGS = {
    "/" + o.flags.split()[0].lstrip("-"): (o.name, o.kind)
    for o in SamplerSettings.options()
    if o.flags and o.kind in (int, float)
}
COMMANDS = {  # name: (argument, what it does)
    **{
        name: ("X" if kind is float else "N", o.help[0].lower() + o.help[1:].rstrip("."))
        for name, (param, kind) in _SETTINGS.items()
        for o in SamplerSettings.options()
        if o.name == param
    },
    "/seed": ("N|random", "fix the seed of every reply, or draw a fresh one per reply"),
    "/system": ("TEXT", "the system message (nothing after it: none); applies to the whole conversation"),
    "/topk": ("[K]", "the next-token table for the last turn's prompt"),
    "/save": ("FILE", "write the conversation as JSON"),
    "/reset": ("", "forget the conversation (settings stay)"),
    "/help": ("", "list these commands"),
    "/quit": ("", "leave (Ctrl-D too)"),
}


@dataclass
class Outcome:
    """What a slash command did. kind: set, error, table, saved, reset, help or quit; message: one line
    to show; data: the command's result (the new settings, a NextTokenTable, the saved path, ...)."""

    command: str
    kind: str
    message: str
    data: Any = None

    def to_dict(self) -> dict:
        data = self.data.to_dict() if hasattr(self.data, "to_dict") else self.data
        return {"command": self.command, "kind": self.kind, "message": self.message, "data": data}


@dataclass
class TurnRecord:
    """One reply: its seed, text and the counts of its prompt (the whole conversation) and reply."""

    user: str
    text: str
    seed: Optional[int]  # None at temperature 0: a greedy reply draws nothing
    prompt_tokens: int
    generated_tokens: int = 0
    finish_reason: Optional[str] = None  # stop, length, or interrupted (stopped part-way)
    settings: dict = field(default_factory=dict)  # every sampler field the reply ran with
    settings_note: str = ""  # where they came from (yours, the model's generation_config.json, the defaults)

    def to_dict(self) -> dict:
        return asdict(self)


class ChatTurn:
    """One reply, streamed: iterate for its text pieces. When the iteration ends (or `stop()` is
    called) the user's message and the reply join the conversation and `record` is complete."""

    def __init__(self, session: "ChatSession", user: str, messages: list[dict], seed: Optional[int], stream):
        self.session, self.messages, self.seed, self.stream = session, messages, seed, stream
        request = stream.request
        self.record = TurnRecord(user, "", seed, len(request.ids), settings=request.settings.to_dict())
        self.record.settings_note = request.note
        self._pieces: list[str] = []
        self._done = self._started = self._dropped = False

    def __iter__(self) -> Iterator[str]:
        if self._done:
            why = "was dropped unread when the next reply started" if self._dropped else "has ended"
            raise MlxinferError(f"this reply {why}; its text is in .record.text, session.reply(...) starts another")
        if self._started:  # was: a second iterator ended the reply, saying "call stream_generate again"
            raise MlxinferError(
                "this reply is being read by an iterator already: read on from that one (next(it), or a for loop over "
                "it), or call the reply's stop() to end it here"
            )
        self._started = True
        return self._read()

    def _read(self) -> Iterator[str]:
        try:
            for step in self.stream:
                self.record.generated_tokens += step.token is not None  # the last step (token None) ends the run
                if step.text:
                    self._pieces.append(step.text)
                    yield step.text
            result = self.stream.result
            self._finish(result.text, result.finish_reason)
        finally:  # a loop left with break, or an exception (Ctrl-C in a notebook): kept as stopped part-way
            self.stop()

    def stop(self) -> None:
        """End the turn part-way: the text written so far is kept, finish_reason 'interrupted'."""
        self._finish("".join(self._pieces), "interrupted")

    def _finish(self, text: str, reason: str) -> None:
        if self._done:
            return
        self._done = True
        self.record.text, self.record.finish_reason = text, reason
        self.session._add(self)


class ChatSession:
    """A conversation with one model. settings: the sampler fields you set (the rest come from the
    model's generation_config.json, as generate's); seed: fixed for every reply, or None for a fresh
    one per reply; system: the system message; stop: strings where each reply ends (as generate's)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        settings: Mapping[str, Any] | None = None,
        seed: Optional[int] = None,
        system: Optional[str] = None,
        max_tokens: int = defaults.MAX_TOKENS_GENERATE,
        thinking: bool = False,
        stop: str | Sequence[str] | None = None,
    ):
        check_pair(model, tokenizer)
        check_seed(seed)
        check_max_tokens(max_tokens)
        check_bool(thinking, "thinking")  # at once, not at the first reply
        self.stops = stop_strings(stop)
        self.model, self.tokenizer = model, tokenizer
        self.settings = user_settings(settings)  # a SamplerSettings, a dict of its fields, or None
        self.seed, self.system, self.max_tokens, self.thinking = seed, system, max_tokens, thinking
        self.messages: list[dict] = []
        self.turns: list[TurnRecord] = []
        self.last_prompt: Optional[list[dict]] = None  # the messages the last reply answered
        self._open: Optional[ChatTurn] = None  # the reply being written: one at a time
        shortest = len(encode_prompt(tokenizer, [{"role": "user", "content": "?"}], system=system, thinking=thinking))
        limit = model.config.max_position_embeddings
        if shortest + max_tokens > limit:  # at once: no reply could start, and the banner would promise one
            raise MlxinferError(
                f"max_tokens {max_tokens:,} leaves no room in the model's context of {limit:,} tokens for even a "
                f"one-word message ({shortest:,} tokens with the chat template); lower it to at most "
                f"{limit - shortest:,}",
                "max_tokens",
            )

    def reply(self, text: str) -> ChatTurn:
        """Start the reply to `text` (checked and encoded now: a bad prompt or a full context is an
        MlxinferError here, and the conversation is unchanged)."""
        if not isinstance(text, str):
            raise MlxinferError(f"the message must be text, got {type(text).__name__}", "prompt")
        if not text.strip():
            raise MlxinferError("say something: the message is empty", "prompt")
        if self._open is not None and not self._open._done:
            if self._open._started:
                raise MlxinferError(
                    "the last reply is still being written: read its iterator to the end or call the reply's stop(), "
                    "then reply again",
                    "prompt",
                )
            self._open._done = self._open._dropped = True  # never read: it does not join the conversation
        messages = [*self.messages, {"role": "user", "content": text}]
        seed = self.seed if self.seed is not None else secrets.randbelow(defaults.FRESH_SEEDS)
        try:
            stream = stream_generate(
                self.model,
                self.tokenizer,
                messages,
                settings=self.settings,
                max_tokens=self.max_tokens,
                seed=seed,
                system=self.system,
                thinking=self.thinking,
                stop=self.stops,
            )
        except MlxinferError as e:  # a conversation grown past the context: a new one is a fix too
            if "context" not in str(e) or not self.messages or not {"prompt", "max_tokens"} & set(e.params):
                raise
            raise MlxinferError(f"{e}; or /reset starts a new conversation (the settings stay)", *e.params) from None
        self._open = ChatTurn(self, text, messages, stream.seed, stream)
        return self._open

    def _add(self, turn: ChatTurn) -> None:
        self.messages = [*turn.messages, {"role": "assistant", "content": turn.record.text}]
        self.last_prompt = turn.messages
        self.turns.append(turn.record)

    def prompt_ids(self, messages: Optional[list[dict]] = None) -> list[int]:
        """The token ids the model reads for `messages` (default: the conversation so far), the
        system message first and the assistant's turn opened, as a reply's prompt is rendered."""
        messages = self.messages if messages is None else messages
        return encode_prompt(self.tokenizer, messages, system=self.system, thinking=self.thinking)

    def prompt_text(self, messages: Optional[list[dict]] = None) -> str:
        """prompt_ids as text, control tokens written out: what `generate --no-chat --raw-special-tokens`
        reads back as the same ids."""
        return self.tokenizer.decode(self.prompt_ids(messages))

    def to_dict(self) -> dict:
        return {
            "model": self.model.info.name,
            "system": self.system,
            "settings": dict(self.settings),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stops),
            "messages": [dict(m) for m in self.messages],
            "turns": [t.to_dict() for t in self.turns],
        }

    def save(self, path: str | os.PathLike) -> Path:
        """The conversation as JSON at `path`, complete or not at all (a temporary file renamed into place)."""
        if not isinstance(path, (str, os.PathLike)):
            raise MlxinferError(f"save takes a file name, got {type(path).__name__}", "path")
        final = Path(path).expanduser()
        if not str(path).strip() or final.is_dir():
            raise MlxinferError(f"cannot save to {str(path)!r}: give a file name, e.g. /save chat.json")
        data = json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"
        try:
            mode = None
            if final.is_file() and final.stat().st_size:  # another save is replaced; any other file is kept
                if not _is_saved_chat(final):  # (one that cannot be read is not replaced either: an OSError below)
                    raise MlxinferError(f"{final} exists and is not a saved chat; give another name, or remove it")
                mode = final.stat().st_mode & 0o7777  # as it was: a save kept private stays private
            with atomic.staged_file(final, mode=mode) as tmp:
                tmp.write_text(data, encoding="utf-8")
        except OSError as e:
            raise MlxinferError(f"cannot save to {final} ({e.strerror or e}); pick a writable path") from None
        return final

    def command(self, line: str) -> Outcome:
        """Run one slash command ('/temp 0.7'). A bad value is an Outcome of kind 'error' whose message
        names the problem and the fix; the session is then unchanged."""
        if not isinstance(line, str):
            raise MlxinferError(f"a command is a line of text such as '/temp 0.7', got {type(line).__name__}", "line")
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name not in COMMANDS:
            close = difflib.get_close_matches(name, list(COMMANDS), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return Outcome(name, "error", f"unknown command {name}; {hint}/help lists the commands")
        try:
            handler = self._set if name in _SETTINGS else getattr(self, "_" + name[1:].replace("-", "_"))
            return handler(name, arg)
        except MlxinferError as e:
            return Outcome(name, "error", str(e))

    def _set(self, name: str, arg: str) -> Outcome:
        param, kind = _SETTINGS[name]
        if arg in ("", "default"):  # back to what the model's generation_config.json (or mlxinfer) says
            self.settings = {k: v for k, v in self.settings.items() if k != param}
            return Outcome(name, "set", f"{param}: the default", dict(self.settings))
        rule = "a number, e.g. 0.7" if kind is float else "a whole number, e.g. 20"
        try:
            if not arg.isascii():  # int() and float() also read other scripts' digits
                raise ValueError
            value = kind(arg)
        except ValueError:
            raise MlxinferError(f"{name} takes {rule}, or 'default'; got {arg!r}") from None
        try:
            # checked alone first, so the message is this setting's; as it reads: -1 is top-k off, the window all
            value = getattr(SamplerSettings(**{param: value}).validate(), param)
            self.settings = user_settings({**self.settings, param: value})
        except MlxinferError as e:
            raise MlxinferError(f"{name} {arg}: {e}") from None
        shown = "the default" if value is None else f"{value:g}"
        return Outcome(name, "set", f"{param} = {shown}", dict(self.settings))

    def _seed(self, name: str, arg: str) -> Outcome:
        if arg in ("", "random"):
            self.seed = None
            return Outcome(name, "set", "a fresh seed for each reply", None)
        try:
            seed = int(arg)
            check_seed(seed)
        except (ValueError, MlxinferError):
            raise MlxinferError(f"/seed takes a whole number from 0 to 2**63-1, or 'random'; got {arg!r}") from None
        self.seed = seed
        return Outcome(name, "set", f"seed = {seed} for every reply (/seed random: a fresh one each)", seed)

    def _system(self, name: str, arg: str) -> Outcome:
        if not is_utf8(arg):  # bytes that were not UTF-8: every reply, and /save, would fail
            raise MlxinferError("/system takes UTF-8 text; the system message is unchanged")
        self.system = arg or None
        return Outcome(name, "set", f"system message: {arg!r}" if arg else "no system message", self.system)

    def _topk(self, name: str, arg: str) -> Outcome:
        if self.last_prompt is None:
            raise MlxinferError("/topk shows the next-token table of the last turn's prompt: say something first")
        try:
            k = int(arg) if arg else 6
        except ValueError:
            raise MlxinferError(f"/topk takes a whole number of rows, e.g. /topk 10; got {arg!r}") from None
        table = next_token_table(
            self.model,
            self.tokenizer,
            self.last_prompt,
            temperatures=defaults.TOPK_TEMPERATURES,
            k=k,
            settings=self.settings or None,
            system=self.system,
            thinking=self.thinking,
        )
        message = f"the next token after the last turn's prompt ({len(table.prompt_ids)} tokens)"
        return Outcome(name, "table", message, table)

    def _save(self, name: str, arg: str) -> Outcome:
        if not arg:
            raise MlxinferError("/save takes a file name, e.g. /save chat.json")
        path = self.save(arg)
        return Outcome(name, "saved", f"saved {len(self.messages)} messages to {path}", str(path))

    def _reset(self, name: str, arg: str) -> Outcome:
        if self._open is not None:
            self._open.stop()  # an open reply would otherwise join the new conversation when it ends
        self.messages, self.turns, self.last_prompt = [], [], None
        return Outcome(name, "reset", "the conversation is forgotten; settings stay", None)

    def _help(self, name: str, arg: str) -> Outcome:
        rows = [(f"{c} {a}".strip(), what) for c, (a, what) in COMMANDS.items()]
        return Outcome(name, "help", "commands: " + ", ".join(COMMANDS), rows)

    def _quit(self, name: str, arg: str) -> Outcome:
        return Outcome(name, "quit", "bye", None)


def _is_saved_chat(path: Path) -> bool:
    """A file /save wrote: a JSON object with the conversation's messages and turns."""
    with open(path, "rb") as f:  # an OSError here: "cannot save to ..." as any other
        head = f.read(64 << 20)
    try:
        data = json.loads(head)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and {"messages", "turns"} <= set(data)
