"""What a JSON Schema may ask of the grammar engine, checked in one walk before llguidance sees it (no mlx).

Two kinds of schema are refused here, each with one line naming where in the schema the fault is:

* too large to compile in a bounded time: more sub-schemas, object properties or enum values than the
  limits below, sub-schemas nested deeper than MAX_DEPTH, or a pattern whose repetition count is huge.
  Compiling is linear in these (llguidance's own limits, constrain.py, are the backstop), and a
  server compiles each request's schema before the request can run;
* a schema no JSON can satisfy, which llguidance does not see until decoding reaches it (a state dump
  mid-stream): a `$ref` loop that reaches no value (`{"$ref": "#/properties/x"}` at
  `#/properties/x`), or required properties that refer back to their own object (`{"x": {"$ref":
  "#"}}` with `x` required): every instance would be infinite.

Both analyses are conservative: an unknown keyword, a reference that is not a local JSON pointer or a
node whose type allows anything else counts as satisfiable, so a schema is refused only when it surely
has no finite instance.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional
from urllib.parse import unquote

from ..errors import MlxinferError, is_whole

MAX_NODES = 10_000  # sub-schemas in all
MAX_DEPTH = 32  # sub-schemas nested in one another
MAX_OBJECT_PROPERTIES = 1_000  # properties of one object (1,000 compile in ~0.2 s)
# optional properties of one object: llguidance's parser holds at most 2,000 items in a row (its
# max_items_in_row) and an object's optional properties take 4 each, past it an error mid-decode
MAX_OPTIONAL_PROPERTIES = 400
MAX_PROPERTIES = 5_000  # object properties, summed over the schema (OpenAI's bound; 5,000 in objects of 40 ~0.3 s)
MAX_ENUM_VALUES = 10_000  # enum and const values, summed over the schema
MAX_PATTERN = 10_000  # characters in one pattern
MAX_REPEAT = 10_000  # a pattern's {n} or {n,m}

_ONE = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not", "if", "then")
_ONE += ("else", "unevaluatedProperties", "unevaluatedItems")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# where a value is written: a dead node there is a dead end (not, if, $defs, ... are not values)
_VALUES = ("properties", "patternProperties", "additionalProperties", "items", "prefixItems", "additionalItems")
_VALUES += ("unevaluatedProperties", "unevaluatedItems", "allOf")
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_schema(schema: Any, where: str = "json_schema", param: str = "json_schema") -> None:
    """Refuse a schema over the limits, or one with no finite instance (see the module's docstring)."""
    nodes = _walk_and_count(schema, where, param)
    _check_loops(schema, nodes, where, param)


def _children(node: dict, pointer: str) -> Iterator[tuple[Any, str, str]]:
    """(sub-schema, its JSON pointer, its keyword) of every keyword that holds schemas; values (enum,
    const, default) are data."""
    for key in _ONE:
        value = node.get(key)
        if isinstance(value, list) and key == "items":  # draft 4-2019's tuple form
            yield from ((v, f"{pointer}/items/{i}", key) for i, v in enumerate(value))
        elif isinstance(value, (dict, bool)):
            yield value, f"{pointer}/{key}", key
    for key in _MANY:
        value = node.get(key)
        if isinstance(value, list):
            yield from ((v, f"{pointer}/{key}/{i}", key) for i, v in enumerate(value))
    for key in _NAMED:
        value = node.get(key)
        if isinstance(value, dict):
            yield from ((v, f"{pointer}/{key}/{_escape(k)}", key) for k, v in value.items())


def _walk_and_count(schema: Any, where: str, param: str) -> dict[int, tuple[dict, str]]:
    """Every sub-schema (id -> (node, pointer)), the size limits checked on the way."""
    nodes: dict[int, tuple[dict, str]] = {}
    properties = values = 0
    stack: list[tuple[Any, str, int]] = [(schema, "#", 1)]
    while stack:
        node, pointer, depth = stack.pop()
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = (node, pointer)
        if len(nodes) > MAX_NODES:
            raise _limit(where, param, f"holds more than {MAX_NODES:,} sub-schemas", pointer)
        if depth > MAX_DEPTH:
            raise _limit(where, param, f"nests sub-schemas deeper than {MAX_DEPTH} levels", pointer)
        if isinstance(node.get("properties"), dict):
            properties += len(node["properties"])
            if len(node["properties"]) > MAX_OBJECT_PROPERTIES:
                raise _limit(where, param, f"has an object of more than {MAX_OBJECT_PROPERTIES:,} properties", pointer)
            listed = node.get("required") if isinstance(node.get("required"), list) else []
            required = {name for name in listed if isinstance(name, str)}
            optional = len([k for k in node["properties"] if k not in required])
            if optional > MAX_OPTIONAL_PROPERTIES:
                raise _limit(
                    where, param, f"has an object of {optional:,} optional properties (at most "
                    f"{MAX_OPTIONAL_PROPERTIES:,}; required ones are cheaper)", pointer,
                )  # fmt: skip
            if properties > MAX_PROPERTIES:
                raise _limit(where, param, f"has more than {MAX_PROPERTIES:,} object properties in all", pointer)
        values += (len(node["enum"]) if isinstance(node.get("enum"), list) else 0) + ("const" in node)
        if values > MAX_ENUM_VALUES:
            raise _limit(where, param, f"has more than {MAX_ENUM_VALUES:,} enum and const values in all", pointer)
        patterns = [(node.get("pattern"), f"{pointer}/pattern")]
        if isinstance(node.get("patternProperties"), dict):
            patterns += [(k, f"{pointer}/patternProperties") for k in node["patternProperties"]]
        for pattern, at in patterns:
            if isinstance(pattern, str):
                _check_pattern(pattern, at, where, param)
        stack.extend((child, at, depth + 1) for child, at, _ in _children(node, pointer))
    return nodes


def _check_pattern(pattern: str, at: str, where: str, param: str) -> None:
    if len(pattern) > MAX_PATTERN:
        raise _limit(where, param, f"has a pattern of {len(pattern):,} characters (at most {MAX_PATTERN:,})", at)
    for match in _REPEAT.finditer(pattern):
        counts = [int(c) for c in match.groups() if c]
        if max(counts) > MAX_REPEAT:
            raise _limit(
                where, param, f"has a pattern that repeats {max(counts):,} times ({match.group(0)}; at most "
                f"{MAX_REPEAT:,})", at,
            )  # fmt: skip


def _limit(where: str, param: str, what: str, pointer: str) -> MlxinferError:
    return MlxinferError(
        f"{where} {what} (at {_short(pointer)}): more than constrained decoding takes; shrink it", param
    )


# ----------------------------------------------------------------------------- no finite instance
def _check_loops(root: Any, nodes: dict[int, tuple[dict, str]], where: str, param: str) -> None:
    """A `$ref` loop that reaches no value anywhere a value may be written; then the root's own
    finiteness (required properties through which the object contains itself)."""
    opens = _satisfiable(root, nodes, with_structure=False)
    for node, pointer in _value_positions(root, nodes, opens):
        if not opens.get(id(node), True):
            raise MlxinferError(
                f"{where}: {_short(pointer)} is a $ref loop that never reaches a value (each reference leads "
                "back to it through references alone); give it a type or end the loop",
                param,
            )
    finite = _satisfiable(root, nodes, with_structure=True)
    if isinstance(root, dict) and not finite.get(id(root), True):
        raise MlxinferError(
            f"{where} has no finite JSON: its required properties (or non-empty arrays) contain the object "
            "again, a recursion with no way out; make the recursion optional",
            param,
        )


def _satisfiable(root: Any, nodes: dict[int, tuple[dict, str]], with_structure: bool) -> dict[int, bool]:
    """id -> whether the node has an instance, by propagation (a node is satisfiable once every one of
    its requirements is; a requirement is one node, or any of a group). with_structure: required
    properties and non-empty arrays are requirements too (a finite instance); without: only what applies
    at the same place ($ref, allOf, anyOf, oneOf: the value starts at all)."""
    needs: dict[int, int] = {}  # node -> requirements not yet met
    waiting: dict[int, list[tuple[int, Optional[list]]]] = {}  # node -> (dependent, its group or None)
    ready: list[int] = []
    for key, (node, _) in nodes.items():
        # a reference into data (not a sub-schema the walk met) is not judged: that requirement is met
        groups = [g for g in _requirements(root, node, with_structure) if all(m in nodes for m in g)]
        needs[key] = len(groups)
        for group in groups:
            shared = [False] if len(group) > 1 else None  # an any-of group is met once
            for member in group:
                waiting.setdefault(member, []).append((key, shared))
        if not groups:
            ready.append(key)
    done: dict[int, bool] = {key: False for key in nodes}
    while ready:
        key = ready.pop()
        if done[key]:
            continue
        done[key] = True
        for dependent, shared in waiting.get(key, ()):
            if shared is not None:
                if shared[0]:
                    continue
                shared[0] = True
            needs[dependent] -= 1
            if needs[dependent] == 0:
                ready.append(dependent)
    return done


def _requirements(root: Any, node: dict, with_structure: bool) -> list[list[int]]:
    """The node's requirements: each a list of node ids of which one must be satisfiable."""
    if "const" in node or "enum" in node:
        return []  # a literal is a value (conservative: its other keywords are not intersected)
    out: list[list[int]] = []
    target = _resolve(root, node.get("$ref"))
    if isinstance(target, dict):
        out.append([id(target)])
    for member in node.get("allOf") if isinstance(node.get("allOf"), list) else []:
        if isinstance(member, dict):
            out.append([id(member)])
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and members:
            if any(not isinstance(m, dict) for m in members):
                continue  # true/false branches: llguidance's own reading
            out.append([id(m) for m in members])
    if not with_structure:
        return out
    kind = node.get("type")
    if kind == "object" and isinstance(node.get("required"), list):
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for name in node["required"]:
            sub = properties.get(name) if isinstance(name, str) else None
            if isinstance(sub, dict):
                out.append([id(sub)])
    minimum = node.get("minItems")
    if kind == "array" and is_whole(minimum) and minimum > 0:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        items = node.get("items")
        for i in range(min(minimum, len(prefix) + 1)):
            sub = prefix[i] if i < len(prefix) else items
            if isinstance(sub, dict):
                out.append([id(sub)])
    return out


def _value_positions(root: Any, nodes: dict, opens: dict[int, bool]) -> Iterator[tuple[dict, str]]:
    """Each node that a value may be written for: the root, properties, items, and what they refer to;
    an anyOf/oneOf branch only where its group has another way (an unsatisfiable branch beside a
    satisfiable one is never taken)."""
    seen: set[int] = set()
    stack = [(root, "#")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node, pointer
        if not opens.get(id(node), True):
            continue
        target = _resolve(root, node.get("$ref"))
        if isinstance(target, dict):
            stack.append((target, nodes.get(id(target), (None, node["$ref"]))[1]))
        for child, at, key in _children(node, pointer):
            if key in _VALUES or (key in ("anyOf", "oneOf") and opens.get(id(child), True)):
                stack.append((child, at))


def _resolve(root: Any, ref: Any) -> Any:
    """The node a local reference ("#", "#/$defs/a") points to, or None (not local, or not there)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _short(pointer: str, limit: int = 120) -> str:
    return pointer if len(pointer) <= limit else pointer[:50] + "..." + pointer[-(limit - 53) :]
