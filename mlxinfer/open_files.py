"""The process's open-file limits kept through mlx-lm's import.

mlx-lm's utils module sets RLIMIT_NOFILE to (2,048, 4,096) when it is first imported ("for large
models with lots of files"). Where the limits were higher that lowers them, and a lowered hard limit
is one an unprivileged process can never raise again: a server then held ~2,000 connections, and a
notebook's process kept the lower limit for good; and where the hard limit was below 4,096 the import
failed ("not allowed to raise maximum limit"). While that one module runs, a limit it sets is never
below the one there was, nor above what the process may set (its raise of a low soft limit, macOS's
256, still applies where it can)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from contextlib import contextmanager

WATCHED = "mlx_lm.utils"


@contextmanager
def never_lowered():
    """resource.setrlimit for RLIMIT_NOFILE keeps each limit at least where it is, for the duration."""
    try:
        import resource
    except ImportError:  # not POSIX: no such limit
        yield
        return
    real, unlimited = resource.setrlimit, resource.RLIM_INFINITY

    def higher(a: int, b: int) -> int:
        return unlimited if unlimited in (a, b) else max(a, b)

    def setrlimit(kind, limits):
        if kind != resource.RLIMIT_NOFILE:
            return real(kind, limits)
        now_soft, now_hard = resource.getrlimit(kind)
        soft = higher(now_soft, limits[0])
        for hard in (higher(now_hard, limits[1]), now_hard):  # a hard limit only a privileged process may raise
            try:
                return real(kind, (soft if hard == unlimited or soft != unlimited and soft <= hard else hard, hard))
            except (ValueError, OSError):
                continue

    resource.setrlimit = setrlimit
    try:
        yield
    finally:
        resource.setrlimit = real


class _KeepLimits(importlib.abc.MetaPathFinder):
    """Finds mlx_lm.utils as the path finder does, and runs its module inside never_lowered()."""

    def find_spec(self, name, path, target=None):
        if name != WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            with never_lowered():
                run(module)

        spec.loader.exec_module = exec_module  # this spec's own loader object (one per module file)
        return spec


def keep_through_mlx_lm() -> None:
    """Installs the finder once, before anything imports mlx-lm (mlxinfer's __init__ does)."""
    if WATCHED not in sys.modules and not any(isinstance(f, _KeepLimits) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeepLimits())
