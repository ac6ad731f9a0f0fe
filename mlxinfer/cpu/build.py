"""Compile one of mlxinfer's small C files into a shared library, atomically.

Used by openblas_shim.py and draw.py. The library goes to <prefix>/lib (the virtualenv's),
complete or not at all: it is written to a temporary file beside the target and renamed
(atomic.staged_file).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
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


def run_tool(cmd: list[str]) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in a process group of its own: when the caller
    is stopped (Ctrl-C, or SIGTERM under atomic.cleanup_on_signals), the whole group ends with it, not only
    cmd (subprocess.run kills cmd alone, and cmake's ninja and compilers went on as orphans)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as p:
        try:
            out, err = p.communicate()
        except BaseException:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def compile_library(source: str, out: str, what: str, flags: list[str], cc: str) -> str:
    """cc <flags> -shared -fPIC source -o out (+ flags after it, for -l); returns `out`. One-line errors."""
    compile_flags = [f for f in flags if not f.startswith(("-l", "-L", "-Wl,"))]
    link_flags = [f for f in flags if f.startswith(("-l", "-L", "-Wl,"))]
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        # 0755: every user of this Python must read it (mkstemp's 0600 plus the linker's +x was 0711)
        with atomic.staged_file(Path(out), mode=0o755, suffix=".so") as tmp:
            cmd = [cc, *compile_flags, "-shared", "-fPIC", source, "-o", str(tmp), *link_flags]
            try:
                done = run_tool(cmd)
            except OSError as e:  # CC names a program that is not there, or not executable
                raise MlxinferError(
                    f"cannot run {cc} to build {what} ({e.strerror or e}): install gcc, or set CC"
                ) from None
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["no message"])[0]
                raise MlxinferError(f"building {what} failed ({os.path.basename(cc)}: {first})")
    except OSError as e:
        raise MlxinferError(f"cannot write {what} to {out} ({e.strerror or e})") from None
    return out


def main(build: Callable[[], str], built: Callable[[str], str]) -> int:
    """`python -m mlxinfer.cpu.<module>`: build, then one line saying what was built, or one error line (exit 2)."""
    try:
        path = build()
    except MlxinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the partial build is gone (atomic.staged_dir): one line, the shell's 130
        print("interrupted: nothing was built", file=sys.stderr)
        return 130
    print(built(path))
    return 0
