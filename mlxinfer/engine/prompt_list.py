"""sweep's prompts: a list of texts or token-id lists, or a file of one prompt a line (each numbered as an
editor numbers it, so that an error about one prompt names its line), each listed once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import MlxinferError
from ..formats.paths import read_stdin, read_text_file
from .schema import _one_line

MAX_PROMPTS_FILE_BYTES = 16 << 20
MAX_PROMPTS = 10_000  # each is prepared (encoded, checked against the context) before any draw


class PromptsFile(list):
    """prompts_from_file's prompts: a list of texts that also knows its file and each prompt's line
    number, so that sweep's error about one prompt names the line (`prompts_file p.txt line 3: ...`)."""

    def __init__(self, prompts: list[str], path: Path, lines: list[int]):
        super().__init__(prompts)
        self.path, self.lines = path, lines


def prompts_from_file(path: str | Path, stdin=None) -> PromptsFile:
    """One prompt per line (blank lines skipped), from a UTF-8 file (or a pipe; '-': standard input, `stdin`
    a binary stream, default sys.stdin's) of at most MAX_PROMPTS_FILE_BYTES bytes and MAX_PROMPTS prompts (a
    device such as /dev/zero never ends). A list of the texts (a PromptsFile: it knows each one's line
    number, counted as an editor does)."""
    if str(path) == "-":
        where = "standard input (--prompts -)"
        text = read_stdin(MAX_PROMPTS_FILE_BYTES, where, "split the prompts", ("prompts_file",), stdin)
        path = Path("-")
    else:
        text = read_text_file(
            path, "prompts_file", MAX_PROMPTS_FILE_BYTES, "a UTF-8 text file, one prompt per line", pipes=True
        )
        path = Path(path).expanduser()
    numbered = [  # the same prompts str.splitlines gives, numbered by the file's \n-ended lines
        (number, part.strip())
        for number, line in enumerate(text.split("\n"), start=1)
        for part in line.splitlines()
        if part.strip()
    ]
    prompts = [p for _, p in numbered]
    if not prompts:
        raise MlxinferError(f"prompts_file {path} holds no prompt; write one per line", "prompts_file")
    if len(prompts) > MAX_PROMPTS:
        raise MlxinferError(
            f"prompts_file {path} holds {len(prompts):,} prompts; at most {MAX_PROMPTS:,}: split it", "prompts_file"
        )
    return PromptsFile(prompts, path, [n for n, _ in numbered])


def check_prompts_once(prompts: list, lines, given) -> None:
    """No prompt twice: its cells would repeat the first's draws, and the file would hold their records twice."""
    seen: dict = {}
    for n, p in enumerate(prompts):
        key = p if isinstance(p, str) else tuple(p) if isinstance(p, (list, tuple)) else None
        if key is None or key not in seen:
            seen.setdefault(key, n)
            continue
        if lines is not None:
            first, again = lines[seen[key]], lines[n]
            raise MlxinferError(
                f"prompts_file {given.path} lines {first} and {again} hold the same prompt; list each prompt once",
                "prompts_file",
            )
        shown = _one_line(p, 43) if isinstance(p, str) else "the same token ids"
        raise MlxinferError(f"prompts lists {shown!r} more than once; list each prompt once", "prompts")


def prompt_list(prompts) -> list:
    """The prompts: a list of texts or of token-id lists (a text alone is one prompt)."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, Mapping)) or not isinstance(prompts, Iterable):
        raise MlxinferError(
            f"prompts must be a list of prompts (texts or token-id lists), got {prompts!r:.60}", "prompts"
        )
    out = list(prompts)
    if not out:
        raise MlxinferError("prompts is empty; give at least one prompt", "prompts")
    if all(isinstance(p, int) for p in out):
        raise MlxinferError("prompts is one prompt's token ids; pass a list of prompts: [ids]", "prompts")
    for p in out:
        if not isinstance(p, str) and not (isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p)):
            raise MlxinferError(
                f"each prompt is a text or a list of token ids (chat messages: use sample), got {p!r:.60}", "prompts"
            )
    return out
