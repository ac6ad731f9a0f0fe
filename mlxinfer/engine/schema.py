"""JSON Schemas and tool definitions, read and checked before any model loads (no mlx here).

`Constraint.read` takes a schema or a tool as a dict, inline JSON text or a file path, and
compiles it to llguidance's grammar once without a tokenizer, so a feature the grammar engine
cannot express (`not`, `if`/`then`, `uniqueItems`, look-around patterns, ...) is a one-line
error before the model runs. constrain.py turns it into a grammar mask for one tokenizer.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MlxinferError
from ..formats.paths import read_text_file
from .schema_bounds import check_schema

# The output's whitespace is fixed: compact JSON, {"a":1,"b":[2,3]}. Free whitespace would
# let a model (and any random-weight model) pad with newlines and spaces forever.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# or_text's other branch: any text that does not open a JSON object; one leading space is allowed, as a
# SentencePiece word start (▁Hello) reads " Hello" to the grammar
TEXT_ANSWER = r"/ ?[^{\s][\s\S]*/"
MAX_SCHEMA_FILE_BYTES = 8 << 20  # a schema within schema_bounds' limits is far smaller
# The grammar engine's own bounds, a backstop behind schema_bounds.py: the grammar's symbols (its
# compile time is linear in them; 5,000 properties make ~60,000) and the lexer's fuel (llguidance's
# defaults). verbose_errors off: an error is one line, not the parser's state and the grammar.
GRAMMAR_LIMITS = {"max_grammar_size": 200_000, "verbose_errors": False}


def grammar_limits():
    from llguidance import LLParserLimits

    return LLParserLimits(**GRAMMAR_LIMITS)


def _read_json(value: Any, param: str) -> Any:
    """A parsed value as it is; text: inline JSON, or the path of a JSON file; else a one-line error."""
    if not isinstance(value, (str, Path)):
        return value
    text, where = str(value), param
    if not text.strip():  # was read as the path '.': "is a directory"
        raise MlxinferError(f"{param} is empty; pass a .json file or inline JSON {{...}}", param)
    if not text.lstrip().startswith(("{", "[")):
        path = Path(text).expanduser()
        if not path.exists() and not path.is_symlink():
            raise MlxinferError(
                f"{param}: '{text}' is neither a file nor inline JSON; pass a .json file or {{...}}", param
            )
        text = read_text_file(path, param, MAX_SCHEMA_FILE_BYTES, "a .json file or inline JSON {...}")
        where = f"{param} {path}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MlxinferError(f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", param) from None
    except RecursionError:
        raise MlxinferError(f"{where} nests too deeply to read; flatten it", param) from None


def check_object_schema(schema: Any, where: str = "json_schema", param: str = "json_schema") -> dict:
    """The schema must be a JSON object whose top level is {"type": "object", ...}."""
    if not isinstance(schema, dict):
        raise MlxinferError(f"{where} must be a JSON object (a JSON Schema), got a JSON {_kind(schema)}", param)
    if "input_schema" in schema and "type" not in schema:
        raise MlxinferError(
            f"{where} has an input_schema, like a function-call definition: pass that as tool", param, "tool"
        )
    if schema.get("type") != "object":
        got = f"type {json.dumps(schema['type'])}" if "type" in schema else "no type"
        raise MlxinferError(f'{where} must describe an object: its top level needs "type": "object" ({got})', param)
    return schema


# a tool's (function's) name, as OpenAI and Anthropic both define it: ^[a-zA-Z0-9_-]{1,64}$. The name goes
# into the system text and, beside other tools, into the grammar as a constant: a name of 10,000 characters
# was reported to take ~28 s to compile
MAX_TOOL_NAME = 64
TOOL_NAME = re.compile(rf"[a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME}}}")


def tool_name_problem(name: Any) -> str | None:
    """What is wrong with a tool's name, as the end of a sentence that names it ("... name" + this), or None."""
    rule = "OpenAI's and Anthropic's rule"
    if not isinstance(name, str) or not name:
        return f" must be a non-empty string: 1 to {MAX_TOOL_NAME} letters, digits, _ and - ({rule})"
    if len(name) > MAX_TOOL_NAME:
        return f" is {len(name):,} characters long; shorten it to at most {MAX_TOOL_NAME} ({rule})"
    if not TOOL_NAME.fullmatch(name):
        bad = next(c for c in name if not TOOL_NAME.fullmatch(c))
        return f" {name!r} holds {bad!r}; rename it with letters, digits, _ and - only ({rule})"
    return None


def schema_from_tool(tool: Any) -> dict:
    """A tool definition in Anthropic's format (name, description, strict, input_schema) -> input_schema."""
    if not isinstance(tool, dict):
        raise MlxinferError(f"tool must be a JSON object with name and input_schema, got a JSON {_kind(tool)}", "tool")
    missing = [k for k in ("name", "input_schema") if k not in tool]
    if missing:
        raise MlxinferError(
            f"tool lacks {' and '.join(missing)}; a tool definition needs name and input_schema (and may have "
            "description and strict)",
            "tool",
        )
    problem = tool_name_problem(tool["name"])
    if problem:
        raise MlxinferError(f"tool: name{problem}", "tool")
    if not isinstance(tool.get("description") or "", str):  # null: none
        raise MlxinferError(f"tool: description must be a string, got a JSON {_kind(tool['description'])}", "tool")
    if not isinstance(tool.get("strict", True), (bool, type(None))):
        raise MlxinferError(f"tool: strict must be true or false, got {json.dumps(tool['strict'])}", "tool")
    return check_object_schema(tool["input_schema"], "tool input_schema", "tool")


# schemas already validated (their grammar text), the most recently used last: the library reads a
# request's schema (Constraint.read) and compiles it for the tokenizer (constrain.compile_schema), and a
# server sees the same few schemas again and again
_VALIDATED: OrderedDict[tuple[str, bool], str] = OrderedDict()
_VALIDATED_LOCK = threading.Lock()
VALIDATED_CACHE = 64


def validate_schema(schema: dict, where: str = "json_schema", param: str = "json_schema", or_text: bool = False) -> str:
    """Check `schema`'s size and finiteness (schema_bounds.py), then compile it to llguidance's grammar
    text without a tokenizer (so before any model loads): a feature the engine cannot express is a
    one-line MlxinferError here.

    or_text: the answer is the JSON or plain text (OpenAI's tool_choice "auto"). Text may not start
    with "{" (nor with whitespace, but for one space), so the first character says which: a "{" begins
    the JSON."""
    key = (json.dumps(schema, sort_keys=True), or_text)
    with _VALIDATED_LOCK:
        if key in _VALIDATED:
            _VALIDATED.move_to_end(key)
            return _VALIDATED[key]
    check_schema(schema, where, param)
    grammar = _grammar(schema, where, param, or_text)
    with _VALIDATED_LOCK:
        _VALIDATED[key] = grammar
        while len(_VALIDATED) > VALIDATED_CACHE:
            _VALIDATED.popitem(last=False)
    return grammar


def _grammar(schema: dict, where: str, param: str, or_text: bool) -> str:
    from llguidance import LLMatcher

    try:
        if or_text:
            inline = json.dumps({**schema, "x-guidance": JSON_OPTIONS})
            grammar = LLMatcher.grammar_from_lark(f"start: json | text\njson: %json {inline}\ntext: {TEXT_ANSWER}\n")
        else:
            grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except (ValueError, RecursionError) as e:
        raise MlxinferError(f"{where} cannot be compiled: {_one_line(e)}", param) from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, None, limits=grammar_limits())
    if is_error:
        raise MlxinferError(
            f"{where} is not a valid JSON Schema or uses a feature constrained decoding cannot express: "
            f"{_one_line(messages[0])}",
            param,
        )
    return grammar


@dataclass
class Constraint:
    """A JSON Schema (or a tool's input_schema) the output must follow, checked before any model runs."""

    schema: dict
    tool: dict | None
    explain: bool = False
    or_text: bool = False  # plain text is an answer too (validate_schema)

    @property
    def where(self) -> str:
        return "tool input_schema" if self.tool is not None else "json_schema"

    @property
    def param(self) -> str:
        return "tool" if self.tool is not None else "json_schema"

    @classmethod
    def read(
        cls, json_schema: Any, tool: Any, explain_mask: bool = False, or_text: bool = False
    ) -> "Constraint | None":
        """json_schema / tool as dicts, inline JSON or file paths; None when neither is given."""
        if json_schema is not None and tool is not None:
            raise MlxinferError("pass json_schema or tool, not both", "json_schema", "tool")
        if tool is not None:
            tool = _read_json(tool, "tool")
            schema = schema_from_tool(tool)
        elif json_schema is not None:
            tool, schema = None, check_object_schema(_read_json(json_schema, "json_schema"))
        elif explain_mask or or_text:
            flag = "explain_mask" if explain_mask else "or_text"
            raise MlxinferError(f"{flag} needs json_schema or tool", flag, "json_schema", "tool")
        else:
            return None
        constraint = cls(schema, tool, explain_mask, or_text)
        try:  # a dict from Python can hold what JSON cannot: NaN, inf, keys that are not text
            json.dumps(schema, allow_nan=False, sort_keys=True)  # sorted: keys of mixed kinds fail here
        except ValueError:
            raise MlxinferError(
                f"{constraint.where} holds NaN or Infinity, which JSON has no value for", constraint.param
            ) from None
        except TypeError as e:
            raise MlxinferError(
                f"{constraint.where} holds what JSON cannot ({_one_line(e, 80)})", constraint.param
            ) from None
        validate_schema(schema, constraint.where, constraint.param, or_text)
        return constraint


def tool_system(tool: dict) -> str:
    """The system message `generate --tool` uses when none is given: the tool's name and description."""
    return f"You call the tool {tool['name']}: {tool.get('description') or ''} Answer with the tool's input as JSON."


def _kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _one_line(message: str, limit: int = 300) -> str:
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def parse_checked(text: str, schema: dict) -> tuple[Any, str]:
    """A complete JSON text the grammar accepted, parsed (a key written twice: the last, as json.loads keeps
    it), and what it breaks, checked again by jsonschema (with its format checker): llguidance lets through a
    key twice, a number past float's range, a date that is no date (2023-02-29) and a bound that float
    rounding crosses. "" where nothing is. Not JSON at all: json.JSONDecodeError."""
    repeated: list[str] = []

    def pairs(items):
        keys = [k for k, _ in items]
        if not repeated and len(set(keys)) < len(keys):
            repeated.append(next(k for i, k in enumerate(keys) if k in keys[:i]))
        return dict(items)

    parsed = json.loads(text, object_pairs_hook=pairs)
    if repeated:
        return parsed, f"the key {repeated[0]!r} is written twice (JSON keeps the last)"
    if not _finite(parsed):
        return parsed, "a number is past float's range (it reads as infinity)"
    import jsonschema

    try:
        validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
        error = jsonschema.exceptions.best_match(validator.iter_errors(parsed))
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot read (llguidance could): no second check
        return parsed, ""
    if error is None:
        return parsed, ""
    return parsed, f"{_one_line(error.message, 200)} (at {'/'.join(map(str, error.absolute_path)) or 'the top'})"


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True
