"""`mlxinfer sample`: one completion per seed, then a tally of the distinct answers."""

from __future__ import annotations

import csv
import sys
from typing import Optional

import typer

from cli.app import app
from cli.common import (
    ComputeOption, JsonOption, MinPOption, ModelOption, OrderOption, TempOption, TopKOption, TopPOption,
    print_json, progress_bar, user_sampling,
)


@app.command("sample")
def sample(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The text the model reads."),
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
    chat: bool = typer.Option(True, "--chat/--no-chat", help="Wrap the prompt in the model's chat template."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Qwen3's thinking switch."),
    json_out: bool = JsonOption,
    csv_out: bool = typer.Option(False, "--csv", help="Print seed,text rows as CSV."),
):
    """The lesson's seeded experiment: same scores every run, a different draw per seed."""
    from mlxinfer.experiments import parse_seeds, sample_seeds
    from mlxinfer.loading import load
    from mlxinfer.sampler import resolve_settings

    seed_list = parse_seeds(seeds, seed_range)
    user = user_sampling(temp, top_p, top_k, min_p, order=order)
    m, tok = load(model, compute_dtype)
    settings, note = resolve_settings(user, m.generation_config)
    bar, update = progress_bar(len(seed_list), "sampling", enabled=len(seed_list) > 1 and not (json_out or csv_out))
    with bar:
        report = sample_seeds(
            m, tok, prompt, seed_list, settings, max_tokens=max_tokens, chat=chat, thinking=thinking,
            settings_note=note, progress=update,
        )
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
    console.print(f"[bold]{report.model}[/bold]  prompt: {len(report.prompt_ids)} tokens")
    console.print(f"[dim]{report.settings_note}[/dim]")
    for c in report.completions:
        console.print(f"seed {c.seed:>4}: {c.text!r}", highlight=False)
    t = Table(title=f"{len(report.completions)} draws")
    t.add_column("answer")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    for row in report.tally:
        t.add_row(repr(row.answer), str(row.count), f"{row.share:.0%}")
    console.print(t)
