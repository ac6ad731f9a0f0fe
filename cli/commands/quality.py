"""`mlxinfer quality REF CANDIDATE...`: bytes, KL divergence, top-1 agreement and perplexity."""

from __future__ import annotations

from typing import List, Optional

import typer

from mlxinfer import defaults

from cli.common import JsonOption, print_json


def quality_command(
    reference: str = typer.Argument(..., help="The reference model (a directory, .gguf, repo id, or 'embedded')."),
    candidates: List[str] = typer.Argument(..., help="One or more models to compare with it (same tokenizer)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Only the first N tokens of the text."),
    window: int = typer.Option(defaults.QUALITY_WINDOW, "--window", help="Tokens per independent window of context."),
    text: Optional[str] = typer.Option(
        None, "--text", help="A UTF-8 text file instead of the shipped quant/data/eval.txt."
    ),
    json_out: bool = JsonOption,
):
    """Compare models over a fixed text through float32 copies of their (dequantized) weights."""
    from quant import evaluate

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
    """The report as a markdown table (the README's quantization table is this output)."""
    ref = r["reference"]
    lines = [
        f"{r['text']}: {r['tokens']:,} tokens, {r['positions']:,} next-token predictions compared "
        f"(windows of {r['window']}); every model through float32 copies of its weights",
        "",
        "| model | weights | bits/weight | bytes | vs reference | mean KL (nats) | top-1 agreement | perplexity |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| {ref['name']} (reference) | {ref['weights']} | {ref['bits_per_weight']:.2f} | {ref['bytes']:,} | 1.00x "
        f"| - | - | {ref['perplexity']:.3f} |",
    ]
    for c in r["candidates"]:
        lines.append(
            f"| {c['name']} | {c['weights']} | {c['bits_per_weight']:.2f} | {c['bytes']:,} "
            f"| {c['bytes'] / ref['bytes']:.2f}x | {c['kl_mean']:.4f} | {c['top1_agreement']:.1%} "
            f"| {c['perplexity']:.3f} |"
        )
    return "\n".join(lines)
