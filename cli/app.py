"""The Typer app. Each command lives in its own module and imports mlx only when it runs."""

from __future__ import annotations

import sys

import typer

from mlxinfer.errors import MlxinferError

app = typer.Typer(
    name="mlxinfer",
    help="Open a language model and see what it computes: count, topk, sample, generate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from cli import commands  # noqa: F401  (each module adds its command to `app`)


def main() -> None:
    _register()
    try:
        app()
    except MlxinferError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
