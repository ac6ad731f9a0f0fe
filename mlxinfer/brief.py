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


def token_table(table) -> str:
    """A NextTokenTable as the lesson prints it (and `topk` does): each row's token, score and probability at
    each temperature, then what the rows hold. Its explanation, if any, in brief after it."""
    head = ["#", "token", "score", *(f"p @ T={t:g}" for t in table.temperatures)]
    rows = [[str(r.rank), repr(r.text), f"{r.score:.3f}", *(f"{p:.3f}" for p in r.probs)] for r in table.rows]
    rows.append(["", "top rows hold", "", *(f"{m:.3f}" for m in table.mass)])
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in [head, *rows]
    ]
    text = f"NextTokenTable: {table.model}, {brief(table.prompt)}\n" + "\n".join(line.rstrip() for line in lines)
    return text + (f"\nexplanation={brief(table.explanation, 1)}" if table.explanation is not None else "")
