"""`mlxinfer chat`: a conversation at the terminal; the session and its commands live in mlxinfer.ChatSession."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from mlxinfer import MlxinferError, defaults

from mlxinfer_cli import flags
from mlxinfer_cli.common import load_model, print_json
from mlxinfer_cli.options import max_tokens_option, settings, stop, takes

PROMPT = ">>> "


@takes("model", "sampling", "penalties", "stop", "json")
def chat(
    max_tokens: int = max_tokens_option(defaults.MAX_TOKENS_GENERATE, "Stop each reply after this many new tokens."),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed every reply with this (default: a fresh seed per reply, shown before it)."
    ),
    system: Optional[str] = typer.Option(
        None,
        "--system",
        help="A system message for the chat template ('' gives an empty one, in place of its default).",
    ),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Qwen3's thinking switch."),
    **options,
):
    """Chat with the model: each reply reads the whole conversation through the model's chat template and
    streams; its seed is shown, and `generate --messages FILE --seed N` with that seed and the conversation
    up to it (a /save file, its later replies dropped) writes it again.

    /help lists the commands (/temp, /top-k, /min-p and a command for each sampler flag, /seed, /system, /topk,
    /save, /reset, /quit). Ctrl-C stops a reply, Ctrl-D leaves. With --json each reply and command prints one
    line of JSON instead (JSON Lines)."""
    import mlxinfer

    sampling, stops = settings(options), stop(options)
    mlxinfer.check_max_tokens(max_tokens)
    m, tok = load_model(options["model"], options["compute_dtype"], shard=False)
    session = mlxinfer.ChatSession(
        m, tok, settings=sampling, seed=seed, system=system, max_tokens=max_tokens, thinking=thinking, stop=stops
    )
    json_out = options["json_out"]
    flags.use(prompt="conversation")  # what the model reads: every message so far, through the template
    interactive = sys.stdin.isatty()
    shown = [""]  # the settings' note shown last (a cell _turn updates)
    if interactive:
        _readline()
    if not json_out:
        print(f"[{m.info.name}] /help lists the commands; Ctrl-C stops a reply, Ctrl-D leaves", file=sys.stderr)
    failed = 0  # lines refused: a piped conversation that lost some exits 2 at its end
    while True:
        try:
            line = _read_line(interactive).removesuffix("\r")  # a file saved with CRLF endings
        except EOFError:
            if interactive and not json_out:
                print()  # the shell's prompt on a line of its own
            break
        except MlxinferError as e:  # a line past the bound: the rest of the input is not read
            failed += _failed(flags.error_line(e), json_out)
            break
        except KeyboardInterrupt:  # at the prompt: drop the line, as a shell does
            if not interactive:  # reading a pipe or a file, no line to drop: Ctrl-C ends it, as elsewhere
                raise
            print(file=sys.stderr if json_out else sys.stdout)  # stdout holds JSON Lines alone
            continue
        if not line.strip():
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, kept by stdin's surrogateescape (was: /system took them)
            failed += _failed("this line is not valid UTF-8 text; type or pipe UTF-8", json_out)
            continue
        if line.startswith("/"):
            outcome = session.command(line)
            failed += outcome.kind == "error"
            if json_out:
                print_json(outcome.to_dict(), one_line=True)
            else:
                _render(outcome)
            if outcome.kind == "quit":
                break
            continue
        failed += not _turn(session, line, json_out, shown)
    if failed and not interactive:
        lines = f"{failed} line{'s' if failed > 1 else ''}"
        print(f"error: {lines} of the conversation failed (said above)", file=sys.stderr)
        raise typer.Exit(2)


def _read_line(interactive: bool) -> str:
    """A line typed at the prompt, or read from a pipe or a file within the prompt's bound."""
    import mlxinfer

    return input(PROMPT) if interactive else mlxinfer.read_line(sys.stdin)


def _failed(message: str, json_out: bool) -> bool:
    """A line refused: said on stderr, and with --json as a record of its own (the lines stay in step)."""
    print(f"error: {message}", file=sys.stderr)
    if json_out:
        print_json({"command": None, "kind": "error", "message": message, "data": None}, one_line=True)
    return True


def _turn(session, line: str, json_out: bool, shown: list[str]) -> bool:
    """One reply; its settings' note goes before it whenever it differs from the last one shown. False where
    the message was refused."""
    from mlxinfer import MlxinferError

    turn = None
    try:
        turn = session.reply(line)
        if not json_out:
            note = turn.record.settings_note
            head = [f"[seed {turn.seed}]"] if turn.seed is not None else []  # greedy: no seed to keep
            head += [note] if note != shown[0] else []
            if head:
                print(" ".join(head), file=sys.stderr, flush=True)
            shown[0] = note
        for text in turn:
            if not json_out:
                sys.stdout.write(text)
                sys.stdout.flush()
    except MlxinferError as e:  # the conversation is unchanged: say why and take the next line
        return not _failed(flags.error_line(e), json_out)
    except KeyboardInterrupt:
        if turn is None:  # stopped before the reply began: nothing to keep
            print(file=sys.stderr if json_out else sys.stdout)
            return True
        turn.stop()
        if not json_out:
            sys.stdout.write(" [stopped]")
    if json_out:
        print_json(turn.record.to_dict(), one_line=True)
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return True


def _render(outcome) -> None:
    if outcome.kind == "error":
        print(f"error: {outcome.message}", file=sys.stderr)
    elif outcome.kind == "help":
        width = max(len(usage) for usage, _ in outcome.data)
        for usage, what in outcome.data:
            print(f"  {usage:<{width}}  {what}")
    elif outcome.kind == "table":
        from mlxinfer_cli.commands.topk import render

        render(outcome.data)
    else:
        print(outcome.message)


def _readline() -> None:
    """Line editing and a history kept between chats (stdlib readline, where Python has it), in
    $MLXINFER_CHAT_HISTORY or ~/.cache/mlxinfer/chat_history."""
    try:
        import readline
    except ImportError:
        return
    path = Path(os.environ.get("MLXINFER_CHAT_HISTORY") or Path.home() / ".cache" / "mlxinfer" / "chat_history")
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    import atexit

    def save() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    atexit.register(save)
