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


def read_text_file(
    path: str | os.PathLike, param: str, limit: int, what: str = "a UTF-8 text file", pipes: bool = False
) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; else one MlxinferError naming `param`,
    the path and what it is instead. pipes: a pipe is read too, up to the limit (a file the user names:
    `--prompt-file <(...)` or /dev/stdin, as llama.cpp's -f reads them; never a model's, which would wait
    for ever on a pipe nothing writes)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():  # '' would be the folder '.'
        raise MlxinferError(f"{param} must be a file's name, got {path!r:.60}; pass {what}", param)
    path = Path(path).expanduser()
    readable = stat.S_ISREG, *((stat.S_ISFIFO,) if pipes else ())
    piped = pipes and not path.is_file() and path.exists() and stat.S_ISFIFO(path.stat().st_mode)
    if piped and os.environ.get("MLX_RANK") is not None:  # every rank of mlx.launch would open it: one reads it
        raise MlxinferError(
            f"{param} {path} is a pipe, which the ranks of mlx.launch cannot each read; write it to a file", param
        )
    if not path.is_file() and not piped:
        raise MlxinferError(f"{param} {path} {what_it_is(path)}; pass {what}", param)
    try:
        with open(path, "rb") as f:
            if not any(kind(os.fstat(f.fileno()).st_mode) for kind in readable):  # replaced since the check
                raise MlxinferError(
                    f"{param} {path} is not a regular file{' or a pipe' if pipes else ''}; pass {what}", param
                )
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
MAX_CONFIG_BYTES = 4 << 20  # config.json, generation_config.json: a few KB in practice; parsed JSON costs ~60x
MAX_TOKENIZER_BYTES = 256 << 20  # a tokenizer file (the largest in use, Gemma's tokenizer.json, is ~35 MB)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")  # fmt: skip


def check_side_files(directory: Path, names=TOKENIZER_FILES, limit: int = MAX_TOKENIZER_BYTES) -> None:
    """Files another library will read whole (transformers' tokenizer files): each present one is a
    regular file of at most `limit` bytes, so a link to /dev/zero or a pipe cannot fill the memory or hang."""
    for name in names:
        path = directory / name
        if not (path.exists() or path.is_symlink()):
            continue
        if not path.is_file():
            raise MlxinferError(f"{path} {what_it_is(path)}; put the model's {name} there")
        if path.stat().st_size > limit:
            raise MlxinferError(f"{path} is over {limit:,} bytes, more than any {name} in use; re-download it")


def read_json_file(path: Path, what: str, limit: int = MAX_CONFIG_BYTES):
    """A model's JSON side file (config.json, generation_config.json, an index), read within `limit` bytes."""
    import json

    text = read_text_file(path, what, limit, f"the model's {path.name}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise MlxinferError(f"{path} is not valid JSON ({e.__class__.__name__}: {e}); fix or re-download it") from None


def read_line(stream) -> str:
    """One line of a text stream (a conversation piped in), its line break dropped, within MAX_PROMPT_BYTES
    characters (was: a line without end read whole, gigabytes from /dev/zero); EOFError at its end."""
    line = stream.readline(MAX_PROMPT_BYTES + 2)  # the bound, and its line break
    if not line:
        raise EOFError
    text = line.removesuffix("\n")
    if len(text) > MAX_PROMPT_BYTES:
        raise MlxinferError(f"a line of standard input is over {MAX_PROMPT_BYTES:,} characters; send shorter messages")
    return text


def read_stdin(limit: int, where: str, shorter: str, param: tuple = (), stdin=None) -> str:
    """Standard input whole (`stdin`: a binary stream, default sys.stdin's): UTF-8 text of at most `limit`
    bytes; `where` names it in an error, `shorter` is the fix for one over the limit."""
    data = (stdin if stdin is not None else sys.stdin.buffer).read(limit + 1)
    if len(data) > limit:
        raise MlxinferError(f"{where} is over {limit:,} bytes; {shorter}", *param)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MlxinferError(f"{where} is not UTF-8 text; pipe UTF-8 text in", *param) from None


def read_prompt(source: str | os.PathLike, stdin=None) -> str:
    """A prompt from a file, or from standard input for '-' (`stdin`: a binary stream, default
    sys.stdin's): UTF-8 text of at most MAX_PROMPT_BYTES, not empty, its one final line break
    dropped (what `echo TEXT |` and most editors add)."""
    if str(source) == "-":
        where, param = "standard input (-p -)", ()
        text = read_stdin(MAX_PROMPT_BYTES, where, "pass a shorter prompt", param, stdin)
        fix = "pipe the text in: echo TEXT | mlxinfer ... -p -"
    else:
        param = ("prompt_file",)
        text = read_text_file(source, param[0], MAX_PROMPT_BYTES, "a UTF-8 text file holding the prompt", pipes=True)
        where, fix = f"prompt_file {Path(source).expanduser()}", "write the prompt in it"
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise MlxinferError(f"{where} is empty; {fix}", *param)
    return text


def read_messages(path: str | os.PathLike) -> list[dict]:
    """A conversation from a JSON file, as the next reply's prompt: a list of chat messages (OpenAI's shape,
    [{"role": "user", "content": "..."}, ...]) or a file chat's /save wrote (its "messages", its "system"
    first). The last message must not be the assistant's: the reply read from it is the next assistant turn.
    Each message is checked where it is encoded (tokenizer.encode_prompt)."""
    import json

    what = "a JSON file of chat messages, or a file chat's /save wrote"
    text = read_text_file(path, "messages", MAX_PROMPT_BYTES, what, pipes=True)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise MlxinferError(f"messages {path} is not valid JSON ({e}); pass {what}", "messages") from None
    saved = isinstance(data, dict) and isinstance(data.get("messages"), list)
    messages = data["messages"] if saved else data
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise MlxinferError(f"messages {path} holds no list of messages (role and content objects); pass {what}",
                            "messages")  # fmt: skip
    if saved and isinstance(data.get("system"), str) and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": data["system"]}, *messages]
    if messages[-1].get("role") == "assistant":
        raise MlxinferError(
            f"messages {path} ends with the assistant's reply, and the prompt opens the assistant's next turn: drop "
            "that reply (to write it again, with its seed) or add the next user message",
            "messages",
        )
    return messages
