"""The Typer app: the commands, listed here, and the one place errors become one line.

Each command parses its options, calls one library function and renders the result; none
imports mlx (the library does, when a command runs). Bad input is one line on stderr and exit
code 2: the library's MlxinferError with its parameter names swapped for our flags
(cli/flags.py), and Click's own usage errors (a missing option, `--max-tokens abc`). `--debug`, before
the command or anywhere after it, adds the error's detail (e.g. each layer's NaN/inf counts) on the
lines after it.
"""

from __future__ import annotations

import errno
import inspect
import os
import re
import signal
import sys

import click
import typer
from typer.core import TyperGroup

from mlxinfer_cli import _aborted, completion, flags
from mlxinfer import MlxinferError, OutputError


_debug = {"on": False}
# how MLX's distributed back ends word a peer gone (not its other errors: "[ring] Group split not supported.")
LOST_RANK = re.compile(r"connection to a peer was lost|(Recv|Send) failed with errno=")
DEBUG_HELP = "On an error, also print its detail (lines after the first)."


def _set_debug(ctx, param, value) -> None:
    if value:
        _debug["on"] = True


def _argument_help(command) -> None:
    """Each positional argument's help, as its typer.Argument gives it: Typer sets TyperArgument.help before
    calling click's __init__, which from click 8.5 (Argument takes help now) sets it back to None."""
    try:
        given = inspect.signature(command.callback).parameters
    except (TypeError, ValueError):
        return
    for p in command.params:
        info = getattr(given.get(p.name), "default", None)
        if isinstance(p, click.Argument) and not p.help and isinstance(getattr(info, "help", None), str):
            p.help = info.help


class _Commands(TyperGroup):
    def get_command(self, ctx, name):
        """Each command also takes --debug (anywhere on its line, as a flag of its own: never a value)."""
        command = super().get_command(ctx, name)
        if command is not None and not any(p.name == "debug" for p in command.params):
            command.params.append(
                click.Option(["--debug"], is_flag=True, expose_value=False, callback=_set_debug, help=DEBUG_HELP)
            )
            _argument_help(command)
        return command

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        checked = command is not None and not ctx.resilient_parsing and not {"-h", "--help"} & set(rest)
        misread = flags.misread_flag(rest, command.params) if checked else None  # not while completing a line
        if misread is not None:  # before Click reads -fa as -f a
            raise click.UsageError(misread, click.Context(command, info_name=name, parent=ctx))
        return name, command, rest

    def get_params(self, ctx):
        self.params = completion.by_name(self.params)  # once: the replacements are no longer flags
        return super().get_params(ctx)

    def invoke(self, ctx):
        flags._overrides.clear()
        flags._notes.clear()
        try:
            result = super().invoke(ctx)
            for note in flags._notes:  # deprecated spellings, said once the command has succeeded
                typer.echo(note, err=True)
            return result
        except RuntimeError as e:
            if not LOST_RANK.search(str(e)):
                raise
            # a peer gone mid-run (a Mac asleep, a rank killed): was a traceback from whichever collective noticed
            typer.echo(
                f"error: this rank lost the other ranks mid-run ({_clipped(' '.join(str(e).split()))}); run the "
                "command again on every rank (a sweep's --resume continues from its part files)",
                err=True,
            )
            raise typer.Exit(1) from None
        except MlxinferError as e:
            more = " (mlxinfer --debug ... shows more)" if e.detail and not _debug["on"] else ""
            typer.echo(f"error: {_clipped(flags.error_line(e))}{more}", err=True)
            if _debug["on"]:
                for line in e.detail:
                    typer.echo(f"  {line}", err=True)
            raise typer.Exit(e.exit_code) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if signal.getsignal(signal.SIGINT) is _aborted:  # the commands are built: Ctrl-C is theirs to hear
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            code = 2
        except click.UsageError as e:
            hint = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
            line = " ".join(e.format_message().split())
            line = flags.peer_hint(sys.argv[1:] if args is None else list(args), line, e.ctx) or line
            typer.echo(f"error: {line}{hint}", err=True)
            code = 2
        except click.ClickException as e:
            typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            code = e.exit_code
        except click.Abort:
            typer.echo("aborted", err=True)
            code = 130
        sys.exit(code if isinstance(code, int) else 0)


def _clipped(line: str, most: int = 2_000) -> str:
    """An error line of a readable length: a name read from a hostile file (a 100,000-character tensor
    name) made a 100 KB line."""
    return line if len(line) <= most else f"{line[: most // 2]} ... {line[-most // 4 :]}"


app = typer.Typer(
    name="mlxinfer",
    cls=_Commands,
    help="Open a language model and see what it computes: count, topk, sample, generate.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, powershell)
    pretty_exceptions_enable=False,
    suggest_commands=False,  # Click's own "Did you mean ...?" is enough: Typer's would repeat it
    context_settings={"help_option_names": ["-h", "--help"]},  # -h, as llama.cpp's and most tools' help
)


def _register() -> None:
    from mlxinfer_cli.commands import (
        answers,
        bench,
        chat,
        convert,
        count,
        generate,
        info,
        quality,
        quantize,
        sample,
        serve,
        tokens,
    )
    from mlxinfer_cli.commands import sweep
    from mlxinfer_cli.commands import topk
    from mlxinfer_cli.commands.explore import explore

    commands = {
        "count": count.count_command,
        "topk": topk.topk,
        "sample": sample.sample,
        "sweep": sweep.sweep,
        "answers": answers.answers,
        "tokens": tokens.tokens,
        "generate": generate.generate,
        "chat": chat.chat,
        "quantize": quantize.quantize_command,
        "convert": convert.convert_command,
        "quality": quality.quality_command,
        "bench": bench.bench,
        "info": info.info,
        "serve": serve.serve,
        "explore": explore,
    }
    for name, fn in commands.items():
        app.command(name, help=_reflow(fn.__doc__ or ""))(fn)


def _reflow(doc: str) -> str:
    """A docstring's paragraphs each as one line, for the terminal to wrap (typer keeps line breaks as
    they are written). A line indented past the paragraph's first, such as an example, keeps its own line."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    out = []
    for para in paragraphs:
        lines = para.splitlines()
        if any(line.startswith(" ") for line in lines):
            out.append("\n".join(lines))
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mlxinfer {version('mlxinfer')}")
        raise typer.Exit(0)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print mlxinfer's version and exit."
    ),
):
    _debug["on"] = debug


_register()


def _standard_streams() -> bool:
    """A standard stream that was closed (`<&-`, `>&-`, `2>&-`) is opened on /dev/null, so that no file the
    command opens takes its number and the command reads nothing (stdin) or says nothing (stderr) instead of
    failing in the middle. Returns False where stdout was closed: the output has nowhere to go."""
    usable = True
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself, as the lower ones are open
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            os.set_inheritable(fd, True)  # a child (the native build, bench's runs) gets it open too
            usable = usable and name != "stdout"
        else:
            if getattr(sys, name) is not None:
                continue
        setattr(sys, name, open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False))
    return usable


def _current_directory() -> None:
    """Deleted under a running shell, the current directory breaks imports that resolve relative paths."""
    try:
        os.getcwd()
    except FileNotFoundError:
        print("error: the current directory no longer exists; cd to one that does and run it again", file=sys.stderr)
        sys.exit(2)


_SILENT = {"serve", "explore"}  # commands whose stdout is used only with --json: run as daemons with `>&-`


def _writes_stdout(args: list[str]) -> bool:
    command = next((a for a in args if not a.startswith("-")), None)
    return command not in _SILENT or "--json" in args


def main() -> None:
    if not _standard_streams() and _writes_stdout(sys.argv[1:]):
        print(
            "error: cannot write the output: standard output is closed; point it at a file or a pipe", file=sys.stderr
        )
        sys.exit(1)
    _current_directory()
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is shown escaped, not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if hasattr(sys.stdin, "reconfigure"):  # text piped in is UTF-8 (as -p - reads it), whatever PYTHONIOENCODING
        # says; bytes that are not reach the commands' own "not valid UTF-8" check instead of a traceback
        interactive = sys.stdin.isatty()
        sys.stdin.reconfigure(**({} if interactive else {"encoding": "utf-8"}), errors="surrogateescape")
    try:
        app()
    except KeyboardInterrupt:  # before a command ran (Typer still building the commands): nothing written yet
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        if e.errno != errno.EPIPE and e.errno not in OutputError.ERRNOS:
            raise
        # the reader went away (`| head`: quiet, as other tools are) or the output's disk is full (one line);
        # either way stdout is pointed at /dev/null so that the exit's own flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if e.errno != errno.EPIPE:
            print(f"error: cannot write the output ({e.strerror}); free space where it goes", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
