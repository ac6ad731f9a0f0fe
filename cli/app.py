"""The Typer app. Each command lives in its own module and imports mlx only when it runs."""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from mlxinfer.errors import MlxinferError


class _Commands(TyperGroup):
    """Turns a user-facing MlxinferError into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MlxinferError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(
    name="mlxinfer",
    cls=_Commands,
    help="Open a language model and see what it computes: count, topk, sample, generate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from cli import commands  # noqa: F401  (each module adds its command to `app`)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
