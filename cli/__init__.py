"""The `mlxinfer` command line: a thin layer that renders what the library returns."""

import os
import signal


def _aborted(signum, frame) -> None:
    os.write(2, b"aborted\n")
    os._exit(130)


def main() -> None:
    """The `mlxinfer` command. Ctrl-C while the command line is still being put together (Typer, Click and
    Rich imported, the commands built: ~0.2 s) ends it as Ctrl-C does later, exit 130 and no traceback;
    app.main hands SIGINT back to Python once a command is about to run."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT was ignored (a
        signal.signal(signal.SIGINT, _aborted)  # script's background job), which stays ignored
    from .app import main as run

    run()
