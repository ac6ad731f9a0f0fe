"""The compute path, in one place for callers: which one `auto` picks (dtype_rule.py), applying it
(convert.py), and the parameter facts both read (params.py).

  quantized  weights stay quantized, float32 arithmetic through cpu/qmm.py's batch-invariant kernel
  float32    dequantize once; every matmul through BLAS
  bfloat16   the weights exactly as loaded (MLX's own kernels; bit-exact with mlx-lm)
  auto       see dtype_rule.py

`system_info` and `describe` (what `mlxinfer info` and the bench print) live in system.py and are
re-exported here for the callers that import them from this module.
"""

from __future__ import annotations

from .convert import apply, experts_to_float32_on_cpu, quantizable, to_float32, to_quantized
from .dtype_rule import (
    AUTO_RULE,
    CHOICES,
    RAM_FRACTION,
    auto_rule,
    check_compute_dtype,
    choose_compute_dtype,
    current_facts,
    physical_ram_bytes,
)
from .params import dequantize, dequantize_module, float32_nbytes, is_quantized, unpacked_parameter_count, weights_kind

__all__ = [
    "AUTO_RULE",
    "CHOICES",
    "RAM_FRACTION",
    "apply",
    "auto_rule",
    "check_compute_dtype",
    "choose_compute_dtype",
    "current_facts",
    "dequantize",
    "dequantize_module",
    "experts_to_float32_on_cpu",
    "float32_nbytes",
    "is_quantized",
    "physical_ram_bytes",
    "quantizable",
    "to_float32",
    "to_quantized",
    "unpacked_parameter_count",
    "weights_kind",
]


def __getattr__(name):
    if name in ("system_info", "describe"):  # imported on demand: they pull in the BLAS and kernel checks
        from . import system

        return getattr(system, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
