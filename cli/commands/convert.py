"""`mlxinfer convert MODEL.gguf OUT`: the same numbers in an mlx-community style directory."""

from __future__ import annotations

import typer

from mlxinfer import defaults

from cli import flags
from cli.common import JsonOption, print_json


def convert_command(
    gguf: str = typer.Argument(..., help="A .gguf file (F32/F16/BF16/Q4_0/Q4_1/Q8_0 tensors), or 'embedded'."),
    out: str = typer.Argument(
        ..., help="The directory to write (refused if it exists and is not empty, unless --force)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists and is not empty."),
    max_shard_size: str = typer.Option(
        defaults.SHARD_SIZE,
        "--max-shard-size",
        help="Split the weights into shards of at most this size (with an index).",
    ),
    json_out: bool = JsonOption,
):
    """Convert a GGUF file to safetensors, keeping Q4_0/Q4_1/Q8_0 exactly as MLX affine weights (group 32)."""
    from cli.commands.quantize import render_summary
    from quant import convert_gguf

    flags.use(out="OUT")

    summary = convert_gguf(gguf, out, force=force, max_shard_bytes=max_shard_size)
    if json_out:
        print_json(summary)
    else:
        typer.echo(render_summary(summary))
