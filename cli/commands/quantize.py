"""`mlxinfer quantize SRC OUT`: an mlx-community style directory of MLX affine (or float) weights."""

from __future__ import annotations

from typing import Optional

import typer

from mlxinfer import MlxinferError, defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import JsonOption, print_json
from mlxinfer_cli.options import model_or_first

SRC_HELP = (
    "The model to quantize: a local directory, a .gguf file, a Hugging Face repo id, "
    "or 'embedded' for the embedded SmolLM2-135M-Instruct."
)


def quantize_command(
    src: Optional[str] = typer.Argument(None, help=SRC_HELP + " Or give it as --model.", show_default=False),
    out: Optional[str] = typer.Argument(
        None,
        help="The directory to write (refused if it exists and is not empty, unless --force).",
        show_default=False,
    ),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The model to quantize, instead of SRC."),
    bits: int = typer.Option(
        4, "--bits", help="Bits per weight: 1, 2, 3, 4, 5, 6 or 8; 16 writes float weights (dequantizes)."
    ),
    group_size: int = typer.Option(64, "--group-size", help="Weights per scale/bias group: 32, 64 or 128."),
    head_bits: Optional[int] = typer.Option(
        None,
        "--head-bits",
        help="The output table's bits (the shared table when tied): a --bits value (8 keeps it close), or 16 to "
        "leave it in float. Default: --bits.",
    ),
    embed_bits: Optional[int] = typer.Option(
        None, "--embed-bits", help="The input embedding table's bits; 16 leaves it in float. Default: --bits."
    ),
    dtype: str = typer.Option(
        "bf16", "--dtype", help="Float dtype of scales, biases, norms and float weights: bf16, f16 or f32."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists and is not empty."),
    max_shard_size: str = typer.Option(
        defaults.SHARD_SIZE,
        "--max-shard-size",
        help="Split the weights into shards of at most this size (with an index).",
    ),
    report: bool = typer.Option(
        False, "--report", help="Then compare OUT with SRC over the shipped text (see `mlxinfer quality`)."
    ),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", help="With --report: only the first N tokens of the text."
    ),
    window: int = typer.Option(
        defaults.QUALITY_WINDOW, "--window", help="With --report: tokens per independent window of context."
    ),
    json_out: bool = JsonOption,
):
    """Quantize a model to MLX affine weights (or dequantize it with --bits 16), as mlx-lm's convert does."""
    from mlxinfer_quant import quantize

    flags.use(source="SRC", out="OUT")
    src, rest = model_or_first(model, [src, out], "mlxinfer quantize SRC OUT, or mlxinfer quantize --model SRC OUT")
    if len(rest) != 1:
        raise MlxinferError("give the model and the directory to write: SRC OUT, or --model SRC OUT (not both)")
    (out,) = rest
    if report:
        from mlxinfer_quant import check_quality_options

        check_quality_options(max_tokens, window)  # before OUT is written
    elif max_tokens is not None or window != defaults.QUALITY_WINDOW:
        raise MlxinferError("--max-tokens and --window go with --report; add --report or drop them", "max_tokens")
    summary = quantize(
        src,
        out,
        bits=bits,
        group_size=group_size,
        head_bits=head_bits,
        embed_bits=embed_bits,
        dtype=dtype,
        force=force,
        max_shard_bytes=max_shard_size,
    )
    result = {"quantize": summary}
    if report:
        from mlxinfer_cli.commands.quality import progress_printer
        from mlxinfer_quant import evaluate

        with progress_printer() as bars:
            result["report"] = evaluate(src, [out], max_tokens=max_tokens, window=window, progress=bars).to_dict()
    if json_out:
        print_json(result if report else summary)
        return
    typer.echo(render_summary(summary))
    if report:
        from mlxinfer_cli.commands.quality import render

        typer.echo("")
        typer.echo(render(result["report"]))


def render_summary(s: dict) -> str:
    lines = [
        f"wrote {s['out']}",
        f"  from     {s['source']}",
        f"  weights  {s['policy']}, {s['dtype']}",
        f"  size     {s['tensor_bytes']:,} bytes of tensors ({s['bits_per_weight']:.2f} bits per weight; "
        f"source {s['source_bytes']:,} bytes, {s['source_bits_per_weight']:.2f})",
        "  files    " + ", ".join(f"{f['name']} ({f['bytes']:,})" for f in s["files"]),
    ]
    return "\n".join(lines + [f"note: {n}" for n in s.get("notes", ())])
