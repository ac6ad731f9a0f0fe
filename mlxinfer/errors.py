"""The one exception type for problems a user can fix.

The library's messages name its Python parameters (`max_tokens must be at least 1, got 0`)
and say which ones in `params`; the CLI swaps those names for its flags in one place
(cli/flags.py) and prints one line on stderr with exit code 2. Any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

import math

import errno


class MlxinferError(Exception):
    """A problem with the user's input: the message names it and the fix.

    params: the parameter names the message mentions, in the words of the message, so
    that a front end can name its own options instead.
    """

    exit_code = 2  # the CLI's: the input is at fault

    def __init__(self, message: str, *params: str):
        super().__init__(message)
        self.params = params
        self.detail: list[str] = []  # more lines for whoever asks (the CLI's --debug)


class OutputError(MlxinferError):
    """The place an output goes could not take it (a full disk, a file-size limit, an I/O error): not the
    input's fault, so the CLI's exit code is 1, as for a stdout that cannot be written."""

    exit_code = 1
    ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})

    @classmethod
    def of(cls, e: OSError) -> type[MlxinferError]:
        """OutputError where the OSError says the place is full or failing, else MlxinferError."""
        return cls if e.errno in cls.ERRNOS else MlxinferError


def is_whole(v) -> bool:
    """An int that is not a bool (True is an int to Python, and would pass as 1)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A finite int or float that is not a bool (an int past float's range is not: nothing could use it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def is_utf8(text: str) -> bool:
    """Text UTF-8 can carry: not a lone surrogate (bytes that were not UTF-8, kept by surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value, kind: type | None = None) -> str:
    """repr(value) for a message: a huge int by its size (Python will not print one of over 4,300 digits); where
    a number (`kind` int or float) belongs, text said to be the problem, and where an int belongs, a float (was:
    "k must be between 1 and 49,152, got 2.5", "temperature must be >= 0, got '1.0'")."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 128:
        return f"an int of about {int(abs(value).bit_length() * 0.30103) + 1:,} digits"
    if kind in (int, float) and isinstance(value, str):
        return f"{value!r:.60} (text: pass a number)"
    if kind is int and isinstance(value, float):
        return f"{value!r} (a float: pass an int{f', {int(value)}' if value.is_integer() else ''})"
    return repr(value)


def check_whole(value, name: str, least: int, what: str) -> None:
    """`value` is a whole number >= least, else a one-line error naming `name` ("must be {what}")."""
    if not is_whole(value) or value < least:
        raise MlxinferError(f"{name} must be {what}, got {shown(value, int)}", name)


def check_listed_once(values, name: str) -> None:
    """A list of numbers with no value twice (1 and 1.0 are one value): a second column, cell or run
    equal to the first is refused rather than computed twice."""
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise MlxinferError(f"{name} lists {twice:g} more than once; list each value once", name)


def check_bool(value, param: str) -> bool:
    """A switch is True or False: `chat="no"` or `exact=0` would otherwise pass `if value:` as the
    opposite of, or more than, what was meant."""
    if not isinstance(value, bool):
        raise MlxinferError(f"{param} must be True or False, got {value!r:.60}", param)
    return value


def first_line(e: Exception) -> str:
    """An exception's first line (its type's name where it has no text), at most 200 characters: what a
    one-line error quotes of a library's message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
