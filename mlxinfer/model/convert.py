"""Apply a compute path to a loaded model, in place: float32 (dequantized for BLAS), quantized
(weights kept packed, float32 arithmetic through cpu/qmm.py's kernel) or as loaded.

On a CPU both converted paths also choose the model's kernels (model/compute.py): cpu/kernels.py's
RoPE table and SwiGLU, which cost less there than MLX's own once the matmuls are fast, and on the
quantized path the extension's row ops and native blocks. The model's info says which path runs
and how its weights are held.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from ..errors import MlxinferError
from . import native_block, shard
from .compute import Kernels
from .params import dequantize_module, has_int8_layers, is_quantized, weights_kind


def experts_to_float32_on_cpu(model) -> bool:
    """MLX's CPU back end multiplies stacked experts (gather_mm) only in float32: there, stacked float
    experts stored in bf16/f16 are upcast (exactly) so that the model runs at all. True if any were."""
    if mx.default_device().type != mx.DeviceType.cpu:
        return False
    upcast = False
    for _, m in model.named_modules():
        if type(m).__name__ in ("Experts", "SwitchLinear") and m.weight.dtype != mx.float32:
            m.weight = m.weight.astype(mx.float32)
            upcast = True
    return upcast


def _check_dequantizable(model) -> None:
    quantized = (nn.QuantizedLinear, nn.QuantizedEmbedding, *shard.QUANTIZED)
    for path, m in model.named_modules():
        if is_quantized(m) and not isinstance(m, quantized) and not getattr(m, "float32_activations", False):
            if not hasattr(m, "dequantized") and type(m).__name__ != "QuantizedSwitchLinear":
                raise MlxinferError(
                    f"the float32 path cannot dequantize {path} ({type(m).__name__}); use compute_dtype='bfloat16'",
                    "compute_dtype",
                )


def _float32_twin(m):
    """A quantized leaf as its float32 counterpart (None for anything else)."""
    if isinstance(m, shard.QUANTIZED):  # a rank's slice of a split layer (model/shard.py)
        return shard.float32_twin(m, dequantize_module(m))
    if isinstance(m, nn.QuantizedLinear) or getattr(m, "float32_activations", False) and not hasattr(m, "as_linear"):
        new = nn.Linear(1, 1, bias="bias" in m)
        new.weight = dequantize_module(m)
        if "bias" in m:
            new.bias = m.bias.astype(mx.float32)
        return new
    if isinstance(m, nn.QuantizedEmbedding) or getattr(m, "float32_activations", False):
        new = nn.Embedding(1, 1)
        new.weight = dequantize_module(m)
        return new
    if is_quantized(m) and hasattr(m, "dequantized"):  # our stacked experts (moe.py)
        return m.dequantized()
    if is_quantized(m):  # mlx-lm's stacked experts
        from mlx_lm.models.switch_layers import SwitchLinear

        new = SwitchLinear(1, 1, 1, bias="bias" in m)
        new.weight = dequantize_module(m)
        if "bias" in m:
            new.bias = m.bias.astype(mx.float32)
        return new
    return None


def _convert(model, twin, compute_dtype: str):
    """Every leaf through `twin` (None keeps it), other floats upcast to float32, evaluated, info updated."""

    def convert(_path, m):
        new = twin(m)
        return m if new is None else new

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)

    # the packed layers' scales and biases stay as stored: the kernel widens them as it reads them
    packed = {path for path, m in model.named_modules() if getattr(m, "float32_activations", False)}

    def upcast(path, p):
        if path.rpartition(".")[0] in packed or not mx.issubdtype(p.dtype, mx.floating) or p.dtype == mx.float32:
            return p
        return p.astype(mx.float32)

    model.update(tree_map_with_path(upcast, model.parameters()))
    mx.eval(model.parameters())
    # nothing half-precision may be left outside them, or some matmuls would bypass the float32 kernels
    left = [
        n
        for n, p in tree_flatten(model.parameters())
        if p.dtype not in (mx.float32, mx.uint32) and n.rpartition(".")[0] not in packed
    ]
    assert not left, f"the {compute_dtype} conversion left {left[:3]} unconverted"
    kernels = mx.default_device().type == mx.DeviceType.cpu and isinstance(getattr(model, "kernels", None), Kernels)
    model.info = replace(model.info, compute_dtype=compute_dtype, weights=weights_kind(model), cpu_kernels=kernels)
    return model


def to_float32(model):
    """In place: every quantized module -> its float32 counterpart (nn.Linear, nn.Embedding, stacked
    experts), other floats upcast; evaluated. Returns the model.

    Every matmul of the forward pass then goes through `cblas_sgemm` (the tied output table too:
    nn.Embedding.as_linear is a plain matmul).
    """
    _check_dequantizable(model)
    _convert(model, _float32_twin, "float32")
    if model.info.cpu_kernels:
        model.kernels.choose("cpu", model)
    left = [n for n, p in tree_flatten(model.parameters()) if p.dtype != mx.float32]
    assert not left, f"to_float32 left {left[:3]} unconverted"
    return model


def to_quantized(model, int8: bool = False):
    """In place: every QuantizedLinear/QuantizedEmbedding whose layout the kernel takes -> its twin in
    cpu/qlinear.py (packed weights kept, float32 scales, biases and activations); any other quantized
    module dequantized as to_float32 does; other floats upcast; evaluated. Needs qmm.available().
    int8: the twins whose layout the int8 kernel takes repacked for it (activations rounded to 8 bits)."""
    from ..cpu import qlinear

    _check_dequantizable(model)

    def twin(m):
        new = qlinear.twin(m) if qlinear.takes(m) else _float32_twin(m)
        return qlinear.int8_twin(new) if int8 else new

    _convert(model, twin, "int8" if int8 else "quantized")
    if int8 and not has_int8_layers(model):
        model.info = replace(model.info, compute_dtype="quantized")  # no layout fitted: say which path runs
    if mx.default_device().type == mx.DeviceType.cpu:
        qlinear.use_native_norms(model)  # one node each: a decode step is ~2,400 nodes
    if model.info.cpu_kernels:  # and a layer in three (native_block.py)
        model.kernels.choose("native", model)
        native_block.install(model)
    return model


def quantizable(model) -> bool:
    """Whether the quantized path would keep all of the model's quantized weights packed (what `auto`
    asks: stacked experts and layouts the kernel does not take would be dequantized to float32)."""
    from ..cpu import qlinear

    quantized = [m for _, m in model.named_modules() if is_quantized(m)]
    return bool(quantized) and all(qlinear.takes(m) for m in quantized)


def apply(model, dtype: str):
    """Apply a choose_compute_dtype result in place: float32 and quantized convert, bfloat16 leaves the
    weights as loaded (on the CPU, bf16 stacked experts excepted: see experts_to_float32_on_cpu).
    "quantized" where the kernel is unavailable: one warning line, then what `auto` picks without it."""
    if dtype not in ("quantized", "int8", "float32", "bfloat16"):  # was: any other word relabelled it bfloat16
        raise MlxinferError(
            f"compute_dtype must be quantized, int8, float32 or bfloat16 here, got {dtype!r:.40} (load(..., "
            "compute_dtype='auto') chooses one)",
            "compute_dtype",
        )
    if dtype in ("quantized", "int8"):
        from ..cpu import qmm
        from .dtype_rule import auto_rule, current_facts
        from .params import float32_nbytes

        from ..cpu import qlinear

        if not any(qlinear.takes(m) for _, m in model.named_modules()):
            return to_float32(model)  # nothing stays packed: the quantized path is the float32 one
        if mx.default_device().type == mx.DeviceType.cpu and qmm.available():
            return to_quantized(model, int8=dtype == "int8")
        qmm.warn_once(qmm.status()["reason"] if mx.default_device().type == mx.DeviceType.cpu else "not a CPU device")
        facts = {**current_facts(), "quantized_kernel": False}
        dtype = auto_rule(model_bytes_float32=float32_nbytes(model), quantized_weights=True, **facts)[0]
    if dtype == "float32":
        return to_float32(model)
    kind = weights_kind(model)
    if experts_to_float32_on_cpu(model):
        kind += " (stacked experts float32: MLX's CPU gather matmul computes only in float32)"
    model.info = replace(model.info, compute_dtype="bfloat16", weights=kind)
    return model
