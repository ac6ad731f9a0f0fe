"""`mlxinfer sweep`: prompts x settings x seeds, a results file that survives interruption, a summary."""

from __future__ import annotations

from typing import List, Optional

import typer

from cli import flags
from cli.common import (
    ChatOption,
    ComputeOption,
    JsonOption,
    RawSpecialOption,
    ModelOption,
    ShardModelOption,
    SystemOption,
    ThinkingOption,
    load_model,
    parse_numbers,
    print_json,
    other_rank,
    progress_bar,
    sharding_line,
)


SHOWN = 12  # answers per cell in the table


def sweep(
    prompt: Optional[List[str]] = typer.Option(None, "--prompt", "-p", help="A prompt; repeat the option for more."),
    prompts_file: Optional[str] = typer.Option(None, "--prompts", help="A UTF-8 file of prompts, one per line."),
    model: Optional[str] = ModelOption,
    compute_dtype: str = ComputeOption,
    temps: List[str] = typer.Option(["1.0"], "--temps", "-t", help="Temperatures: '0.5,1,1.5' or the option repeated."),
    top_p: Optional[List[str]] = typer.Option(
        None, "--top-p", help="Top-p values to cross with the rest, e.g. '0.8,0.95'."
    ),
    top_k: Optional[List[str]] = typer.Option(None, "--top-k", help="Top-k values, e.g. '0,20'."),
    min_p: Optional[List[str]] = typer.Option(None, "--min-p", help="Min-p values, e.g. '0,0.05'."),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Seeds 0..N-1 for every cell."),
    seed_range: Optional[str] = typer.Option(None, "--seed-range", help="Seeds A..B-1, written A:B."),
    max_tokens: int = typer.Option(5, "--max-tokens", help="Tokens per completion (the lesson uses 5)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Seeds decoded together in one forward pass."),
    out: Optional[str] = typer.Option(None, "--out", help="Append one JSON line per completion to this file."),
    resume: bool = typer.Option(False, "--resume", help="Continue the sweep in --out: skip what it already holds."),
    chat: bool = ChatOption,
    thinking: bool = ThinkingOption,
    system: Optional[str] = SystemOption,
    raw_special_tokens: bool = RawSpecialOption,
    json_out: bool = JsonOption,
    shard_model: bool = ShardModelOption,
):
    """Draw one completion per prompt, setting and seed; tally each cell's answers against the model's
    own probability of their first token. Under mlx.launch the seeds are shared among the ranks, or
    with --shard-model the model is split across them and rank 0 writes --out."""
    import mlxinfer
    from mlxinfer.engine.sweep import prompts_from_file, settings_grid
    from mlxinfer.errors import MlxinferError

    if (seeds is None) == (seed_range is None):
        raise MlxinferError("give exactly one of --seeds N or --seed-range A:B")
    if bool(prompt) == bool(prompts_file):
        raise MlxinferError("give prompts with --prompt (repeated) or --prompts FILE, one of the two")
    if seed_range is not None:
        flags.use(seeds="--seed-range")
    prompts = list(prompt) if prompt else prompts_from_file(prompts_file)
    grid = settings_grid(
        parse_numbers(temps, "--temps"),
        None if top_p is None else parse_numbers(top_p, "--top-p"),
        None if top_k is None else parse_numbers(top_k, "--top-k", int),
        None if min_p is None else parse_numbers(min_p, "--min-p"),
    )
    for cell in grid:
        mlxinfer.settings.user_settings(cell)  # bad values fail before the model loads
    m, tok = load_model(model, compute_dtype, shard=shard_model)
    quiet = json_out or other_rank()
    bar, update = progress_bar(1, "sweeping", enabled=not quiet)
    try:
        with bar:
            report = mlxinfer.sweep(
                m,
                tok,
                prompts,
                settings=grid,
                seeds=seeds if seeds is not None else seed_range,
                max_tokens=max_tokens,
                batch_size=batch_size,
                chat=chat,
                system=system,
                thinking=thinking,
                out=out,
                resume=resume,
                raw_special_tokens=raw_special_tokens,
                progress=update,
            )
    except KeyboardInterrupt:
        kept = f"every finished batch is in {out}; the same command with --resume continues" if out else "no --out"
        typer.echo(f"interrupted: {kept}", err=True)
        raise typer.Exit(130) from None
    if other_rank():
        return  # rank 0 prints for every rank
    if json_out:
        print_json({k: v for k, v in report.to_dict().items() if k != "records"})
    else:
        render(report)


def render(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    where = f" -> {report.out}" if report.out else ""
    console.print(
        f"[bold]{report.model}[/bold] ({report.definition}): {report.completions} completions{where} "
        f"({report.new_completions} new, {report.resumed} resumed; {report.ranks} rank(s), batches of "
        f"{report.batch_size}, {report.tokens_per_s:.1f} tok/s)",
        highlight=False,
    )
    if report.sharding:
        console.print(f"[dim]{sharding_line(report.sharding)}[/dim]", highlight=False)
    for cell in report.cells:
        settings = ", ".join(f"{k} {cell.settings[k]}" for k in ("temperature", "top_p", "top_k", "min_p"))
        test = (
            f"chi-square {cell.chi_square:.2f}, {cell.dof} dof, p = {cell.p_value:.3f}"
            if cell.p_value is not None
            else "too few draws for a chi-square test"
        )
        t = Table(title=f"{cell.prompt!r}\n{settings}: {cell.draws} draws; first tokens vs the model: {test}")
        for name in ("answer", "count", "share", "95% interval", "first token", "model's p"):
            t.add_column(name, justify="left" if name in ("answer", "first token") else "right")
        for a in cell.answers:
            t.add_row(
                repr(a.answer),
                str(a.count),
                f"{a.share:.1%}",
                f"{a.share_low:.1%}-{a.share_high:.1%}",
                repr(a.first_token_text),
                f"{a.first_token_prob:.1%}",
            )
        console.print(t)
