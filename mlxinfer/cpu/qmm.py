"""MLX's affine-quantized matmul with float32 activations, batch-invariant: native/qmm/.

`quantized_matmul(x, w, scales, biases, group_size, bits)` computes what
`mx.quantized_matmul(x, w, scales, biases, transpose=True, ...)` computes for float32 `x`, as an
MLX primitive (a C++ extension, so it is lazy and composes with `mx.compile`), AVX2+FMA where the
CPU has them, over the cores this process may use. Each output's summation order depends only on
K, the group size and the bits, so a row computed alone has the same bits as inside a batch
(qmm.cpp says how). The compute path "quantized" (model/convert.py) runs every quantized Linear
through it.

The extension is built with CMake and nanobind (PyPI) against the installed mlx, at first use or
by `python -m mlxinfer.cpu.qmm`, into $MLXINFER_CACHE/qmm/<key> (default ~/.cache/mlxinfer/qmm),
where the key hashes the sources, the mlx and nanobind versions, the Python tag and the ISA: a
new mlx or a new source builds a new copy. The build is atomic (a temporary directory renamed into
place). If it cannot be built or loaded, or disagrees with mx.quantized_matmul at first use, one
warning line goes to stderr and callers keep the path they had (`status()` says why).
MLXINFER_QMM=off turns it off; MLXINFER_QMM_THREADS=N sets the thread count; MLXINFER_QMM_ISA=avx512,
avx2 or portable builds a narrower variant than the CPU allows, what another machine runs (avx2 has the
avx512 and avx512vnni builds' bits; the portable C++ path has its own fixed order for the float32
kernel, and the int8 path's bits everywhere). MLXINFER_QMM_WIDE=0/1 forces the several-row tiles' width
(native/qmm/wide.h: 512-bit or 256-bit tiles, the same bits; by default timed once on this CPU).
The same extension holds the int8 path (int8.cpp).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

from .. import atomic
from ..errors import MlxinferError
from . import build as native_build

SOURCE_DIR = Path(native_build.NATIVE) / "qmm"
SOURCES = ("CMakeLists.txt", "qmm.h", "qmm.cpp", "tiles.h", "tiles_wide.h", "primitive.cpp", "pool.h", "pool.cpp")
SOURCES += (
    "rows.h",
    "rows.cpp",
    "wide.h",
    "wide.cpp",
    "int8.h",
    "int8.cpp",
    "int8_tiles.h",
    "int8_wide.h",
    "simd.h",
    "scales.h",
    "attention.h",
    "attention.cpp",
    "attend_math.h",
    "attend_math.cpp",
    "bindings.cpp",
)
MODULE = "_mlxinfer_qmm"
ABI = 15  # QMM_ABI in qmm.h
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)

_module = None
_state: dict = {"checked": False, "active": False, "path": None, "reason": "not checked yet"}
_warned = False


ISAS = ("", "avx2", "avx512", "avx512vnni")  # each variant runs wherever the next one does


def _isa() -> str:
    """The variant to build: avx512vnni (avx512, and the int8 path's integer dot products as VNNI
    instructions), avx512 (AVX2 code that may use AVX-512VL's 32 vector registers: wider tiles, the same
    bits), avx2, or "" (portable C++). MLXINFER_QMM_ISA may ask for a narrower one."""
    from .draw import _cpu_flags

    flags = _cpu_flags() if platform.machine() in ("x86_64", "AMD64") else set()
    best = "" if not {"avx2", "fma", "f16c"} <= flags else "avx512" if {"avx512f", "avx512vl"} <= flags else "avx2"
    if best == "avx512" and "avx512_vnni" in flags:
        best = "avx512vnni"
    asked = os.environ.get("MLXINFER_QMM_ISA", "").strip().lower().replace("portable", "")
    if "MLXINFER_QMM_ISA" in os.environ and asked in ISAS and ISAS.index(asked) < ISAS.index(best):
        return asked
    return best


def _versions() -> dict:
    import mlx.core as mx

    try:
        import nanobind

        nb = nanobind.__version__
    except ImportError:
        nb = None
    return {"mlx": mx.__version__, "nanobind": nb, "python": sys.implementation.cache_tag, "isa": _isa()}


def cache_root() -> Path:
    base = os.environ.get("MLXINFER_CACHE")
    return Path(base) / "qmm" if base else Path.home() / ".cache" / "mlxinfer" / "qmm"


def build_dir() -> Path:
    """Where the build for these sources, this mlx, this nanobind and this Python lives."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((SOURCE_DIR / name).read_bytes())
    v = _versions()
    h.update(repr(sorted(v.items())).encode())
    tag = f"{v['python']}-mlx{v['mlx']}-{v['isa'] or 'portable'}"
    return cache_root() / f"{tag}-{h.hexdigest()[:12]}"


def _built_library(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"{MODULE}*.so")) + sorted(directory.glob(f"{MODULE}*.pyd"))
    return found[0] if found else None


def _cmake() -> str:
    venv = Path(sys.prefix) / "bin" / "cmake"  # the cmake wheel, beside this Python
    found = str(venv) if venv.exists() else shutil.which("cmake")
    if not found:
        raise MlxinferError("cmake is not installed; pip install cmake nanobind, then python -m mlxinfer.cpu.qmm")
    return found


def _tools() -> str:
    """The cmake to build with; MlxinferError (one line) if cmake or nanobind is missing."""
    if _versions()["nanobind"] is None:
        raise MlxinferError("nanobind is not installed; pip install cmake nanobind, then python -m mlxinfer.cpu.qmm")
    return _cmake()


def build() -> str:
    """Build the extension into its cache directory if it is not there; returns the library's path.
    Raises MlxinferError (one line) if it cannot be built."""
    final = build_dir()
    existing = _built_library(final) if final.is_dir() else None
    if existing:
        return str(existing)
    cmake = _tools()  # a missing tool is the one warning line, with no notice of a build before it
    print(
        f"mlxinfer: building the quantized matmul kernel (an MLX C++ extension, once per mlx version and CPU: "
        f"~15-120 s) into {final} ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        with atomic.staged_dir(final, mode=0o755) as tmp:  # 0755: every user of this Python must read it
            work = tmp / "build"
            configure = [cmake, "-S", str(SOURCE_DIR), "-B", str(work), f"-DPython_EXECUTABLE={sys.executable}"]
            configure += ["-DCMAKE_BUILD_TYPE=Release", f"-DMLXINFER_QMM_ISA={_isa()}"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            for cmd in (configure, [cmake, "--build", str(work), "-j", str(os.cpu_count() or 1)]):
                try:
                    done = native_build.run_tool(cmd)
                except OSError as e:
                    raise MlxinferError(f"cannot run {cmd[0]} to build the quantized matmul kernel ({e})") from None
                if done.returncode != 0:
                    lines = (done.stderr or done.stdout).strip().splitlines()
                    first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "no message")
                    raise MlxinferError(f"building the quantized matmul kernel failed ({first.strip()[:300]})")
            library = _built_library(work)
            if library is None:
                raise MlxinferError("building the quantized matmul kernel made no library; rebuild it")
            shutil.copy2(library, tmp / library.name)
            shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        if not (final.is_dir() and _built_library(final)):  # not another process's build landing first
            raise MlxinferError(f"cannot write the quantized matmul kernel to {final} ({e.strerror or e})") from None
    return str(_built_library(final))


def _import(path: str):
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify(module) -> str | None:
    """None if the module computes mx.quantized_matmul's result here (float32 rounding apart), a row
    alone equals the same row in a batch, bit for bit, and the int8 path equals its portable code; else
    what differed."""
    import mlx.core as mx

    key = mx.random.key(20261201)
    for bits, group_size in ((4, 32), (8, 64)):
        w = mx.random.normal((40, 256), key=key)
        x = mx.random.normal((5, 256), key=mx.random.split(key)[0])
        wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
        with mx.stream(mx.cpu):
            want = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group_size, bits=bits)
            got = module.quantized_matmul(x, wq, scales, biases, group_size, bits)
            alone = module.quantized_matmul(x[3:4], wq, scales, biases, group_size, bits)
            err = mx.max(mx.abs(got - want)).item()
            same = mx.array_equal(alone, got[3:4]).item()
        if not err < 1e-3:
            return f"its {bits}-bit result differs from mx.quantized_matmul's by {err:.2g}"
        if not same:
            return f"its {bits}-bit row alone differs from the same row in a batch"
        # the int8 path: its vector code gives its portable code's bits (int8.cpp)
        w8 = module.repack_int8(wq, group_size, bits)
        s8, b8 = (module.int8_lane_groups(a, 256, group_size) for a in (scales, biases))
        fast = module.quantized_matmul(x, w8, s8, b8, group_size, bits | module.int8_flag(), stream=mx.cpu)
        if not mx.array_equal(fast, module.qmm_int8(x, w8, s8, b8, group_size, bits, reference=True)).item():
            return f"its {bits}-bit int8 path differs from its portable code"
    return None


def _check(build_if_missing: bool = True) -> None:
    global _module
    _module = None
    _state.update(checked=True, active=False, path=None)
    if os.environ.get("MLXINFER_QMM", "").lower() in ("0", "off", "no", "false"):
        _state["reason"] = "turned off by MLXINFER_QMM"
        return
    try:
        final = build_dir()
        path = _built_library(final) if final.is_dir() else None
        if path is None and not build_if_missing:
            _state["reason"] = "not built yet (python -m mlxinfer.cpu.qmm; it is also built at first use)"
            return
        if path is None:
            path = build()
        module = _import(str(path))
        if getattr(module, "abi", lambda: None)() != ABI:
            raise MlxinferError(f"{path} is from another version of mlxinfer; delete {final.parent} to rebuild")
        problem = verify(module)
    except MlxinferError as e:
        problem = str(e)
    except Exception as e:  # never let the speed-up stop a run: MLX's own kernels are always there
        problem = f"cannot use {MODULE} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if problem:
        _state["reason"] = problem
        if build_if_missing:  # at first use: say once why the slower path runs (status() says it for `info`)
            warn_once(problem)
        return
    _module = module
    isa = "AVX2+FMA" if module.avx2() else "portable C++"
    if module.avx2() and module.tile() != "3x3":
        isa += f" with AVX-512VL's registers ({module.tile()} tiles{', and 512-bit tiles' if module.wide() else ''})"
    isa += f"; int8 dot products: {module.int8_isa()}"
    _state.update(
        active=True,
        path=str(path),
        reason=f"{isa}, {module.threads()} threads; agreed with mx.quantized_matmul at first use",
    )


def available(build_if_missing: bool = True) -> bool:
    """Whether the kernel can run here (builds it at the first call unless `build_if_missing=False`)."""
    if not _state["checked"] or (build_if_missing and not _state["active"] and "not built yet" in _state["reason"]):
        _check(build_if_missing)
    return _state["active"]


def status(build_if_missing: bool = False) -> dict:
    """active, path, reason: whether the quantized path's kernel is in use here, and why (`mlxinfer info`)."""
    available(build_if_missing)
    return {k: _state[k] for k in ("active", "path", "reason")}


def supports(group_size: int, bits: int, in_features: int, mode: str = "affine") -> bool:
    """Whether the kernel takes this layout (MLX's affine layout, 4/8 bits, groups of 32/64/128)."""
    return mode == "affine" and bits in BITS and group_size in GROUP_SIZES and in_features % group_size == 0


def warn_once(why: str) -> None:
    """One line on stderr, once per process: the quantized path falls back, and why."""
    global _warned
    if not _warned:
        _warned = True
        print(f"mlxinfer: warning: the quantized matmul kernel is not used ({why})", file=sys.stderr, flush=True)


def quantized_matmul(x, w, scales, biases, group_size: int, bits: int):
    """x @ dequantize(w, scales, biases).T in float32 (lazy, on the CPU stream), or None where the kernel
    is unavailable or does not take this layout (one warning line; the caller keeps its own path)."""
    if not available():
        warn_once(_state["reason"])
        return None
    if biases is None or not supports(group_size, bits, x.shape[-1]):
        warn_once(f"{bits}-bit groups of {group_size} without affine biases are not a layout it takes")
        return None
    import mlx.core as mx

    return _module.quantized_matmul(x, w, scales, biases, group_size, bits, stream=mx.cpu)


def kernel():
    """The loaded extension module (available() must be true), for callers that check once."""
    return _module if available() else None


def main() -> int:
    def built(path: str) -> str:
        _check(build_if_missing=False)
        return f"built {path}: {'in use' if _state['active'] else 'not used: ' + _state['reason']}"

    return native_build.main(build, built)


if __name__ == "__main__":
    sys.exit(main())
