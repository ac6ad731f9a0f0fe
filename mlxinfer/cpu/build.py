"""Compile one of mlxinfer's small C files into a shared library, atomically.

Used by openblas_shim.py and draw.py. The library goes to <prefix>/lib (the virtualenv's),
complete or not at all: it is written to a temporary file beside the target and renamed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .. import atomic
from ..errors import MlxinferError

NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")


def library_path(name: str) -> str:
    return os.path.join(sys.prefix, "lib", name)


def compiler(what: str, given: str | None = None) -> str:
    cc = given or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise MlxinferError(f"no C compiler found to build {what}: install gcc, or set CC")
    return cc


def compile_library(source: str, out: str, what: str, flags: list[str], cc: str) -> str:
    """cc <flags> -shared -fPIC source -o out (+ flags after it, for -l); returns `out`. One-line errors."""
    with atomic.cleanup_on_signals():  # SIGTERM, like Ctrl-C, removes the temporary file
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            atomic.remove_stale(Path(out))
            fd, tmp = tempfile.mkstemp(prefix=atomic.prefix(Path(out)), suffix=".so", dir=os.path.dirname(out))
        except OSError as e:
            raise MlxinferError(f"cannot write {what} to {out} ({e.strerror or e})") from None
        os.close(fd)
        compile_flags = [f for f in flags if not f.startswith(("-l", "-L", "-Wl,"))]
        link_flags = [f for f in flags if f.startswith(("-l", "-L", "-Wl,"))]
        cmd = [cc, *compile_flags, "-shared", "-fPIC", source, "-o", tmp, *link_flags]
        try:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:  # CC names a program that is not there, or not executable
                raise MlxinferError(
                    f"cannot run {cc} to build {what} ({e.strerror or e}): install gcc, or set CC"
                ) from None
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["no message"])[0]
                raise MlxinferError(f"building {what} failed ({os.path.basename(cc)}: {first})")
            os.chmod(tmp, 0o755)  # mkstemp's 0600 (+x from the linker): every user of this Python must read it
            os.replace(tmp, out)  # complete or absent, never half-written
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return out


def main(build: Callable[[], str], built: Callable[[str], str]) -> int:
    """`python -m mlxinfer.cpu.<module>`: build, then one line saying what was built, or one error line (exit 2)."""
    try:
        path = build()
    except MlxinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(built(path))
    return 0
