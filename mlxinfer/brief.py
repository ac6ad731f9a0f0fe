"""A result in brief, as IPython and Jupyter show it (views.View._repr_pretty_): long lists as their length,
long texts cut, nested results two levels deep. repr() and to_dict() keep everything."""

from __future__ import annotations

from dataclasses import fields, is_dataclass


def brief(obj, depth: int = 0) -> str:
    if is_dataclass(obj) and depth < 2:
        shown = ", ".join(f"{f.name}={brief(getattr(obj, f.name), depth + 1)}" for f in fields(obj) if f.repr)
        return f"{type(obj).__name__}({shown})"
    if is_dataclass(obj):
        return f"{type(obj).__name__}(...)"
    if isinstance(obj, (list, tuple)) and len(obj) > 6:
        kind = type(obj[0]).__name__
        if kind == "int":
            return f"[{len(obj):,} ints: {', '.join(map(str, obj[:4]))}, ...]"
        return f"[{len(obj):,} x {kind}]"  # was "[8 Tallys]"
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(brief(v, depth + 1) for v in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner})"
    text = repr(obj)
    return text if len(text) <= 120 else text[:100] + f"... ({len(text):,} characters)"
