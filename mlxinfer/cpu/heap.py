"""Keep the CPU back end's large buffers in the process (glibc on Linux).

MLX's CPU allocator takes every array from malloc and gives it back on free. glibc serves a block
over its mmap threshold (128 KiB, raised only by the frees it sees) with a fresh mmap and returns it
with munmap, so a (32, 49152) float32 row block (6 MiB) costs ~1,500 page faults each time it is
made: the sampler's cut over 32 rows took 92 ms as one graph against 34 ms with the blocks kept.
A fixed threshold of 32 MiB (glibc's largest) and trimming only above 512 MiB keep freed blocks
for the next array; a process holds its peak instead of returning it between steps.

A loaded model's weights are then moved onto 2 MiB pages (`huge_pages`: madvise MADV_HUGEPAGE and
MADV_COLLAPSE where transparent huge pages are "madvise" or "always"): a decode step reads every weight
once, ~100 MB for the embedded model, and on 4 KiB pages each new page is a TLB miss (under a VM, a
two-level page walk). Decode measured 1.04-1.06x faster with them (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "MLXINFER_HEAP"  # "off" leaves glibc's defaults
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # Linux's values (MADV_COLLAPSE since 6.1)
HUGE = 2 << 20
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20

_state: dict = {}
_huge: dict = {}  # what huge_pages did last


def keep_large_buffers() -> dict:
    """Set glibc's thresholds once per process (idempotent, never raises); what was done, as data."""
    if not _state:
        _state.update(_apply())
    return dict(_state)


def state() -> dict:
    """What keep_large_buffers and huge_pages did in this process, without doing either."""
    done = dict(_state) or {"applied": False, "reason": "not yet: set when a model loads on the CPU"}
    refused = _refusal() or _thp_refusal()
    later = {"applied": False, "reason": refused or "not yet: when a model loads on the CPU"}
    return {**done, "huge_pages": dict(_huge) or later}


def _refusal() -> str | None:
    if sys.platform != "linux":
        return f"not Linux ({sys.platform}): the allocator is left as is"
    if os.environ.get(ENV, "").strip().lower() in {"0", "off", "false", "no"}:
        return f"disabled by {ENV}"
    return None


def huge_pages(arrays) -> dict:
    """Put the memory under `arrays` (evaluated MLX arrays on the CPU) on 2 MiB pages; never raises.
    Every 2 MiB span an array touches is advised, so a span may hold a neighbour's bytes too: the
    same memory, on a larger page. What was done, as data (also in `state()`)."""
    refused = _refusal() or _thp_refusal()
    _huge.clear()
    if refused:
        _huge.update(applied=False, reason=refused)
        return dict(_huge)
    spans: set[int] = set()
    for a in arrays:
        start = _address(a)
        if start is not None and a.nbytes:
            spans.update(range(start // HUGE, (start + a.nbytes - 1) // HUGE + 1))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = sum(
        libc.madvise(s * HUGE, HUGE, MADV_HUGEPAGE) == 0 and libc.madvise(s * HUGE, HUGE, MADV_COLLAPSE) == 0
        for s in sorted(spans)
    )
    _huge.update(applied=collapsed > 0, spans=len(spans), collapsed=collapsed)
    return dict(_huge)


def _thp_refusal() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return "no transparent huge pages in this kernel"
    return "transparent huge pages are [never]" if "[never]" in mode else None


def _address(a) -> int | None:
    import mlx.core as mx
    import numpy as np

    try:
        view = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a  # PEP 3118 has no bfloat16
        return int(np.asarray(memoryview(view)).ctypes.data)
    except (TypeError, ValueError, BufferError, RuntimeError):
        return None


def _apply() -> dict:
    refused = _refusal()
    if refused:
        return {"applied": False, "reason": refused}
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return {"applied": False, "reason": "malloc tunables set in the environment are kept"}
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has no mallopt thresholds)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError) as e:
        return {"applied": False, "reason": f"not glibc ({e})"}
    return {"applied": ok, "reason": "mallopt" if ok else "mallopt refused the thresholds"}
