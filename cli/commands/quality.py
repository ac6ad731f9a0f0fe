"""`mlxinfer quality REF CANDIDATE...`: bytes, KL divergence, top-1 agreement and perplexity."""

from __future__ import annotations

from typing import List, Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import JsonOption, print_json
from mlxinfer_cli.options import model_or_first


def quality_command(
    reference: Optional[str] = typer.Argument(
        None,
        help="The reference model (a directory, .gguf, repo id, or 'embedded'); or give it as --model.",
        show_default=False,
    ),
    candidates: Optional[List[str]] = typer.Argument(
        None, help="One or more models to compare with it (same tokenizer).", show_default=False
    ),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The reference model, instead of REFERENCE."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Only the first N tokens of the text."),
    window: int = typer.Option(defaults.QUALITY_WINDOW, "--window", help="Tokens per independent window of context."),
    text: Optional[str] = typer.Option(
        None, "--text", help="A UTF-8 text file instead of the shipped quant/data/eval.txt."
    ),
    json_out: bool = JsonOption,
):
    """Compare models over a fixed text through float32 copies of their (dequantized) weights."""
    from mlxinfer import MlxinferError
    from mlxinfer_quant import evaluate

    flags.use(source="a model (REFERENCE or CANDIDATE)")  # --model where the reference is given as that
    usage = "mlxinfer quality REFERENCE CANDIDATE..., or --model REFERENCE CANDIDATE..."
    reference, candidates = model_or_first(model, [reference, *(candidates or [])], usage)
    if not candidates:
        raise MlxinferError(f"give at least one model to compare with the reference: {usage}", "candidates")
    with progress_printer() as bars:
        report = evaluate(reference, candidates, max_tokens=max_tokens, window=window, text=text, progress=bars)
    report = report.to_dict()
    if json_out:
        print_json(report)
    else:
        typer.echo(render(report))


def progress_printer() -> "QualityBars":
    """evaluate's progress as rich bars on stderr (use it as a context manager)."""
    return QualityBars()


class QualityBars:
    """Two bars on stderr, only at a terminal (so an error stays the one line on stderr): every model's
    windows, with the time left, and the current model's; each model's result printed above them."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.progress import TimeRemainingColumn

        console = Console(stderr=True)
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        self.progress = Progress(*columns, TimeRemainingColumn(), console=console, disable=not console.is_terminal)
        self.all = self.progress.add_task("windows, all models", total=None)
        self.model, self.index = None, None

    def __enter__(self) -> "QualityBars":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, step) -> None:
        """One quant.QualityProgress."""
        p = self.progress
        p.update(self.all, total=step.models * step.windows, completed=step.index * step.windows + step.window)
        if step.index != self.index:
            if self.model is not None:
                p.remove_task(self.model)
            self.model = p.add_task(f"{step.model} ({step.index + 1} of {step.models})", total=step.windows)
            self.index = step.index
        p.update(self.model, completed=step.window)
        if step.line:
            p.console.print(step.line, highlight=False)


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
