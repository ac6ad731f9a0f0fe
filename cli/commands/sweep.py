"""`mlxinfer sweep`: prompts x settings x seeds, a results file that survives interruption, a summary."""

from __future__ import annotations

from pathlib import Path

from typing import List, Optional

import typer

from mlxinfer import GRID_FIELDS, defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import load_model, other_rank, print_json, progress_bar, sharding_line, stdout_console
from mlxinfer_cli.commands.sample import exact_cell, exact_line
from mlxinfer_cli.options import (
    chat_kwargs,
    exact_kwargs,
    grid,
    launched,
    max_tokens_option,
    name_prompt_source,
    piped_stdin,
    prompt_text,
    seeds,
    stop,
    takes,
)

SHOWN = 12  # answers per cell in the table


@takes("model", "seeds", "chat", "grid", "stop", "grouping", "exact", "walk", "json")
def sweep(
    prompt: Optional[List[str]] = typer.Option(
        None, "--prompt", "-p", help="A prompt; repeat the option for more; - reads one from standard input."
    ),
    prompt_file: Optional[str] = typer.Option(None, "--prompt-file", "-f", help="One prompt: this UTF-8 file's text."),
    prompts_file: Optional[str] = typer.Option(
        None, "--prompts", help="A UTF-8 file of prompts, one per line (-: standard input)."
    ),
    max_tokens: int = max_tokens_option(defaults.MAX_TOKENS_SAMPLE, "Tokens per completion (the lesson uses 5)."),
    out: Optional[str] = typer.Option(None, "--out", help="Append one JSON line per completion to this file."),
    resume: bool = typer.Option(False, "--resume", help="Continue the sweep in --out: skip what it already holds."),
    **options,
):
    """Draw one completion per prompt, setting and seed, and tally each cell's answers against the model's own
    probability of their first token. Under mlx.launch the seeds are shared among the ranks, or with --shard-model
    the model is split across them and rank 0 writes --out."""
    import mlxinfer
    from mlxinfer import MlxinferError

    flags.use(temperature="--temps")  # a grid value's error names the grid's flag
    seed_ids = seeds(options)
    given = list(prompt or [])
    if not (given or prompt_file or prompts_file) and piped_stdin():
        given = ["-"]  # text piped in and no prompt named: read as -p - reads it
    if given.count("-") > 1:  # the second read would find it empty: say why, not "standard input is empty"
        raise MlxinferError(
            f"-p - is given {given.count('-')} times, but standard input can be read once; give -p - once "
            "(the other prompts as -p TEXT)"
        )
    if len(given) <= 1:  # one prompt: an error about it names where it came from
        name_prompt_source(given[0] if given else None, prompt_file)
    if prompt_file is not None:
        given = [prompt_text(None if not given else given[0], prompt_file)]  # both given: refused there
    given = [prompt_text(p, None) for p in given]
    if bool(given) == bool(prompts_file):
        raise MlxinferError("give prompts with --prompt (repeated), --prompt-file or --prompts FILE, one of them")
    if prompts_file == "-" and launched():  # every rank would wait for ever on it
        raise MlxinferError(
            "--prompts - reads standard input, which mlx.launch keeps open and never ends for its ranks; "
            "give --prompts FILE"
        )
    prompts = given or mlxinfer.prompts_from_file(prompts_file)
    cells = grid(options)
    stops = stop(options)
    walk = exact_kwargs(options)
    batch_size = mlxinfer.check_batch_size(options["batch_size"])
    m, tok = load_model(options["model"], options["compute_dtype"], shard=options["shard_model"])
    json_out = options["json_out"]
    quiet = json_out or other_rank()
    bar, update = progress_bar(1, "sweeping", enabled=not quiet)
    try:
        with bar:
            report = mlxinfer.sweep(
                m,
                tok,
                prompts,
                settings=cells,
                seeds=seed_ids,
                max_tokens=max_tokens,
                batch_size=batch_size,
                stop=stops,
                **walk,
                out=out,
                resume=resume,
                progress=update,
                **chat_kwargs(options),
            )
    except KeyboardInterrupt as e:
        parts = sorted(Path(out).expanduser().parent.glob(Path(out).name + ".rank*of*")) if out else []
        if out and Path(out).expanduser().exists():
            kept = f"every finished batch is in {out}; the same command with --resume continues"
        elif parts:  # under mlx.launch each rank keeps its own until the end (was: "nothing was written")
            kept = (f"every finished batch is in the ranks' files ({parts[0].name}, ...); the same command with "
                    "--resume, on as many ranks, continues")  # fmt: skip
        else:
            kept = "no batch had finished: nothing was written" if out else "no --out"
        typer.echo(f"interrupted: {kept}", err=True)
        raise typer.Exit(getattr(e, "exit_code", 130)) from None
    if other_rank():
        return  # rank 0 prints for every rank
    if json_out:
        print_json({k: v for k, v in report.to_dict().items() if k != "records"})
    else:
        render(report)


def render(report) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    where = f" -> {report.out}" if report.out else ""
    console.print(
        f"[bold]{report.model}[/bold] ({report.definition}): {report.completions} completions{where} "
        f"({report.new_completions} new, {report.resumed} resumed; {report.ranks} rank(s), batches of "
        f"{report.batch_size}, " + (f"{report.tokens_per_s:.1f} tok/s)" if report.new_completions else "none drawn)"),
        highlight=False,
    )
    if report.sharding:
        console.print(f"[dim]{sharding_line(report.sharding)}[/dim]", highlight=False)
    for cell in report.cells:
        settings = ", ".join(f"{k} {cell.settings[k]}" for k in GRID_FIELDS)
        test = (
            f"chi-square {cell.chi_square:.2f}, {cell.dof} dof (rare first tokens pooled), p = {cell.p_value:.3g}"
            if cell.p_value is not None
            else cell.test_note
        )
        t = Table(title=f"{cell.prompt!r}\n{settings}: {cell.draws} draws; first tokens vs the model: {test}")
        # the first token's probability: answers that begin with one token show the same one
        names = ["answer", "count", "share", "95% interval", "first token", "first token's p"]
        for name in names + (["exact p"] if cell.exact else []):
            t.add_column(name, justify="left" if name in ("answer", "first token") else "right")
        for a in cell.answers:
            t.add_row(
                repr(a.answer),
                str(a.count),
                f"{a.share:.1%}",
                f"{a.share_low:.1%}-{a.share_high:.1%}",
                repr(a.first_token_text),
                f"{a.first_token_prob:.1%}" if a.first_token_prob >= 0.0005 or not a.first_token_prob else "<0.1%",
                *([exact_cell(a.exact, cell.exact["remainder"])] if cell.exact else []),
            )
        console.print(t)
        if cell.exact:
            console.print(exact_line(cell.exact), highlight=False)
