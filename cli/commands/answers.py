"""`mlxinfer answers`: each whole answer's exact probability at several temperatures, by walking the token tree."""

from __future__ import annotations

from typing import List

import typer

from mlxinfer import defaults

from mlxinfer_cli.common import counted, load_model, print_json, stdout_console
from mlxinfer_cli.options import chat_kwargs, exact_kwargs, max_tokens_option, parse_numbers, settings, stop, takes

SHOWN = 20  # answers in the table
DEFAULT_TEMPS = ",".join(f"{t:g}" for t in defaults.TOPK_TEMPERATURES)


@takes("prompt", "model", "chat", "sampling", "stop", "schema", "grouping", "walk", "json")
def answers(
    temps: List[str] = typer.Option(
        [DEFAULT_TEMPS],
        "--temps",
        "-t",
        help="Columns: a list of temperatures, one column each: '0.5,1,1.5' or the option repeated (or --temp, "
        "the sampler's one temperature, instead; the other sampler settings apply to all).",
    ),
    max_tokens: int = max_tokens_option(defaults.MAX_TOKENS_SAMPLE, "Tokens per answer at most, as in sample."),
    batch_size: int = typer.Option(defaults.ANSWERS_BATCH_SIZE, "--batch-size", help="Paths per forward pass."),
    **options,
):
    """The exact probability of every whole answer under the settings a seed of `sample` runs with: the tree of
    tokens walked best-first, a batch of paths per forward pass, until --min-mass of each setting is resolved or
    --max-nodes paths are expanded. The last row is the remainder: what was not walked, a bound on every answer
    not listed and on what a listed one could still gain."""
    import mlxinfer

    sampling = settings(options)
    if "temperature" in sampling and temps != [DEFAULT_TEMPS]:  # was: --temps dropped without a word
        raise mlxinfer.MlxinferError("give the temperatures with --temps or one with --temp, not both")
    if "temperature" in sampling:
        temperatures = [sampling.pop("temperature")]
    else:
        temperatures = [mlxinfer.check_temperature(t, "temperatures") for t in parse_numbers(temps, "--temps")]
        if not temperatures:
            raise mlxinfer.MlxinferError("temperatures is empty; give at least one, e.g. 0.5,1,1.5", "temperatures")
    grid = [{**sampling, "temperature": t} for t in temperatures]
    stops = stop(options)
    schema = {"json_schema": options["json_schema"], "tool": options["tool"]}
    mlxinfer.Constraint.read(**schema)  # a bad schema fails before the model loads
    walk = exact_kwargs(options)
    batch_size = mlxinfer.check_batch_size(batch_size)
    m, tok = load_model(options["model"], options["compute_dtype"])
    bar, update = _progress(not options["json_out"])
    with bar:
        report = mlxinfer.answers(
            m,
            tok,
            options["prompt"],
            settings=grid,
            max_tokens=max_tokens,
            stop=stops,
            batch_size=batch_size,
            progress=update,
            **walk,
            **schema,
            **chat_kwargs(options),
        )
    if options["json_out"]:
        print_json(report.to_dict())
    else:
        render(report)
    if report.stopped == "interrupted":  # what was found is shown, with its bound; a script still sees Ctrl-C
        raise typer.Exit(130)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not enabled or not console.is_terminal,
    )
    task = progress.add_task("walking the answers", total=None)

    def update(nodes: int, remainders: list[float]) -> None:
        left = " / ".join(f"{r:.4f}" for r in remainders)
        progress.update(task, description=f"walking the answers: {nodes:,} paths expanded, remainder {left}")

    return progress, update


def render(report) -> None:
    from mlxinfer_cli.common import folding_table as Table

    console = stdout_console()
    console.print(
        f"[bold]{report.model}[/bold] on {report.definition}  prompt: {counted(len(report.prompt_ids), 'token')}"
    )
    walked = (
        f"{counted(report.nodes, 'path')} expanded in {counted(report.forward_passes, 'forward pass')}, "
        f"{report.leaves:,} ended; "
        f"{report.kv_bytes / 1e6:,.1f} MB of keys and values kept; stopped: {report.stopped}"
    )
    console.print(f"[dim]{walked}[/dim]", highlight=False)
    t = Table(
        title=f"whole answers (grouped by {report.group}), up to {counted(report.max_tokens, 'token')}; "
        "rows by their highest probability in any column"
    )
    t.add_column("answer")
    for s in report.settings:
        t.add_column(_label(s), justify="right")
    t.add_column("most likely path")
    at_least = ["≥" if m.remainder > 0 else "" for m in report.mass]  # the walk left some of that column's mass
    for a in report.answers[:SHOWN]:
        path = "|".join(a.paths[0].pieces) if a.paths else ""
        t.add_row(repr(a.answer), *(f"{g}{p:.4f}" for g, p in zip(at_least, a.probs)), repr(path))
    rest = report.answers[SHOWN:]
    if rest:
        sums = [sum(a.probs[i] for a in rest) for i in range(len(report.settings))]
        t.add_row(f"({len(rest):,} more answers)", *(f"{g}{p:.4f}" for g, p in zip(at_least, sums)), "")
    t.add_row("(not walked: remainder)", *(_remainder(m.remainder) for m in report.mass), "", style="dim")
    console.print(t)
    if any(at_least):
        console.print(
            "[dim]≥: at least. The walk stopped before resolving that column: a listed answer may still gain up to "
            "its remainder. Exact values need a complete walk (raise --max-nodes, or cut the tail with "
            "--top-k/--top-p/--min-p).[/dim]",
            highlight=False,
        )
    if report.stopped == "max_nodes" and not report.answers:
        console.print("[dim]no answer ended within the budget: raise --max-nodes[/dim]", highlight=False)


def _label(settings: dict) -> str:
    extra = [f"{k} {settings[k]}" for k, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)) if settings[k] != off]
    return f"p @ T={settings['temperature']:g}" + (f"\n{', '.join(extra)}" if extra else "")


def _remainder(r: float) -> str:
    """0 only where the walk was complete: a remainder too small for four places says so (was: 0.0000)."""
    return f"{r:.4f}" if r == 0 or r >= 5e-5 else f"{r:.1e}"
