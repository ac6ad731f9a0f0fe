"""What every command shares: the model and sampling options, JSON output, progress bars."""

from __future__ import annotations

import json
import sys
from typing import Any

from mlxinfer_cli import options
from mlxinfer_cli.options import GROUPS

JsonOption = GROUPS["json"][0].option
ModelOption = GROUPS["model"][0].option
MODEL_HELP = options.MODEL_HELP


def counted(n: int, word: str) -> str:
    """'1 token', '2 tokens', '1,024 forward passes': the count and its word, plural unless n is 1."""
    if n == 1:
        return f"1 {word}"
    return f"{n:,} {word}es" if word.endswith("ss") else f"{n:,} {word}s"


def print_json(data: Any, *, one_line: bool = False) -> None:
    """Strict JSON: a number that is not finite (a masked token's log-probability, -inf) is null, and
    json.dumps refuses anything else that JSON cannot hold rather than print a bare NaN. one_line: JSON
    Lines, for a command that prints one object per event (chat's replies)."""
    import mlxinfer

    data = mlxinfer.strict_json_data(data)
    text = json.dumps(data, indent=None if one_line else 2, ensure_ascii=not utf8_stdout(), allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def utf8_stdout() -> bool:
    """Whether stdout writes UTF-8. Where it does not (PYTHONIOENCODING=ascii, a Latin-1 locale), JSON escapes
    every non-ASCII character (\\u00fc): escaped by the stream instead (\\xfc), the JSON would not parse."""
    import codecs

    try:
        return codecs.lookup(getattr(sys.stdout, "encoding", None) or "ascii").name in ("utf-8", "utf-8-sig")
    except LookupError:
        return False


MIN_WIDTH = 60  # a table of a command's output needs this many columns for its cells to show


def stdout_console(width: int | None = None):
    """rich's Console for a command's output on stdout. A width that is no use (COLUMNS=0, or narrower than
    MIN_WIDTH: a table's cells would print blank or as "…") is raised to MIN_WIDTH; not at a terminal, a
    line of text is printed whole, never wrapped (a pipe or a file gets one line per seed, step or row)."""
    from rich.console import Console

    out = Console(width=width)
    if width is None and out.width < MIN_WIDTH:  # COLUMNS=0 or 20, or a narrow terminal pane
        out = Console(width=MIN_WIDTH)
    out.soft_wrap = not out.is_terminal
    return out


def folding_table(*args, **kwargs):
    """rich's Table whose columns fold a cell onto more lines where the width is short: never cut to
    "…" (an interval "6.1%-79.2%" showed as "6.1%-79…" at 60 columns)."""
    from rich.table import Table

    table = Table(*args, **kwargs)
    add_column = table.add_column
    table.add_column = lambda *a, overflow="fold", **k: add_column(*a, overflow=overflow, **k)
    return table


def progress_bar(total: int, description: str, enabled: bool = True):
    """A rich progress bar on stderr, as a (done, total) callback and a context manager."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)  # not at a terminal: no bar, so an error stays the one line on stderr
    progress = Progress(console=console, transient=True, disable=not enabled or not console.is_terminal)
    task = progress.add_task(description, total=total)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def load_model(model, compute_dtype: str, shard: bool = True):
    """mlxinfer.load; under mlx.launch with several ranks (and `shard`) the model is split across them."""
    import mlxinfer

    ranks = mlxinfer.launch_group() if shard else None
    return mlxinfer.load(model, compute_dtype, group=ranks if ranks is not None and ranks.size() > 1 else None)


def sharding_line(sharding: dict | None) -> str:
    """How the model is split, in one line ('' on one process)."""
    if not sharding:
        return ""

    def span(name: str, r: dict) -> str:
        a, b = r[name]
        return f"{a}" if b - a == 1 else f"{a}-{b - 1}"

    parts = []
    for r in sharding["shares"]:
        where = (
            f"query heads {span('q_heads', r)} (KV {span('kv_heads', r)}), MLP {span('mlp_columns', r)}, "
            if "q_heads" in r
            else ""
        )
        parts.append(f"rank {r['rank']}: {where}{r['weight_bytes'] / 1e6:,.1f} MB")
    whole = sharding["one_process_weight_bytes"] / 1e6
    return f"split across {sharding['ranks']} ranks: " + "; ".join(parts) + f" (one process: {whole:,.1f} MB)"


def other_rank() -> bool:
    """True on ranks 1.. under mlx.launch: rank 0 prints for every rank, the others stay quiet."""
    import mlxinfer

    return mlxinfer.launch_group().rank() > 0
