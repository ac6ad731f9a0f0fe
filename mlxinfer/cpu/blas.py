"""Route MLX's float32 matmuls to a fast BLAS on Linux (Intel MKL by default).

The PyPI MLX CPU wheel for Linux links a reference (netlib) BLAS: a 1024^3 float32
matmul takes most of a second. MLX calls `cblas_sgemm` through the dynamic linker,
so a BLAS that is already loaded with RTLD_GLOBAL when `libmlx.so` is loaded wins
the symbol lookup and takes every float32 matmul (float16/bfloat16 and quantized
matmuls are MLX's own kernels and are unaffected). That only works if it happens
before `import mlx`; `import mlxinfer` therefore calls `preload()` first thing.

Which library:
  MLXINFER_BLAS=/path/to/libsomething.so  that library (MKL, OpenBLAS, ...)
  MLXINFER_BLAS=mkl                       the PyPI `mkl` package's libmkl_rt.so.*
  MLXINFER_BLAS=openblas                  OpenBLAS from the PyPI `scipy-openblas32` package,
                                          through mlxinfer's cblas_sgemm shim (openblas_shim.py)
  MLXINFER_BLAS=none (or off, 0, mlx)     MLX's own bundled BLAS, nothing loaded
  unset (or auto)                         whichever of the two is installed; if both are, MKL
                                          on Intel CPUs and OpenBLAS on others (MKL takes slower
                                          code paths on AMD CPUs)
  pip install 'mlxinfer[mkl]' or 'mlxinfer[openblas]' (the shim builds itself at first use).
For MKL, MKL_THREADING_LAYER defaults to SEQUENTIAL (one thread per call); a value
already in the environment is kept (GNU = libgomp threads, INTEL = libiomp5 from the
intel-openmp wheel). Why not threads: MLX runs its own thread beside MKL's, and OpenMP
threads that must be woken for every small matmul slow a loaded machine's prefill down.
OpenBLAS uses its own pthreads, one per core unless OPENBLAS_NUM_THREADS says otherwise.
After each call its idle threads spin for 2**OPENBLAS_THREAD_TIMEOUT cycles (default 2**28,
~0.1 s) before they sleep, so through a decode, where a matmul comes every fraction of a
millisecond, one core stays busy spinning while MLX's thread and Python's need it. We default
OPENBLAS_THREAD_TIMEOUT to 8 (sleep almost at once; a value already in the environment is kept).
What each choice measured: docs/performance.md, "BLAS choices" (bench/blas_matmul.py).

Failure is never fatal: a path that does not exist, is not a shared library or
lacks `cblas_sgemm` gives one warning line on stderr, nothing is loaded globally,
and MLX keeps its own BLAS. `status()` says what happened (`mlxinfer info`).

Cost at import: a directory listing or two, `import _ctypes` and one dlopen; no BLAS
call is made (MKL loads its kernels on the first matmul).
"""

from __future__ import annotations

import os
import sys

from . import openblas_shim
from .openblas_shim import SHIM_NAME

ENV = "MLXINFER_BLAS"
_DISABLED = {"none", "off", "0", "false", "no", "mlx", "bundled"}
_DEFAULT = {"", "auto"}
_BUNDLED = "MLX's bundled BLAS"
DEFAULT_MKL_THREADING_LAYER = "SEQUENTIAL"
DEFAULT_OPENBLAS_THREAD_TIMEOUT = "8"

_status: dict = {
    "library": None,
    "path": None,
    "active": False,
    "reason": "preload() has not run",
    "threading_layer": None,
    "source": None,
}
_handle = None  # the dlopen handle; the library stays loaded for the life of the process
_ran = False


def status() -> dict:
    """What `preload` did: library, path, active, reason, threading_layer, source (a copy)."""
    return dict(_status)


def preload() -> dict:
    """Load a fast BLAS globally before mlx is imported (Linux only); idempotent, never raises."""
    global _ran
    if _ran:
        return status()
    _ran = True
    try:
        _preload()
    except Exception as e:  # never let a BLAS problem stop the package from importing
        _fallback(f"BLAS preload failed ({type(e).__name__}: {e})", warn=True)
    return status()


def _preload() -> None:
    requested = os.environ.get(ENV)
    value = (requested or "").strip()
    if sys.platform != "linux":
        _set(
            library="MLX's own (Accelerate on macOS)" if sys.platform == "darwin" else "MLX's own",
            reason=f"not Linux ({sys.platform}): MLX's own BLAS is used as is",
        )
        return
    try:
        os.getcwd()
    except FileNotFoundError:  # oneMKL ends the process ("Cannot load libmkl_rt") when the directory is gone
        _fallback("the current directory no longer exists; no fast BLAS loaded", warn=False)
        return
    if "mlx.core" in sys.modules:
        explicit = bool(value) and value.lower() not in _DISABLED | _DEFAULT
        what = f"{ENV}={value} not loaded" if explicit else "no fast BLAS loaded"
        _fallback(f"mlx imported first; {what} (import mlxinfer before mlx)", warn=explicit)
        return
    if value.lower() in _DISABLED:
        _fallback(f"disabled by {ENV}={value}")
        return
    if value.lower() in _DEFAULT | {"mkl", "openblas"}:
        finders = {"mkl": find_mkl, "openblas": find_openblas_shim}
        names = [value.lower()] if value.lower() in finders else _auto_order(cpu_vendor())
        found = [(name, finders[name]()) for name in names]
        found = [(name, path) for name, path in found if path]
        if not found:
            _fallback(
                _NOT_INSTALLED[names[0]]
                if len(names) == 1
                else "neither MKL nor OpenBLAS is installed "
                "(pip install 'mlxinfer[mkl]', or 'mlxinfer[openblas]' + python -m mlxinfer.cpu.openblas_shim)",
                warn=len(names) == 1,
            )
            return
        for name, path in found:  # an installed one that fails to load warns, and the next is tried
            if _load(path, "mkl package" if name == "mkl" else "scipy-openblas32 package"):
                return
        return
    path, source = os.path.expanduser(value), ENV
    if os.sep in path and not os.path.isfile(path):
        _fallback(f"{ENV}={value}: no such file", warn=True)
        return
    _load(path, source)


_NOT_INSTALLED = {
    "mkl": "MLXINFER_BLAS=mkl: the mkl package is not installed (pip install 'mlxinfer[mkl]')",
    "openblas": "MLXINFER_BLAS=openblas: the OpenBLAS shim is not built "
    "(pip install 'mlxinfer[openblas]', then python -m mlxinfer.cpu.openblas_shim)",
}


def _auto_order(vendor: str) -> list[str]:
    return ["mkl", "openblas"] if vendor == "GenuineIntel" else ["openblas", "mkl"]


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ('GenuineIntel', 'AuthenticAMD', ...), '' where it does not say."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def find_openblas_shim(build: bool = True) -> str | None:
    """The OpenBLAS shim; built now (once, with the system C compiler) when scipy-openblas32 is installed
    and the shim is not, so a pip install needs no step of its own. None without scipy-openblas32, or
    when the build fails (one warning line: the next BLAS, or MLX's own, serves float32)."""
    path = openblas_shim.shim_path()
    if os.path.isfile(path) or not build or openblas_shim.openblas_library() is None:
        return path if os.path.isfile(path) else None
    from ..errors import MlxinferError

    try:
        return openblas_shim.build()
    except MlxinferError as e:
        print(f"warning: {e}; float32 matmuls go to the next BLAS found, or MLX's own", file=sys.stderr)
        return None


def _load(path: str, source: str) -> bool:
    name = os.path.basename(path)
    if name == SHIM_NAME:
        # set before the dlopen: OpenBLAS reads it when it starts its threads
        timeout = _default_env("OPENBLAS_THREAD_TIMEOUT", DEFAULT_OPENBLAS_THREAD_TIMEOUT)
        threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.cpu_count()
        return _load_global_or_undo(
            path, source, f"OpenBLAS pthreads x{threads}, thread timeout 2^{timeout} cycles", "OPENBLAS_THREAD_TIMEOUT"
        )
    if "mkl" not in name.lower():
        return _load_global(path, source, None)
    # set before the dlopen: MKL reads it when it first dispatches
    layer = _default_env("MKL_THREADING_LAYER", DEFAULT_MKL_THREADING_LAYER)
    return _load_global_or_undo(path, source, layer, "MKL_THREADING_LAYER")


_we_set: set[str] = set()


def _default_env(key: str, value: str) -> str:
    if not os.environ.get(key):
        os.environ[key] = value
        _we_set.add(key)
    return os.environ[key]


def _load_global_or_undo(path: str, source: str, layer: str, key: str) -> bool:
    if _load_global(path, source, layer):
        return True
    if key in _we_set:  # nothing loaded: leave the environment as it was
        del os.environ[key]
        _we_set.discard(key)
    return False


def _load_global(path: str, source: str, layer: str | None) -> bool:
    global _handle
    # _ctypes is what ctypes.CDLL calls underneath; `import ctypes` alone would cost ~8 ms per start
    import _ctypes

    try:
        # first privately, so that a library without cblas_sgemm never enters the global namespace
        local = _ctypes.dlopen(path, os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as e:
        _fallback(f"{_who(path, source)} could not be loaded as a shared library ({_short(e)})", warn=True)
        return False
    sgemm = _symbol(local, "cblas_sgemm")
    if sgemm is None:
        _ctypes.dlclose(local)
        _fallback(f"{_who(path, source)} does not export cblas_sgemm", warn=True)
        return False
    try:
        _handle = _ctypes.dlopen(path, os.RTLD_GLOBAL | os.RTLD_NOW)  # the same object, promoted to global
    except OSError as e:
        _fallback(f"{_who(path, source)} could not be loaded globally ({_short(e)})", warn=True)
        return False
    # a global lookup is what libmlx.so will do; something loaded earlier could still win it
    if _symbol(_ctypes.dlopen(None, os.RTLD_NOW), "cblas_sgemm") != sgemm:
        _fallback(f"{_who(path, source)}: another cblas_sgemm is already global in this process", warn=True)
        return False
    _set(
        library=_library_name(path),
        path=os.path.realpath(path) if os.sep in path else path,
        active=True,
        reason=f"loaded before mlx from the {source}" if source != ENV else f"loaded before mlx from {ENV}",
        threading_layer=layer,
        source=source,
    )
    return True


def _symbol(handle: int, name: str) -> int | None:
    import _ctypes

    try:
        return _ctypes.dlsym(handle, name)
    except OSError:
        return None


def find_mkl() -> str | None:
    """The PyPI `mkl` package's libmkl_rt.so.*, without importing anything heavy; None if absent.

    The wheel puts its libraries in <prefix>/lib (the virtualenv's or the user base's);
    otherwise the mkl-*.dist-info RECORD on sys.path says where they went.
    """
    import site  # already imported at start-up, so free

    prefixes = [sys.prefix]
    if getattr(site, "ENABLE_USER_SITE", False):  # pip install --user (never inside a virtualenv)
        prefixes.append(site.getuserbase())
    for prefix in prefixes:
        found = _rt_in(os.path.join(prefix, "lib"))
        if found:
            return found
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        try:
            infos = [n for n in os.listdir(entry) if n.startswith("mkl-") and n.endswith(".dist-info")]
        except OSError:
            continue
        for info in infos:
            found = _rt_in_record(entry, os.path.join(entry, info, "RECORD"))
            if found:
                return found
    return None


def _rt_in(directory: str) -> str | None:
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    hits = sorted(n for n in names if n.startswith("libmkl_rt.so"))
    # prefer the versioned soname (libmkl_rt.so.3) over a bare libmkl_rt.so link
    hits.sort(key=lambda n: (n == "libmkl_rt.so", n))
    return os.path.join(directory, hits[0]) if hits else None


def _rt_in_record(site_dir: str, record: str) -> str | None:
    try:
        with open(record, encoding="utf-8") as f:
            for line in f:
                rel = line.split(",", 1)[0]
                if os.path.basename(rel).startswith("libmkl_rt.so"):
                    path = os.path.normpath(os.path.join(site_dir, rel))
                    if os.path.isfile(path):
                        return path
    except OSError:
        return None
    return None


def _library_name(path: str) -> str:
    base = os.path.basename(path).lower()
    for key, name in (("mkl", "MKL"), ("openblas", "OpenBLAS"), ("blis", "BLIS"), ("flexiblas", "FlexiBLAS")):
        if key in base:
            return name
    return os.path.basename(path)


def _who(path: str, source: str) -> str:
    return f"{ENV}={path}" if source == ENV else path


def _short(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _set(**fields) -> None:
    _status.update({"library": None, "path": None, "active": False, "threading_layer": None, "source": None})
    _status.update(fields)


def _fallback(reason: str, warn: bool = False) -> None:
    _set(library=_BUNDLED, reason=reason)
    if warn:
        sys.stderr.write(f"warning: {reason}; using {_BUNDLED}\n")


def verify(n: int = 64) -> float:
    """Max relative error of an n x n float32 matmul in mlx against numpy (float64): a sanity check.

    Imports mlx; call it after preload (e.g. from `mlxinfer info`).
    """
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    got = np.array(mx.matmul(mx.array(a), mx.array(b)), dtype=np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))
