"""Build the small library that lets MLX's float32 matmuls use OpenBLAS from PyPI.

The `scipy-openblas32` wheel (the OpenBLAS that NumPy and SciPy ship, kept by their
maintainers) exports its functions with a `scipy_` prefix, so MLX cannot bind
`cblas_sgemm` to it directly. native/sgemm_openblas.c is a 30-line forwarder that
exports `cblas_sgemm` and sends single-row products to sgemv. It is compiled once,
with the system C compiler, into <prefix>/lib next to where the mkl wheel puts
libmkl_rt; blas.py finds it there at import, and builds it there first (once) when
scipy-openblas32 is installed and the shim is not built yet.

    python -m mlxinfer.cpu.openblas_shim          # build now (the Makefile's set-up runs this)

Why bother when MKL is there: on AMD CPUs MKL takes slower code paths than on Intel
ones, and OpenBLAS ran the float32 path faster (docs/performance.md, "BLAS choices").
"""

from __future__ import annotations

import os
import sys

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "sgemm_openblas.c")
SHIM_NAME = "libmlxinfer_openblas.so"


def shim_path() -> str:
    """Where the shim is built, and where blas.py's preload looks for it: <prefix>/lib (build.py's place)."""
    return os.path.join(sys.prefix, "lib", SHIM_NAME)


def openblas_library() -> str | None:
    """scipy-openblas32's libscipy_openblas.so, or None if the wheel is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.origin:
        return None
    lib = os.path.join(os.path.dirname(spec.origin), "lib")
    try:
        names = sorted(n for n in os.listdir(lib) if n.startswith("libscipy_openblas") and ".so" in n)
    except OSError:
        return None
    return os.path.join(lib, names[0]) if names else None


def build(out: str | None = None, compiler: str | None = None) -> str:
    """Compile the shim against scipy-openblas32; returns its path. Raises MlxinferError (one line)."""
    from ..errors import MlxinferError
    from . import build as native_build  # imported here: blas.py imports this module at every start

    if not sys.platform.startswith("linux"):
        raise MlxinferError(f"the OpenBLAS shim is for Linux; on {sys.platform} MLX's own BLAS is used")
    target = openblas_library()
    if target is None:
        raise MlxinferError("scipy-openblas32 is not installed: pip install 'mlxinfer[openblas]'")
    cc = native_build.compiler("the OpenBLAS shim", compiler)
    libdir, libname = os.path.split(target)
    flags = ["-O2", f"-L{libdir}", f"-l:{libname}", f"-Wl,-rpath,{libdir}"]
    return native_build.compile_library(SOURCE, out or shim_path(), "the OpenBLAS shim", flags, cc)


def main() -> int:
    from . import build as native_build

    return native_build.main(build, lambda path: f"built {path} (cblas_sgemm -> {openblas_library()})")


if __name__ == "__main__":
    sys.exit(main())
