"""Keep the CPU back end's large buffers in the process (glibc on Linux).

MLX's CPU allocator takes every array from malloc and gives it back on free. glibc serves a block
over its mmap threshold (128 KiB, raised only by the frees it sees) with a fresh mmap and returns it
with munmap, so a (32, 49152) float32 row block (6 MiB) costs ~1,500 page faults each time it is
made: the sampler's cut over 32 rows took 92 ms as one graph against 34 ms with the blocks kept.
A fixed threshold of 32 MiB (glibc's largest) and trimming only above 512 MiB keep freed blocks
for the next array; a process holds its peak instead of returning it between steps.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "MLXINFER_HEAP"  # "off" leaves glibc's defaults
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20

_state: dict = {}


def keep_large_buffers() -> dict:
    """Set glibc's thresholds once per process (idempotent, never raises); what was done, as data."""
    if not _state:
        _state.update(_apply())
    return dict(_state)


def state() -> dict:
    """What keep_large_buffers did in this process, without doing it."""
    return dict(_state) or {"applied": False, "reason": "not yet: set when a model loads on the CPU"}


def _apply() -> dict:
    if sys.platform != "linux":
        return {"applied": False, "reason": f"not Linux ({sys.platform}): the allocator is left as is"}
    if os.environ.get(ENV, "").strip().lower() in {"0", "off", "false", "no"}:
        return {"applied": False, "reason": f"disabled by {ENV}"}
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return {"applied": False, "reason": "malloc tunables set in the environment are kept"}
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has no mallopt thresholds)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError) as e:
        return {"applied": False, "reason": f"not glibc ({e})"}
    return {"applied": ok, "reason": "mallopt" if ok else "mallopt refused the thresholds"}
