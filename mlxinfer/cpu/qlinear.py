"""The quantized path's layers: weights kept packed in MLX's affine layout, float32 activations,
every matmul through cpu/qmm.py's batch-invariant kernel. model/convert.py swaps them in for
nn.QuantizedLinear and nn.QuantizedEmbedding (the tied output table's `as_linear` too)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import qmm


class _Packed(nn.Module):
    float32_activations = True  # model/params.py's weights_kind reads it
    int8 = False  # True once repacked for the int8 kernel (int8_twin): then MLX cannot dequantize `weight`

    def __init__(self, m: nn.Module):
        super().__init__()
        self._kernel = qmm.kernel()
        self.group_size, self.bits, self.mode = m.group_size, m.bits, "affine"
        self.weight = m["weight"]
        # scales and biases stay as stored (float16 for GGUF): the kernel widens them to float32 exactly
        self.scales, self.biases = m["scales"], m["biases"]
        self.freeze()

    @property
    def kernel_bits(self) -> int:
        """What the kernel's calls pass: the bits, with the int8 layout's flag once repacked."""
        return self.bits | self._kernel.int8_flag() if self.int8 else self.bits

    def _matmul(self, x: mx.array) -> mx.array:
        return self._kernel.quantized_matmul(
            x, self["weight"], self["scales"], self["biases"], self.group_size, self.kernel_bits
        )


class QuantizedLinearF32(_Packed):
    """nn.QuantizedLinear's weights; y = x @ dequantize(W).T (+ bias) in float32."""

    def __init__(self, m: nn.QuantizedLinear):
        super().__init__(m)
        if "bias" in m:
            self.bias = m["bias"].astype(mx.float32)
            self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        y = self._matmul(x)
        return y + self["bias"] if "bias" in self else y


class QuantizedEmbeddingF32(_Packed):
    """nn.QuantizedEmbedding's table: rows dequantized in float32 for a lookup, the kernel for as_linear."""

    def __call__(self, ids: mx.array) -> mx.array:
        # one node, the bits of mx.dequantize on the gathered rows with their scales widened (~28 nodes)
        return self._kernel.dequantize_rows(
            ids, self["weight"], self["scales"], self["biases"], self.group_size, self.kernel_bits
        )

    def as_linear(self, x: mx.array) -> mx.array:
        return self._matmul(x)


def takes(m: nn.Module) -> bool:
    """Whether one of these layers can stand in for `m` (an affine layout the kernel takes)."""
    if not isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or m.get("biases") is None:
        return False
    return qmm.supports(m.group_size, m.bits, m["weight"].shape[-1] * 32 // m.bits, getattr(m, "mode", "affine"))


def twin(m: nn.Module) -> nn.Module:
    """The float32-activation twin of a QuantizedLinear/QuantizedEmbedding that `takes` accepts."""
    return QuantizedEmbeddingF32(m) if isinstance(m, nn.QuantizedEmbedding) else QuantizedLinearF32(m)


def int8_twin(m):
    """A twin repacked in place for the int8 kernel (native/qmm/int8.cpp: the same bytes in its own order,
    scales and biases one per lane) where its layout allows (4-bit rows need K % 64 == 0; others keep
    the float32 kernel, batch-invariant too). Anything else (None, a float layer) is returned as it is."""
    if not isinstance(m, _Packed):
        return m
    k, K = m._kernel, m["weight"].shape[-1] * 32 // m.bits
    if not k.int8_supports(K, m.group_size, m.bits):
        return m
    m.unfreeze()
    m.weight = k.repack_int8(m["weight"], m.group_size, m.bits)
    m.scales = k.int8_lane_groups(m["scales"], K, m.group_size)
    m.biases = k.int8_lane_groups(m["biases"], K, m.group_size)
    m.int8 = True
    m.freeze()
    return m


class RMSNormF32(nn.Module):
    """nn.RMSNorm as one primitive of the extension (MLX's CPU back end composes it from ~7 nodes)."""

    def __init__(self, m: nn.RMSNorm):
        super().__init__()
        self._kernel = qmm.kernel()
        self.weight = m["weight"].astype(mx.float32)
        self.eps = m.eps

    def __call__(self, x: mx.array) -> mx.array:
        return self._kernel.rms_norm(x, self["weight"], self.eps)


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up as one primitive (cpu/kernels.swiglu's exp, ~8 nodes once compiled on a CPU)."""
    return qmm.kernel().swiglu(gate, up)


def use_native_norms(model) -> int:
    """The model's RMSNorms as the extension's single-node row op; returns how many."""
    norms = {path: RMSNormF32(m) for path, m in model.named_modules() if type(m) is nn.RMSNorm}
    if norms:
        model.update_modules(_tree(norms))
    return len(norms)


def _tree(flat: dict) -> dict:
    """{"a.b.0.c": module} -> the nested dict/list structure Module.update_modules takes."""
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(flat.items()))


class RopeTableF32:
    """cpu/kernels.py's RopeTable (the same cos/sin table, the same arithmetic), applied as one primitive
    instead of two table slices, two half slices, two compiled products and a concatenation."""

    def __init__(self, table):
        self._table, self._kernel = table, qmm.kernel()

    def tables(self, needed: int) -> tuple[mx.array, mx.array]:
        """(cos, sin), (P, E / 2) with P >= needed positions."""
        t = self._table
        if t.cos is None or needed > t.cos.shape[0]:
            t._grow(needed)
        return t.cos, t.sin

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        cos, sin = self.tables(offset + x.shape[2])
        return self._kernel.rope(x, cos, sin, offset)
