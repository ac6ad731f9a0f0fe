"""`mlxinfer convert MODEL.gguf OUT`: the same numbers in an mlx-community style directory."""

from __future__ import annotations

from typing import Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import JsonOption, print_json
from mlxinfer_cli.options import model_or_first


def convert_command(
    gguf: Optional[str] = typer.Argument(
        None,
        help="A .gguf file (F32/F16/BF16, Q4_0 to Q8_0, the K-quants and i-quants), or 'embedded'. Or give it as "
        "--model.",
        show_default=False,
    ),
    out: Optional[str] = typer.Argument(
        None,
        help="The directory to write (refused if it exists and is not empty, unless --force).",
        show_default=False,
    ),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The .gguf file to convert, instead of GGUF."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists and is not empty."),
    max_shard_size: str = typer.Option(
        defaults.SHARD_SIZE,
        "--max-shard-size",
        help="Split the weights into shards of at most this size (with an index).",
    ),
    json_out: bool = JsonOption,
):
    """Convert a GGUF file to safetensors as MLX affine weights (group 32): Q4_0/Q4_1/Q5/Q8_0, Q4_K/Q5_K and
    IQ4 exactly; Q6_K, Q3_K, Q2_K and the other i-quants re-fit at 8 bits (docs/commands.md lists each type)."""
    from mlxinfer_cli.commands.quantize import render_summary
    from mlxinfer_quant import convert_gguf

    from mlxinfer import MlxinferError

    flags.use(source="GGUF", out="OUT")  # --model where it is given as that
    gguf, rest = model_or_first(model, [gguf, out], "mlxinfer convert MODEL.gguf OUT, or --model MODEL.gguf OUT")
    if len(rest) != 1:
        raise MlxinferError("give the file and the directory to write: GGUF OUT, or --model GGUF OUT (not both)")
    (out,) = rest

    summary = convert_gguf(gguf, out, force=force, max_shard_bytes=max_shard_size)
    if json_out:
        print_json(summary)
    else:
        typer.echo(render_summary(summary))
