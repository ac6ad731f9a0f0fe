"""A command run at a pseudo-terminal (stdlib pty), as a person at a terminal would run it: its stdin is a
tty, so readline edits the lines, and Ctrl-C (byte 0x03) reaches it as SIGINT through the line discipline."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")  # colours, bracketed-paste switches, keypad modes


class Terminal:
    def __init__(self, *args: str, cwd: str, env: dict | None = None):
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            try:
                os.chdir(cwd)
                os.execve(sys.executable, [sys.executable, "-m", "mlxinfer", *args], {**os.environ, **(env or {})})
            finally:
                os._exit(127)
        self.pid, self.fd, self.seen = pid, fd, b""
        self.status: int | None = None

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
        """Read until `pattern` (a regex, on the output with escape sequences removed and \\r\\n as \\n)
        matches; return the match and keep only what follows it."""
        rx, deadline = re.compile(pattern.encode(), re.S), time.monotonic() + timeout
        while True:
            text = ANSI.sub(b"", self.seen).replace(b"\r\n", b"\n")
            m = rx.search(text)
            if m:
                self.seen = text[m.end() :]
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"never saw {pattern!r}; the terminal shows: {text[-2000:]!r}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the child closed the terminal
            return False
        self.seen += chunk
        return bool(chunk)

    def send(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def wait(self, timeout: float = 60) -> int:
        """The exit code once it has ended (its output read on the way, so it never blocks writing)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            self._read(0.1)
        raise AssertionError(f"still running after {timeout} s; the terminal shows: {self.seen[-2000:]!r}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
