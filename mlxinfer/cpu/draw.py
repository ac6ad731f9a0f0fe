"""Seeded draws for a batch of rows on the CPU, in one call: native/draw_rows.c.

Each row of a seeded experiment draws with its own key, so MLX needs one
`mx.random.categorical` call per row per step, and on Linux each is slow for a large
vocabulary (its exp runs one element at a time; docs/performance.md, "Batched draws").
draw_rows.c computes the same token for all rows in one vectorised pass, with MLX's own exp and
MLX 0.32's inverse-CDF arithmetic. It is used only where it is known to agree:

* Linux on x86_64 (where MLX's CPU exp is the scalar code the C file copies), MLX's default
  device a CPU, every row of the batch seeded, 8 rows or more (sampler.BATCH_DRAW_ROWS; the server's
  engine, which reads each step's tokens on the host anyway: 1 or more), the
  library built (at first use, or `python -m mlxinfer.cpu.draw`);
* the library from this version's source (an ABI number) and, if built with AVX2/FMA, a CPU that has them;
* and, once per process, `verify()` finds its exp equal to mx.exp (bit for bit, rounding edges
  included) and its tokens equal to mx.random.categorical's for rows of random scores (float32,
  bfloat16, cut tails, an odd vocabulary).

Anywhere else the sampler calls mx.random.categorical row by row, as before: same tokens, slower.
`status()` says which and why (`mlxinfer info`).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import platform
import sys

import mlx.core as mx
import numpy as np

from .. import keychain
from . import build as native_build

LIB_NAME = "libmlxinfer_draw.so"
SOURCE = os.path.join(native_build.NATIVE, "draw_rows.c")
# no contraction into fused multiply-adds the source does not ask for, no fast-math;
# -fno-trapping-math only lets the compiler vectorise the selects (results unchanged)
FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]

_lib = None
_state: dict = {"checked": False, "active": False, "path": None, "reason": "not checked yet"}


def library_path() -> str:
    return native_build.library_path(LIB_NAME)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build(out: str | None = None, compiler: str | None = None) -> str:
    """Compile draw_rows.c into <prefix>/lib; returns its path. Raises MlxinferError (one line)."""
    cc = native_build.compiler("the draw kernel", compiler)
    isa = ["-mavx2", "-mfma"] if {"avx2", "fma"} <= _cpu_flags() else []  # this machine's vectors
    return native_build.compile_library(SOURCE, out or library_path(), "the draw kernel", [*FLAGS, *isa, "-lm"], cc)


ABI = 1  # mlxinfer_draw_abi() of a library built from this version's draw_rows.c


def _load(path: str):
    """The library, or MlxinferError (one line) if it is from another version or needs a CPU this is not."""
    from ..errors import MlxinferError

    lib = ctypes.CDLL(path)
    try:
        abi, needs_avx2 = lib.mlxinfer_draw_abi(), lib.mlxinfer_draw_needs_avx2()
    except AttributeError:
        abi, needs_avx2 = None, None
    if abi != ABI:
        raise MlxinferError(f"{path} is from another version of mlxinfer; rebuild it: python -m mlxinfer.cpu.draw")
    if needs_avx2 and not {"avx2", "fma"} <= _cpu_flags():
        raise MlxinferError(
            f"{path} was built for a CPU with AVX2 and FMA; rebuild it here: python -m mlxinfer.cpu.draw"
        )
    f32, i32, i64 = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32), ctypes.c_int64
    lib.mlxinfer_draw_rows.argtypes = [f32, i64, i64, f32, f32, i32]
    lib.mlxinfer_draw_rows.restype = None
    lib.mlxinfer_exp.argtypes = [f32, f32, i64]
    lib.mlxinfer_exp.restype = None
    return lib


def _f32(a: np.ndarray):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def exp(x: np.ndarray, lib=None) -> np.ndarray:
    """MLX's CPU exp, float32 in and out (the kernel's own, for the tests)."""
    lib = lib or _lib
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    lib.mlxinfer_exp(_f32(x), _f32(out), x.size)
    return out


# Rows per half when a batch's draws are split over two threads (each row's draw is its own: the
# split never changes a token). A 32-row step of a 49k vocabulary draws in ~4 ms on one core.
SPLIT_ROWS = 8
_helper: concurrent.futures.ThreadPoolExecutor | None = None


def draw_rows(scaled: np.ndarray, uniforms: np.ndarray, lib=None) -> np.ndarray:
    """(A,) int32 tokens: row i as mx.random.categorical(scaled[i:i+1]) draws with the key whose
    uniform is uniforms[i]. `scaled`: (A, V) float32 scores already divided by the temperature.
    From 2 * SPLIT_ROWS rows on, where the process may use two cores, the second half of the rows
    is drawn on a helper thread beside the first (ctypes lets go of the GIL during the call)."""
    global _helper
    lib = lib or _lib
    x = np.ascontiguousarray(scaled, np.float32)
    u = np.ascontiguousarray(uniforms, np.float32)
    rows, vocab = x.shape
    scratch = np.empty_like(x)
    out = np.empty(rows, np.int32)

    def span(a: int, b: int) -> None:
        tokens = out[a:b].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        lib.mlxinfer_draw_rows(_f32(x[a:b]), b - a, vocab, _f32(u[a:b]), _f32(scratch[a:b]), tokens)

    if rows < 2 * SPLIT_ROWS or _cores() < 2:
        span(0, rows)
        return out
    if _helper is None:
        _helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlxinfer-draw")
    half = rows // 2
    second = _helper.submit(span, half, rows)
    span(0, half)
    second.result()
    return out


def _forget_helper() -> None:  # a forked child has none of the parent's threads: it makes its own
    global _helper
    _helper = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helper)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def verify(lib) -> str | None:
    """None if the kernel computes what MLX computes here, else what differed: its exp against
    mx.exp (random inputs and the rounding edges of exp's integer part), and its tokens against
    mx.random.categorical for rows of random scores (float32, cut tails, bfloat16, tempered)."""
    x = np.concatenate(
        [
            np.random.default_rng(0).uniform(-90.0, 0.0, 1 << 18),
            (np.arange(-127, 1) + 0.5) / 1.442695,  # where x * log2(e) lands on k + 1/2
        ]
    ).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(-np.inf)), np.nextafter(x, np.float32(np.inf))])
    want_exp = np.array(mx.exp(mx.array(x)))
    if not np.array_equal(exp(x, lib).view(np.uint32), want_exp.view(np.uint32)):
        return f"its exp differs from mx.exp's in MLX {mx.__version__}"
    vocab, rows = 4099, 12
    scores = mx.random.normal((rows, vocab), key=mx.random.key(20261201)) * 4.0  # (A, V)
    batches = [
        scores[:4],
        mx.where(scores[4:8] < 6.0, -mx.inf, scores[4:8]),  # cut tails: ~7% of the tokens kept
        scores[8:].astype(mx.bfloat16) * (1.0 / 0.7),  # the as-stored path's dtype, tempered
    ]
    _, subkeys = keychain.split(np.stack([np.array(mx.random.key(s)) for s in range(rows)]))
    start = 0
    for batch in batches:
        keys = subkeys[start : start + batch.shape[0]]
        start += batch.shape[0]
        want = [mx.random.categorical(batch[i : i + 1], key=mx.array(k)).item() for i, k in enumerate(keys)]
        got = draw_rows(np.asarray(batch.astype(mx.float32)), keychain.uniform(keys), lib).tolist()
        if got != want:
            return f"its tokens differ from mx.random.categorical's in MLX {mx.__version__} ({got} vs {want})"
    return None


def _check() -> None:
    global _lib
    _lib = None
    _state.update(checked=True, active=False, path=None)
    path = library_path()
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        _state["reason"] = (
            f"built for Linux on x86_64 (MLX's scalar CPU exp); this is {sys.platform} {platform.machine()}"
        )
        return
    from ..errors import MlxinferError

    if not os.path.isfile(path):  # first use: build it (once, with the system C compiler)
        try:
            build()
        except MlxinferError as e:
            _state["reason"] = f"{LIB_NAME} could not be built ({e}): one MLX call per row instead"
            print(f"warning: {_state['reason']}", file=sys.stderr)
            return

    try:
        lib = _load(path)
    except MlxinferError as e:
        _state["reason"] = str(e)
        return
    except OSError as e:
        _state["reason"] = f"cannot load {path} ({e}); rebuild it: python -m mlxinfer.cpu.draw"
        return
    try:
        with mx.stream(mx.cpu):
            problem = verify(lib)
    except Exception as e:  # never let the speed-up stop a run: the row-by-row draw is always there
        problem = f"its check failed ({type(e).__name__}: {e})"
    if problem:
        _state["reason"] = problem
        return
    _lib = lib
    _state.update(active=True, path=path, reason=f"agreed with MLX {mx.__version__}'s exp and categorical at first use")


def available() -> bool:
    """Whether draws on this process's default device can go through the kernel."""
    if not _state["checked"]:
        _check()
    return _state["active"] and mx.default_device().type == mx.DeviceType.cpu


def status() -> dict:
    """active, path, reason: what the sampler's batched draw uses here, and why."""
    if not _state["checked"]:
        _check()
    return {k: _state[k] for k in ("active", "path", "reason")}


def main() -> int:
    def built(path: str) -> str:
        _check()
        return f"built {path}: {'in use' if _state['active'] else 'not used: ' + _state['reason']}"

    return native_build.main(build, built)


if __name__ == "__main__":
    sys.exit(main())
