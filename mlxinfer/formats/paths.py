"""Files a user names: what a path is when it is not the regular file asked for, and a bounded read.

A link to /dev/zero is not "a directory", and /dev/zero does not "not exist": the message says what
the path is, so that the fix it names is the right one. A read never takes more than its limit, so a
device or a pipe that never ends cannot fill the memory.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from ..errors import MlxinferError


def what_it_is(path: Path) -> str:
    """What `path` is, in words, when it is not a regular file ("does not exist", "is a directory", ...)."""
    if path.is_symlink() and not path.exists():
        return "is a link to a file that is gone"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    via = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
    if stat.S_ISDIR(mode):
        return f"is a directory{via}"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"is a device, not a file{via}"
    if stat.S_ISFIFO(mode):
        return f"is a pipe, not a file{via}"
    if stat.S_ISSOCK(mode):
        return f"is a socket, not a file{via}"
    return "is a regular file" if stat.S_ISREG(mode) else f"is not a regular file{via}"


def read_text_file(path: str | os.PathLike, param: str, limit: int, what: str = "a UTF-8 text file") -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; else one MlxinferError naming `param`,
    the path and what it is instead."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MlxinferError(f"{param} {path} {what_it_is(path)}; pass {what}", param)
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the check and the open
                raise MlxinferError(f"{param} {path} is not a regular file; pass {what}", param)
            data = f.read(limit + 1)
    except OSError as e:
        raise MlxinferError(f"{param} {path} cannot be read ({e.strerror}); pass {what}", param) from None
    if len(data) > limit:
        raise MlxinferError(f"{param} {path} is over {limit:,} bytes; pass a smaller file", param)
    try:
        return data.decode("utf-8-sig")  # a byte order mark (Windows editors write one) is not text
    except UnicodeDecodeError:
        raise MlxinferError(f"{param} {path} is not UTF-8 text; pass {what}", param) from None


MAX_PROMPT_BYTES = 16 << 20


def read_prompt(source: str | os.PathLike, stdin=None) -> str:
    """A prompt from a file, or from standard input for '-' (`stdin`: a binary stream, default
    sys.stdin's): UTF-8 text of at most MAX_PROMPT_BYTES, not empty, its one final line break
    dropped (what `echo TEXT |` and most editors add)."""
    if str(source) == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        where, param = "standard input (-p -)", ()
        data = stream.read(MAX_PROMPT_BYTES + 1)
        if len(data) > MAX_PROMPT_BYTES:
            raise MlxinferError(f"{where} is over {MAX_PROMPT_BYTES:,} bytes; pass a shorter prompt", *param)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise MlxinferError(f"{where} is not UTF-8 text; pipe UTF-8 text in", *param) from None
        fix = "pipe the text in: echo TEXT | mlxinfer ... -p -"
    else:
        param = ("prompt_file",)
        text = read_text_file(source, param[0], MAX_PROMPT_BYTES, "a UTF-8 text file holding the prompt")
        where, fix = f"prompt_file {Path(source).expanduser()}", "write the prompt in it"
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise MlxinferError(f"{where} is empty; {fix}", *param)
    return text
