"""Run `python -m mlxinfer ARGS` held still at a known point, for the tests that signal a running write.

    python tests/stop_point.py FD rename TARGET -- ARGS...   hold just before TARGET is renamed into place
    python tests/stop_point.py FD synced TARGET N -- ARGS... hold just after the N-th synced write to TARGET

At the point it writes one byte to file descriptor FD (a pipe the test holds) and waits there, so the
test's signal arrives at that point and no other: never before the write began, never after it ended.
If no signal comes within HOLD_S seconds it exits 99, which no test expects.

The points are the standard library's, not mlxinfer's internals: `os.rename` (or `os.replace`) of the finished
directory onto OUT (quantize, convert: the last instant a partial exists), and `os.fsync` of the
results file (sweep: each batch's lines are one write, synced; the header is the first).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

HOLD_S = 120


def main(argv: list[str]) -> None:
    split = argv.index("--")
    head, args = argv[:split], argv[split + 1 :]
    fd, kind, target = int(head[0]), head[1], os.path.abspath(head[2])
    # Ctrl-C as at a terminal, even where this was started with SIGINT ignored (a shell's background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wanted = int(head[3]) if kind == "synced" else 1

    def hold() -> None:
        os.write(fd, b"!")
        os.close(fd)
        time.sleep(HOLD_S)  # a signal's handler raises here, inside the write
        sys.stderr.write(f"stop_point: no signal within {HOLD_S} s\n")
        os._exit(99)

    if kind == "rename":  # os.rename or os.replace, whichever the writer uses

        def held_before(real):
            def move(src, dst, *rest, **kwargs):
                if os.path.abspath(dst) == target:
                    hold()
                return real(src, dst, *rest, **kwargs)

            return move

        os.rename, os.replace = held_before(os.rename), held_before(os.replace)
    elif kind == "synced":
        real_fsync, seen = os.fsync, [0]

        def fsync(f):
            real_fsync(f)
            try:
                mine, theirs = os.fstat(f), os.stat(target)
            except OSError:
                return
            if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
                seen[0] += 1
                if seen[0] == wanted:
                    hold()

        os.fsync = fsync
    else:
        raise SystemExit(f"stop_point: unknown point {kind!r}")
    sys.argv = ["mlxinfer", *args]
    runpy.run_module("mlxinfer", run_name="__main__")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mlxinfer
    main(sys.argv[1:])
