"""mlxinfer: open a language model and see what it computes.

The public API. Attributes load lazily so that `import mlxinfer` (and `count`)
stays free of mlx until a command needs it.
"""

from . import blas as _blas

_blas.preload()  # a fast BLAS (MKL or OpenBLAS) must be loaded before anything imports mlx; see blas.py

from .errors import MlxinferError  # noqa: E402

__all__ = ["MlxinferError", "load", "count", "next_token_table", "ModelConfig"]

_LAZY = {
    "load": ("loading", "load"),
    "count": ("counting", "count"),
    "next_token_table": ("tables", "next_token_table"),
    "ModelConfig": ("config", "ModelConfig"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'mlxinfer' has no attribute {name!r}")
