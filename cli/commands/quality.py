"""`mlxinfer quality REF CANDIDATE...`: bytes, KL divergence, top-1 agreement and perplexity."""

from __future__ import annotations

from typing import List, Optional

import typer

from cli.common import JsonOption, print_json


def quality_command(
    reference: str = typer.Argument(..., help="The reference model (a directory, .gguf, repo id, or 'embedded')."),
    candidates: List[str] = typer.Argument(..., help="One or more models to compare with it (same tokenizer)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Only the first N tokens of the text."),
    window: int = typer.Option(512, "--window", help="Tokens per independent window of context."),
    text: Optional[str] = typer.Option(
        None, "--text", help="A UTF-8 text file instead of the shipped quant/data/eval.txt."
    ),
    json_out: bool = JsonOption,
):
    """Compare models over a fixed text through float32 copies of their (dequantized) weights."""
    from quant.quality import evaluate

    report = evaluate(
        reference, candidates, max_tokens=max_tokens, window=window, text=text, progress=progress_printer()
    ).to_dict()
    if json_out:
        print_json(report)
    else:
        typer.echo(render(report))


def progress_printer():
    """Progress lines on stderr, only at a terminal (so an error stays the one line on stderr)."""
    import sys

    if not sys.stderr.isatty():
        return None
    return lambda line: typer.echo(line, err=True)


def render(r: dict) -> str:
    from quant.quality import ModelQuality, QualityReport

    report = QualityReport(
        **{**r, "reference": ModelQuality(**r["reference"]), "candidates": [ModelQuality(**c) for c in r["candidates"]]}
    )
    head = (
        f"{r['text']}: {r['tokens']:,} tokens, {r['positions']:,} next-token predictions compared "
        f"(windows of {r['window']}); every model through float32 copies of its weights"
    )
    return head + "\n\n" + report.markdown()
