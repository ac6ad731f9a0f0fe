"""`mlxinfer sample`: one completion per seed, then a tally of the distinct answers."""

from __future__ import annotations

import csv
import sys
import typer

from mlxinfer import defaults

from mlxinfer_cli.common import counted, load_model, other_rank, print_json, progress_bar, sharding_line, stdout_console
from mlxinfer_cli.options import chat_kwargs, exact_kwargs, max_tokens_option, seeds, settings, stop, takes


@takes("prompt", "model", "seeds", "sampling", "chat", "schema", "stop", "grouping", "exact", "walk", "json")
def sample(
    max_tokens: int = max_tokens_option(defaults.MAX_TOKENS_SAMPLE, "Tokens per completion (the lesson uses 5)."),
    csv_out: bool = typer.Option(False, "--csv", help="Print seed,text rows as CSV."),
    **options,
):
    """The lesson's seeded experiment: same scores every run, a different draw per seed.

    Under mlx.launch the seeds are shared among the ranks, or with --shard-model the model is split
    across them (tensor parallelism) and every rank runs every seed."""
    import mlxinfer

    seed_ids = seeds(options)
    if csv_out and options["json_out"]:
        raise mlxinfer.MlxinferError("--csv and --json each choose the output; pass one of them")
    if csv_out and options["exact"]:
        raise mlxinfer.MlxinferError("--csv's seed,text rows have no place for --exact's figures; use --json")
    batch_size = mlxinfer.check_batch_size(options["batch_size"])
    sampling = settings(options)
    stops = stop(options)
    walk = exact_kwargs(options)
    schema = {"json_schema": options["json_schema"], "tool": options["tool"]}
    mlxinfer.Constraint.read(**schema)  # a bad schema fails before the model loads
    m, tok = load_model(options["model"], options["compute_dtype"], shard=options["shard_model"])
    json_out = options["json_out"]
    quiet = json_out or csv_out or len(seed_ids) == 1 or other_rank()
    bar, update = progress_bar(len(seed_ids), "sampling", enabled=not quiet)
    with bar:
        report = mlxinfer.sample(
            m,
            tok,
            options["prompt"],
            seeds=seed_ids,
            settings=sampling,
            max_tokens=max_tokens,
            batch_size=batch_size,
            stop=stops,
            **walk,
            progress=update,
            **schema,
            **chat_kwargs(options),
        )
    if other_rank():  # under mlx.launch rank 0 prints for every rank
        if report.interrupted:
            raise typer.Exit(130)
        return
    if json_out:
        print_json(report.to_dict())
    elif csv_out:
        writer = csv.writer(sys.stdout)
        writer.writerow(["seed", "text", "finish_reason"])
        for c in report.completions:
            writer.writerow([c.seed, c.text, c.finish_reason])
    else:
        render(report)
    if report.interrupted:  # what finished is shown; a script still sees Ctrl-C
        typer.echo(f"interrupted: {report.interrupted}", err=True)
        raise typer.Exit(130)


def render(report) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    console.print(
        f"[bold]{report.model}[/bold] on {report.definition}  prompt: {counted(len(report.prompt_ids), 'token')}",
        highlight=False,
    )
    console.print(f"[dim]{report.settings_note}[/dim]", highlight=False)
    if report.sharding:
        console.print(f"[dim]{sharding_line(report.sharding)}[/dim]", highlight=False)
    for c in report.completions:
        mark = "" if c.valid is None else ("  (valid)" if c.valid else "  (cut: not valid JSON)")
        console.print(f"seed {c.seed:>4}: {c.text!r}{mark}", highlight=False)
    t = Table(title=f"{len(report.completions)} draws")
    t.add_column(f"answer ({report.group})")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    exact = report.exact is not None
    if exact:
        t.add_column("95% interval", justify="right")
        t.add_column("exact p", justify="right")
    for row in report.tally:
        cells = [repr(row.answer), str(row.count), f"{row.share:.1%}"]
        if exact:
            cells += [f"{row.share_low:.1%}-{row.share_high:.1%}", exact_cell(row.exact, report.exact["remainder"])]
        t.add_row(*cells)
    console.print(t)
    if exact:
        console.print(exact_line(report.exact), highlight=False)


def exact_cell(p: float | None, remainder: float) -> str:
    """An answer's exact probability; at least that where the walk left a remainder (as `answers` marks it);
    one the walk did not reach is at most its remainder."""
    if p is None:
        return f"<= {remainder:.2%}"
    return f"≥{p:.2%}" if remainder > 0 else f"{p:.2%}"


def exact_line(exact: dict) -> str:
    """The walk's remainder and the G-test of the tally against the exact distribution, in one line."""
    walk = f"exact: {counted(exact['answers'], 'answer')}" if "answers" in exact else "exact"
    walk += f", remainder {exact['remainder']:.4f} ({exact['stopped']})"
    if exact["remainder"] > 0:
        walk += " (≥: at least; draws on paths the walk did not reach count as other)"
    if exact["p_value"] is None:
        return f"{walk}; {exact['note']}"
    return (
        f"{walk}; G-test of the tally against it: G = {exact['g']:.2f}, {exact['dof']} dof, "
        f"p = {exact['p_value']:.3g} (other, the answers expected fewer than 5 times and any not listed: "
        f"{exact['other_observed']} drawn, {exact['other_expected']:.1f} expected)"
    )
