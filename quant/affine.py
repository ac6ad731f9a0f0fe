"""MLX affine quantization, tensor by tensor, and the way back to float.

Per group of `group_size` consecutive inputs of one row, MLX stores a scale s and a bias b (in the
weight's float dtype) and each weight as an unsigned integer q of `bits` bits: w ~ s * q + b. The
grid puts the group's larger-magnitude extreme exactly on the bias, so the worst-case error is one
step (max - min) / (2^bits - 1), plus the rounding of s and b to the stored dtype.

`quantize_tensor` is the very call `nn.quantize` (and so mlx-lm's `convert`) makes for a Linear or
Embedding: `mx.quantize(w, group_size, bits, mode="affine")`. `dequantize_tensor` computes
s * q + b in float32 from the stored scales and biases (for GGUF Q4_0/Q4_1/Q8_0 this equals
llama.cpp's own dequantization exactly) and rounds once to the requested dtype.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxinfer.model.params import dequantize as dequantize_tensor  # noqa: F401  (part of quant's API)
from mlxinfer.model.params import dequantize_module, is_quantized

DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "float16": "float16",
    "f32": "float32",
    "fp32": "float32",
    "float32": "float32",
}


def quantize_tensor(w: mx.array, group_size: int, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    """(packed uint32 weights, scales, biases): nn.quantize's call for a Linear/Embedding weight."""
    return mx.quantize(w, group_size=group_size, bits=bits, mode="affine")


def module_weight(module: nn.Module, dtype=mx.float32) -> mx.array:
    """A Linear/Embedding's (or stacked experts') weight in float (dequantized if quantized)."""
    if is_quantized(module):
        return dequantize_module(module, dtype)
    return module.weight.astype(dtype)


def is_table(module: nn.Module) -> bool:
    """What a policy decides about: every module nn.quantize would quantize (Linear, Embedding, stacked
    experts: whatever has `to_quantized` and a weight), and those already quantized."""
    return is_quantized(module) or (hasattr(module, "to_quantized") and "weight" in module)


def tables(model: nn.Module) -> dict[str, nn.Module]:
    """{module path: module} for every Linear, Embedding and stacked experts (quantized or not), in model order."""
    found = [(path, m) for path, m in model.named_modules() if is_table(m)]
    return dict(sorted(found, key=lambda pm: _natural(pm[0])))


def _natural(path: str) -> tuple:
    """model.embed_tokens, model.layers.0..., model.layers.10..., lm_head: the order a reader expects."""
    parts = path.removeprefix("model.").split(".")
    first = {"embed_tokens": 0, "layers": 1, "norm": 2, "lm_head": 3}
    return (first.get(parts[0], 4),) + tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


def input_size(module: nn.Module) -> int:
    w = module.weight
    return w.shape[-1] * 32 // module.bits if is_quantized(module) else w.shape[-1]


def setting_of(module: nn.Module) -> tuple[int, int] | None:
    """(group_size, bits) of a quantized module; None if float."""
    return (module.group_size, module.bits) if is_quantized(module) else None


def float_tensors(model: nn.Module, dtype) -> dict[str, mx.array]:
    """Every parameter by name, in `dtype`: quantized weights dequantized, the rest cast.

    mlx-lm's `convert` casts every floating parameter to the target dtype before it quantizes;
    so does this, so that a bf16 checkpoint's tensors reach mx.quantize unchanged.
    """
    mods = tables(model)
    out = {}
    for path, m in mods.items():
        out[f"{path}.weight"] = module_weight(m, dtype)
    for name, p in tree_flatten(model.parameters()):
        owner, _, part = name.rpartition(".")
        if owner in mods and part in ("weight", "scales", "biases"):
            continue
        out[name] = p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p
    return out


def dtype_name(value: str) -> str:
    from mlxinfer.errors import MlxinferError

    name = DTYPES.get(str(value).lower())
    if name is None:
        raise MlxinferError(f"dtype {value} is not supported; use bf16, f16 or f32", "dtype")
    return name
