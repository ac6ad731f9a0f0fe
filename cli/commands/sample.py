"""`mlxinfer sample`: one completion per seed, then a tally of the distinct answers."""

from __future__ import annotations

import csv
import sys
from typing import Optional

import typer

from cli import flags
from cli.common import (
    ChatOption,
    ComputeOption,
    JsonOption,
    MinPOption,
    ModelOption,
    OrderOption,
    PromptOption,
    ShardModelOption,
    SystemOption,
    TempOption,
    RawSpecialOption,
    ThinkingOption,
    TopKOption,
    TopPOption,
    load_model,
    other_rank,
    print_json,
    progress_bar,
    sampling,
    sharding_line,
)


def sample(
    prompt: str = PromptOption,
    model: Optional[str] = ModelOption,
    compute_dtype: str = ComputeOption,
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Run seeds 0..N-1."),
    seed_range: Optional[str] = typer.Option(None, "--seed-range", help="Run seeds A..B-1, written A:B."),
    temp: Optional[float] = TempOption,
    top_p: Optional[float] = TopPOption,
    top_k: Optional[int] = TopKOption,
    min_p: Optional[float] = MinPOption,
    order: Optional[str] = OrderOption,
    max_tokens: int = typer.Option(5, "--max-tokens", help="Tokens per completion (the lesson uses 5)."),
    batch_size: int = typer.Option(
        32, "--batch-size", help="Seeds decoded together in one forward pass; 1 runs them one at a time."
    ),
    chat: bool = ChatOption,
    thinking: bool = ThinkingOption,
    raw_special_tokens: bool = RawSpecialOption,
    system: Optional[str] = SystemOption,
    json_schema: Optional[str] = typer.Option(
        None, "--json-schema", help="Every seed writes JSON of this schema (a file or inline JSON)."
    ),
    tool: Optional[str] = typer.Option(
        None, "--tool", help="Every seed writes this tool's input (a file or inline JSON)."
    ),
    json_out: bool = JsonOption,
    csv_out: bool = typer.Option(False, "--csv", help="Print seed,text rows as CSV."),
    shard_model: bool = ShardModelOption,
):
    """The lesson's seeded experiment: same scores every run, a different draw per seed.

    Under mlx.launch the seeds are shared among the ranks, or with --shard-model the model is split
    across them (tensor parallelism) and every rank runs every seed."""
    import mlxinfer
    from mlxinfer.engine.experiments import check_batch_size, seed_list
    from mlxinfer.engine.schema import Constraint
    from mlxinfer.errors import MlxinferError

    if (seeds is None) == (seed_range is None):
        raise MlxinferError("give exactly one of --seeds N or --seed-range A:B")
    if seed_range is not None:
        flags.use(seeds="--seed-range")
    seed_ids = seed_list(seeds if seeds is not None else seed_range)
    check_batch_size(batch_size)
    settings = sampling(temp, top_p, top_k, min_p, order=order)
    Constraint.read(json_schema, tool)  # a bad schema fails before the model loads
    m, tok = load_model(model, compute_dtype, shard=shard_model)
    quiet = json_out or csv_out or len(seed_ids) == 1 or other_rank()
    bar, update = progress_bar(len(seed_ids), "sampling", enabled=not quiet)
    with bar:
        report = mlxinfer.sample(
            m,
            tok,
            prompt,
            seeds=seed_ids,
            settings=settings,
            max_tokens=max_tokens,
            batch_size=batch_size,
            chat=chat,
            thinking=thinking,
            raw_special_tokens=raw_special_tokens,
            system=system,
            json_schema=json_schema,
            tool=tool,
            progress=update,
        )
    if other_rank():
        return  # under mlx.launch rank 0 prints for every rank
    if json_out:
        print_json(report.to_dict())
    elif csv_out:
        writer = csv.writer(sys.stdout)
        writer.writerow(["seed", "text", "finish_reason"])
        for c in report.completions:
            writer.writerow([c.seed, c.text, c.finish_reason])
    else:
        render(report)


def render(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{report.model}[/bold] on {report.definition}  prompt: {len(report.prompt_ids)} tokens", highlight=False
    )
    console.print(f"[dim]{report.settings_note}[/dim]", highlight=False)
    if report.sharding:
        console.print(f"[dim]{sharding_line(report.sharding)}[/dim]", highlight=False)
    for c in report.completions:
        mark = "" if c.valid is None else ("  (valid)" if c.valid else "  (cut: not valid JSON)")
        console.print(f"seed {c.seed:>4}: {c.text!r}{mark}", highlight=False)
    t = Table(title=f"{len(report.completions)} draws")
    t.add_column("answer")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    for row in report.tally:
        t.add_row(repr(row.answer), str(row.count), f"{row.share:.0%}")
    console.print(t)
