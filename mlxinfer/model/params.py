"""What a model's parameters are: which modules are quantized, how many values they hold, and the
float32 dequantization every path that unpacks them shares. A leaf: no other model module."""

from __future__ import annotations

import mlx.core as mx


def is_quantized(module) -> bool:
    """An MLX-quantized leaf: QuantizedLinear/Embedding, mlx-lm's QuantizedSwitchLinear, our QuantizedExperts
    (and the quantized path's float32-activation twins of the first two, cpu/qlinear.py)."""
    return hasattr(module, "bits") and hasattr(module, "group_size") and "scales" in module


def unpacked_parameter_count(model) -> int:
    """Unique parameters, quantized weights counted unpacked (scales and biases not counted)."""
    from mlx.utils import tree_flatten

    total = 0
    quantized = set()
    for path, module in model.named_modules():
        if is_quantized(module):
            total += module.weight.size * 32 // module.bits  # packed uint32 words hold 32 / bits values
            quantized.add(path)
    for name, p in tree_flatten(model.parameters()):
        owner, _, part = name.rpartition(".")
        if owner in quantized and part in ("weight", "scales", "biases"):
            continue
        total += p.size
    return total


def float32_nbytes(model) -> int:
    """Bytes the model's parameters take once every weight is float32 (quantized weights unpacked)."""
    return 4 * unpacked_parameter_count(model)


def dequantize(packed, scales, biases, group_size: int, bits: int, dtype=None, mode: str = "affine"):
    """s * q + b computed in float32 from the stored scales and biases (float16 arithmetic would round
    them; for GGUF Q4_0/Q4_1/Q8_0 this equals llama.cpp's own dequantization), rounded once to `dtype`
    (default float32)."""
    kwargs = {"group_size": group_size, "bits": bits}
    if mode != "affine":
        kwargs["mode"] = mode
    scales = scales.astype(mx.float32) if mode == "affine" else scales
    biases = None if biases is None else biases.astype(mx.float32)  # None for modes without biases
    return mx.dequantize(packed, scales, biases, **kwargs).astype(dtype or mx.float32)


def has_int8_layers(model) -> bool:
    """Whether any layer is repacked for the int8 kernel (cpu/qlinear.int8_twin): its weights in that kernel's order."""
    return any(getattr(m, "int8", False) for _, m in model.named_modules())


def dequantize_module(m, dtype=None):
    """A QuantizedLinear/QuantizedEmbedding's weight, dequantized as `dequantize` does."""
    if getattr(m, "int8", False):  # the int8 kernel's own layout (cpu/qlinear.int8_twin): MLX would misread it
        from ..errors import MlxinferError

        raise MlxinferError(
            "a layer repacked for the int8 kernel cannot be dequantized; load the model again with that compute_dtype",
            "compute_dtype",
        )
    return dequantize(m.weight, m.scales, m.get("biases"), m.group_size, m.bits, dtype, getattr(m, "mode", "affine"))


def weights_kind(model) -> str:
    """How the model's weights are stored now: 'float32', 'bfloat16', '4-bit quantized (activations float16)', ..."""
    from mlx.utils import tree_flatten

    for _, module in model.named_modules():
        if is_quantized(module):
            bits = "/".join(map(str, sorted({m.bits for _, m in model.named_modules() if is_quantized(m)})))
            if getattr(module, "float32_activations", False):
                activations = "int8" if has_int8_layers(model) else "float32"
                return f"{bits}-bit quantized (activations {activations})"
            # every width a mixed folder holds (mixed_3_6 read "6-bit": its head's)
            return f"{bits}-bit quantized (activations {str(module.scales.dtype).split('.')[-1]})"
    dtypes = sorted({str(p.dtype).split(".")[-1] for _, p in tree_flatten(model.parameters())})
    return "/".join(dtypes)
