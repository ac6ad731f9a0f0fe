"""Seeded draws for a batch of rows on the CPU, in one call: native/draw_rows.c.

Each row of a seeded experiment draws with its own key, so MLX needs one
`mx.random.categorical` call per row per step, and on Linux each costs ~1.3 ms for a 49k
vocabulary (its exp runs one element at a time): 85 ms of a 64-row step whose forward pass
takes ~250 ms. draw_rows.c computes the same token for all rows in one vectorised pass (~11 ms
for 64 rows), with MLX's own exp and MLX 0.32's inverse-CDF arithmetic. It is used only where it
is known to agree:

* Linux on x86_64 (where MLX's CPU exp is the scalar code the C file copies), MLX's default
  device a CPU, the library built (`python -m mlxinfer.cpu.draw`; the Makefile's set-up runs it);
* and, once per process, `verify()` draws rows of random scores (float32 and bfloat16, cut tails,
  an odd vocabulary) both ways and finds every token equal to mx.random.categorical's.

Anywhere else the sampler calls mx.random.categorical row by row, as before: same tokens, slower.
`status()` says which and why (`mlxinfer info`).
"""

from __future__ import annotations

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


def _load(path: str):
    lib = ctypes.CDLL(path)
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


def draw_rows(scaled: np.ndarray, uniforms: np.ndarray, lib=None) -> np.ndarray:
    """(A,) int32 tokens: row i as mx.random.categorical(scaled[i:i+1]) draws with the key whose
    uniform is uniforms[i]. `scaled`: (A, V) float32 scores already divided by the temperature."""
    lib = lib or _lib
    x = np.ascontiguousarray(scaled, np.float32)
    u = np.ascontiguousarray(uniforms, np.float32)
    rows, vocab = x.shape
    scratch = np.empty_like(x)
    out = np.empty(rows, np.int32)
    lib.mlxinfer_draw_rows(
        _f32(x), rows, vocab, _f32(u), _f32(scratch), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    )
    return out


def verify(lib) -> str | None:
    """None if the kernel draws what mx.random.categorical draws here, else what differed."""
    vocab, rows = 4099, 12
    scores = mx.random.normal((rows, vocab), key=mx.random.key(20261201)) * 4.0  # (A, V)
    scores = mx.concatenate(
        [
            scores[:4],
            mx.where(scores[4:8] < 3.0, -mx.inf, scores[4:8]),  # cut tails: -inf everywhere but a few
            scores[8:].astype(mx.bfloat16) * (1.0 / 0.7),  # the as-stored path's dtype, tempered
        ]
    )
    _, subkeys = keychain.split(np.stack([np.array(mx.random.key(s)) for s in range(rows)]))
    want = [mx.random.categorical(scores[i : i + 1], key=mx.array(subkeys[i])).item() for i in range(rows)]
    got = draw_rows(np.asarray(scores.astype(mx.float32)), keychain.uniform(subkeys), lib).tolist()
    if got != want:
        return f"its tokens differ from mx.random.categorical's in MLX {mx.__version__} ({got} vs {want})"
    return None


def _check() -> None:
    global _lib
    _state["checked"] = True
    path = library_path()
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        _state["reason"] = (
            f"built for Linux on x86_64 (MLX's scalar CPU exp); this is {sys.platform} {platform.machine()}"
        )
        return
    if not os.path.isfile(path):
        _state["reason"] = f"{LIB_NAME} is not built (python -m mlxinfer.cpu.draw)"
        return
    try:
        lib = _load(path)
    except (OSError, AttributeError) as e:
        _state["reason"] = f"cannot load {path} ({e}); rebuild it: python -m mlxinfer.cpu.draw"
        return
    with mx.stream(mx.cpu):
        problem = verify(lib)
    if problem:
        _state["reason"] = problem
        return
    _lib = lib
    _state.update(active=True, path=path, reason="checked against mx.random.categorical at first use")


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
    from ..errors import MlxinferError

    try:
        path = build()
    except MlxinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _check()
    print(f"built {path}: {'in use' if _state['active'] else 'not used: ' + _state['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
