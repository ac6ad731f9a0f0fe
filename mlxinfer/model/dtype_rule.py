"""Which compute path `auto` picks, from explicit facts (pure, for tests and `mlxinfer info`).

quantized  weights stay quantized; every quantized Linear runs through the batch-invariant
           float32 kernel (cpu/qmm.py), everything else in float32
int8       quantized's, but each matmul's input rounded to 8 bits per group and multiplied as integers
           (llama.cpp's arithmetic, native/qmm/int8.cpp): faster on a CPU, batch-invariant, never `auto`
float32    dequantize every quantized Linear/Embedding once and upcast the rest (BLAS matmuls)
bfloat16   keep the weights exactly as loaded (bf16, or quantized with MLX's own kernels:
           bit-exact with mlx-lm)
auto       on a CPU: quantized when the weights are quantized and the kernel is built; else
           float32 when a fast BLAS is active and the float32 model takes under a third of
           physical RAM; else as loaded. On a GPU (Metal, CUDA) auto changes nothing.
"""

from __future__ import annotations

import os

CHOICES = ("quantized", "int8", "float32", "bfloat16", "auto")
RAM_FRACTION = 3  # float32 weights must fit in under 1/RAM_FRACTION of physical memory
AUTO_RULE = (
    "auto: quantized (weights kept quantized, float32 arithmetic) on a CPU when the weights are quantized "
    "and the quantized matmul kernel is built; else float32 if the default device is the CPU, a fast BLAS is "
    f"active and the float32 weights take under 1/{RAM_FRACTION} of physical RAM; otherwise the weights stay "
    "as loaded (GPU: always as loaded)"
)


def physical_ram_bytes() -> int | None:
    """Physical memory from os.sysconf; None where the platform does not say."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def auto_rule(
    *,
    device: str,
    fast_blas: bool,
    model_bytes_float32: int,
    ram_bytes: int | None,
    quantized_weights: bool = False,
    quantized_kernel: bool = False,
) -> tuple[str, str]:
    """The `auto` decision from explicit facts: (dtype, why).

    device: "cpu" or "gpu"; fast_blas: blas.status()["active"]; ram_bytes None = unknown;
    quantized_weights: the model has quantized Linear layers the kernel takes; quantized_kernel:
    cpu/qmm.py's kernel is built and agreed with MLX here.
    """
    if device != "cpu":
        return "bfloat16", f"default device is {device}: weights stay as loaded"
    if quantized_weights and quantized_kernel:
        return "quantized", "CPU, quantized weights and the quantized matmul kernel: weights stay quantized"
    if not fast_blas:
        return "bfloat16", "no fast BLAS active: float32 matmuls would use MLX's reference BLAS"
    if not ram_bytes:
        return "bfloat16", "physical RAM unknown: weights stay as loaded"
    limit = ram_bytes // RAM_FRACTION
    if model_bytes_float32 * RAM_FRACTION >= ram_bytes:  # exact: under a third, not under its floor
        return "bfloat16", (
            f"float32 weights ({_gib(model_bytes_float32)}) would not fit in 1/{RAM_FRACTION} of RAM "
            f"({_gib(limit)}): weights stay as loaded"
        )
    return "float32", (
        f"CPU with a fast BLAS; float32 weights ({_gib(model_bytes_float32)}) fit in 1/{RAM_FRACTION} of RAM "
        f"({_gib(limit)})"
    )


def current_facts(build_kernel: bool = False) -> dict:
    """The facts `auto` reads here: device, fast_blas, ram_bytes, quantized_kernel (imports mlx).
    build_kernel: build the quantized kernel now if it is not built (first use)."""
    import mlx.core as mx

    from ..cpu import blas, qmm

    cpu = mx.default_device().type == mx.DeviceType.cpu
    return {
        "device": "cpu" if cpu else "gpu",
        "fast_blas": bool(blas.status()["active"]),
        "ram_bytes": physical_ram_bytes(),
        "quantized_kernel": bool(cpu and qmm.available(build_if_missing=build_kernel)),
    }


def check_compute_dtype(requested: str) -> None:
    if requested not in CHOICES:
        from ..errors import MlxinferError

        raise MlxinferError(f"compute_dtype '{requested}' is not one of {', '.join(CHOICES)}", "compute_dtype")


def choose_compute_dtype(requested: str, model_bytes_float32: int, quantized_weights: bool = False) -> str:
    """ "quantized", "int8", "float32" or "bfloat16" ("bfloat16" = keep the weights as loaded) for a request of
    quantized|int8|float32|bfloat16|auto. quantized_weights: whether the quantized path could take the model."""
    check_compute_dtype(requested)
    if requested != "auto":
        return requested
    facts = current_facts(build_kernel=quantized_weights)
    return auto_rule(model_bytes_float32=model_bytes_float32, quantized_weights=quantized_weights, **facts)[0]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
