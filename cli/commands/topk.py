"""`mlxinfer topk`: one forward pass and the next-token table at several temperatures."""

from __future__ import annotations

from typing import List, Optional

import typer

from cli.app import app
from cli.common import JsonOption, ModelOption, parse_floats, print_json


@app.command("topk")
def topk(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The text the model reads."),
    model: Optional[str] = ModelOption,
    temps: List[str] = typer.Option(["0.5,1.0,1.5"], "--temps", "-t", help="Temperatures for the probability columns: '0.5,1,1.5' or the option repeated."),
    k: int = typer.Option(6, "-k", help="How many tokens to list, by score."),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="Wrap the prompt in the model's chat template."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Qwen3's thinking switch (the lessons use it off)."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message for the chat template."),
    json_out: bool = JsonOption,
):
    """Score every vocabulary token for the next position; show the top k with probabilities."""
    from mlxinfer.loading import load
    from mlxinfer.tables import next_token_table

    m, tok = load(model)
    table = next_token_table(m, tok, prompt, parse_floats(temps, "--temps"), k, chat=chat, thinking=thinking, system=system)
    if json_out:
        print_json(table.to_dict())
        return
    render(table)


def render(table) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{table.model}[/bold]  prompt: {len(table.prompt_ids)} tokens")
    console.print(f"scores in one pass: {table.n_scores:,}")
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
