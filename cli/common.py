"""What every command shares: the model option, JSON output, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer

MODEL_HELP = (
    "Model: a local directory (config.json + safetensors), a .gguf file, a Hugging Face repo id, "
    "or nothing for the embedded SmolLM2-135M-Instruct."
)
ModelOption = typer.Option(None, "--model", "-m", help=MODEL_HELP)
JsonOption = typer.Option(False, "--json", help="Print the result as JSON instead of a table.")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=_jsonable) + "\n")


def _jsonable(obj: Any):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def fail(message: str) -> "typer.Exit":
    """One line on stderr, exit code 2: for bad input found in the CLI layer itself."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def console():
    from rich.console import Console

    return Console()


def parse_floats(values: list[str], option: str) -> tuple[float, ...]:
    """'0.5,1.0 1.5' or a repeated option -> (0.5, 1.0, 1.5)."""
    from mlxinfer.errors import MlxinferError

    out = []
    for value in values:
        for part in value.replace(",", " ").split():
            try:
                out.append(float(part))
            except ValueError:
                raise MlxinferError(f"{option} takes numbers like 0.5,1.0,1.5; got '{part}'") from None
    return tuple(out)
