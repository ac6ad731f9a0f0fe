"""Writes that are complete or absent, even when the process is stopped.

A file or directory is written under a temporary name next to its final one, then renamed into
place. The temporary name carries the writer's process id (`.OUT.partial-<pid>-<random>`), so that:

- while `cleanup_on_signals()` is active, SIGTERM and SIGHUP unwind the stack like Ctrl-C does
  (their default is to end the process on the spot, skipping every `finally`), and the writer's
  own cleanup removes the partial;
- a partial that survives anyway (SIGKILL, a power cut) is removed by the next writer of the same
  name once it is stale: its process is gone, or the id now belongs to a process started after
  the partial was made.

`staged_dir` and `staged_file` are the whole pattern: make the partial, let the caller fill it, rename
it into place, remove it on any failure. No mlx here: the native builds use it too.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

KINDS = ("partial", "old")
_PID = re.compile(r"-(\d+)-")


def prefix(final: Path, kind: str = "partial") -> str:
    """The temporary-name prefix for `final` (pass it to tempfile.mkdtemp/mkstemp with dir=final.parent)."""
    return f".{Path(final).name}.{kind}-{os.getpid()}-"


@contextmanager
def staged_dir(final: Path, mode: int | None = None, replace: bool = False) -> Iterator[Path]:
    """A new empty directory beside `final` (its parents made, earlier writers' stale partials removed) for
    the block to fill; when the block ends it takes `mode` (default: a new directory's under the umask) and
    is renamed onto `final`. With `replace`, a `final` that exists is set aside first, put back if the
    rename fails, and removed after it. On any error, SIGTERM and SIGHUP included, the partial is removed
    and the error propagates: an OSError as it came, for the caller to word."""
    final = Path(final)
    with cleanup_on_signals():
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(final)
        tmp = Path(tempfile.mkdtemp(prefix=prefix(final), dir=final.parent))
        try:
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask() if mode is None else mode)  # mkdtemp's 0700 is for secrets
            if replace and final.exists():
                _swap_in(tmp, final)
            else:
                os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, final: Path) -> None:
    old = Path(tempfile.mkdtemp(prefix=prefix(final, "old"), dir=final.parent))
    os.rename(final, old / "x")
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old / "x", final)
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_file(final: Path, mode: int | None = None, suffix: str = "") -> Iterator[Path]:
    """`staged_dir` for one file: a new empty file beside `final` (whose folder must exist) for the block to
    write; then it takes `mode` (default: a new file's under the umask) and replaces `final`. A `final` that
    is a symbolic link is written through: the file it names is replaced, the link stays. One that is not a
    regular file (a device, a pipe, a socket) is an OSError (EINVAL) before anything is written: a rename
    would replace it, and as root that replaces /dev/null."""
    final = Path(final)
    if final.is_symlink():
        final = Path(os.path.realpath(final))
    if final.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a directory; give a file name", str(final))
    if final.exists() and not final.is_file():
        raise OSError(errno.EINVAL, "it is a device, a pipe or a socket, not a regular file", str(final))
    with cleanup_on_signals():
        remove_stale(final)
        fd, name = tempfile.mkstemp(prefix=prefix(final), suffix=suffix, dir=final.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)  # mkstemp's 0600 is for secrets
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def remove_stale(final: Path) -> list[Path]:
    """Remove the leftovers of earlier writers of `final` whose process is gone; returns what was removed."""
    final = Path(final)
    removed = []
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        for kind in KINDS:
            head = f".{final.name}.{kind}"
            m = _PID.match(entry.name[len(head) :]) if entry.name.startswith(head) else None
            if m and _stale(entry, int(m.group(1))):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def _stale(entry: Path, pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):
        return False  # alive under another user (or not a pid we can ask about): leave it
    started = _process_start(pid)
    try:
        made = entry.lstat().st_mtime
    except OSError:
        return False
    return started is not None and started > made + 1.0  # the id was reused by a newer process


def _process_start(pid: int) -> float | None:
    """When `pid` started, in seconds since the epoch (Linux /proc), or None where that is unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return int(boot.split()[1]) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


class Terminated(SystemExit):
    """SIGTERM or SIGHUP while a write was in progress: cleaned up, then exit 128 + signal."""


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise Terminated (a SystemExit) so `finally` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(128 + signum)

    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
