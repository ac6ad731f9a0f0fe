"""The Typer app: the commands, listed here, and the one place errors become one line.

Each command parses its options, calls one library function and renders the result; none
imports mlx (the library does, when a command runs). Bad input is one line on stderr and exit
code 2: the library's MlxinferError with its parameter names swapped for our flags
(cli/flags.py), and Click's own usage errors (a missing option, `--max-tokens abc`). `mlxinfer --debug
COMMAND ...` adds the error's detail (e.g. each layer's NaN/inf counts) on the lines after it.
"""

from __future__ import annotations

import sys

import click
import typer
from typer.core import TyperGroup

from cli import flags
from mlxinfer import MlxinferError


_debug = {"on": False}


class _Commands(TyperGroup):
    def invoke(self, ctx):
        flags._overrides.clear()
        try:
            return super().invoke(ctx)
        except MlxinferError as e:
            more = " (mlxinfer --debug ... shows more)" if e.detail and not _debug["on"] else ""
            typer.echo(f"error: {flags.error_line(e)}{more}", err=True)
            if _debug["on"]:
                for line in e.detail:
                    typer.echo(f"  {line}", err=True)
            raise typer.Exit(2) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            code = 2
        except click.UsageError as e:
            hint = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
            typer.echo(f"error: {' '.join(e.format_message().split())}{hint}", err=True)
            code = 2
        except click.ClickException as e:
            typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            code = e.exit_code
        except click.Abort:
            typer.echo("aborted", err=True)
            code = 130
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="mlxinfer",
    cls=_Commands,
    help="Open a language model and see what it computes: count, topk, sample, generate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from cli.commands import bench, convert, count, generate, info, quality, quantize, sample, sweep, topk

    app.command("count")(count.count_command)
    app.command("topk")(topk.topk)
    app.command("sample")(sample.sample)
    app.command("sweep")(sweep.sweep)
    app.command("generate")(generate.generate)
    app.command("quantize")(quantize.quantize_command)
    app.command("convert")(convert.convert_command)
    app.command("quality")(quality.quality_command)
    app.command("bench")(bench.bench)
    app.command("info")(info.info)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mlxinfer {version('mlxinfer')}")
        raise typer.Exit(0)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="On an error, also print its detail (lines after the first)."),
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print mlxinfer's version and exit."
    ),
):
    _debug["on"] = debug


_register()


def main() -> None:
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is shown escaped, not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    app()


if __name__ == "__main__":
    main()
