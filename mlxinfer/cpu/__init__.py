"""Speed on a Linux CPU: a fast BLAS loaded before MLX (blas.py, and the OpenBLAS shim it can
build), and the float32 path's own exp/SwiGLU and RoPE table (kernels.py). This package's
__init__ must not import mlx: `blas.preload()` has to run before MLX loads."""
