"""`mlxinfer topk`: one forward pass and the next-token table at several temperatures."""

from __future__ import annotations

from typing import List, Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import counted, load_model, other_rank, print_json, sharding_line, stdout_console
from mlxinfer_cli.options import chat_kwargs, parse_numbers, settings, takes


@takes("prompt", "model", "chat", "sampling", "json")
def topk(
    temps: List[str] = typer.Option(
        [",".join(f"{t:g}" for t in defaults.TOPK_TEMPERATURES)],
        "--temps",
        "-t",
        help="Columns: a list of temperatures, one probability column each: '0.5,1,1.5' or the option "
        "repeated (--temp is the sampler's, for --explain).",
    ),
    rows: Optional[int] = typer.Option(
        None, "--rows", "-n", help="How many tokens the table lists, by score (default 6)."
    ),
    k: Optional[int] = typer.Option(None, "-k", hidden=True),  # the old name of --rows
    explain: bool = typer.Option(
        False, "--explain", help="Show which tokens the sampler's cut keeps and their rescaled probabilities."
    ),
    **options,
):
    """Score every vocabulary token for the next position; list the top --rows with probabilities.

    Under mlx.launch the model is split across the ranks (tensor parallelism); rank 0 prints."""
    import mlxinfer

    if rows is not None and k is not None:
        raise mlxinfer.MlxinferError("give --rows, not both --rows and -k (-k is its old name)")
    if k is not None:
        flags.use(k="-k")
    temperatures = [mlxinfer.check_temperature(t, "temperatures") for t in parse_numbers(temps, "--temps")]
    sampling = settings(options)
    m, tok = load_model(options["model"], options["compute_dtype"])
    table = mlxinfer.next_token_table(
        m,
        tok,
        options["prompt"],
        temperatures=temperatures,
        k=next(v for v in (rows, k, 6) if v is not None),
        settings=sampling or None,
        explain_sampler=explain,
        **chat_kwargs(options),
    )
    if other_rank():
        return  # under mlx.launch rank 0 prints for every rank
    if k is not None:
        flags.renamed("-k", "--rows")
    if options["json_out"]:
        print_json(table.to_dict())
    else:
        render(table)


def render(table) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    console.print(f"[bold]{table.model}[/bold]  prompt: {counted(len(table.prompt_ids), 'token')}", highlight=False)
    path = f" on {table.weights} weights" if table.weights else ""
    console.print(f"scores in one pass of {table.definition}{path}: {table.n_scores:,}", highlight=False)
    if table.sharding:
        console.print(f"[dim]{sharding_line(table.sharding)}[/dim]", highlight=False)
    t = Table(show_footer=True)
    t.add_column("#", justify="right", footer="")
    t.add_column("token", footer="top rows hold")
    t.add_column("id", justify="right", footer="")
    t.add_column("score", justify="right", footer="")
    for j, temp in enumerate(table.temperatures):
        t.add_column(f"p @ T={temp:g}", justify="right", footer=f"{table.mass[j]:.3f}")
    for row in table.rows:
        t.add_row(str(row.rank), repr(row.text), str(row.id), f"{row.score:.2f}", *(f"{p:.3f}" for p in row.probs))
    console.print(t)
    if table.explanation is not None:
        render_explain(console, table.explanation, table.settings_note)
    if table.routing:
        render_routing(console, table.routing)


def render_routing(console, routing) -> None:
    from mlxinfer_cli.common import folding_table as Table

    t = Table(title="experts the last token chose (router weight)")
    t.add_column("layer", justify="right")
    t.add_column("experts")
    for r in routing:
        t.add_row(str(r.layer), "  ".join(f"{e} ({w:.2f})" for e, w in zip(r.experts, r.weights)))
    console.print(t)


def render_explain(console, ex, note: str) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console.print(f"[dim]{note}[/dim]", highlight=False)
    s = ex.settings
    t = Table(title=f"the sampler at T={s['temperature']:g}: keeps {ex.n_kept:,} of {ex.vocab_size:,} tokens")
    total = all(r.running is not None for r in ex.rows)  # what top-p reads, where it reads the whole row
    total_name = "total so far" if s["order"] != "mlx-lm" else "total at T=1"
    for name in ("#", "token", f"p @ T={s['temperature']:g}", *([total_name] if total else []), "kept", "rescaled p"):
        t.add_column(name, justify="left" if name == "token" else "right")
    for r in ex.rows:
        t.add_row(
            str(r.rank),
            repr(r.text),
            f"{r.prob:.3f}",
            *([f"{r.running:.3f}"] if total else []),
            "yes" if r.kept else "cut",
            f"{r.final_prob:.3f}" if r.kept else "",
        )
    console.print(t)
    unshown = ex.n_kept - sum(r.kept for r in ex.rows)
    if unshown > 0 and ex.n_kept < ex.vocab_size:  # nothing cut: no row to reach
        rows = min(len(ex.rows) + unshown + 1, ex.vocab_size)
        more = f"--rows {rows}" if all(r.kept for r in ex.rows) else "more --rows"
        console.print(f"{unshown:,} more kept tokens are not shown ({more} shows them)", highlight=False)
    console.print(f"mass kept {ex.mass_kept:.3f}, cut off {ex.mass_cut:.3f}, then rescaled to 1", highlight=False)
