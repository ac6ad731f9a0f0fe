"""Tensor parallelism on MLX's own distributed layers: each rank keeps its share of every layer.

The plan (counting/split.py) gives each rank whole KV heads with their query heads and a run of
MLP columns. q/k/v and gate/up become `mlx.nn.AllToShardedLinear` holding the rank's output rows;
o_proj and down_proj become `mlx.nn.ShardedToAllLinear` holding its input columns, whose forward
pass ends in one `mx.distributed.all_sum` (their quantized twins for quantized weights). MLX's
constructors insist on equal shares (output_dims % N == 0); the split here may be uneven
(3 KV groups on 2 ranks), so the layers are built around the rank's slices directly, and their
forward pass, which never reads N, is MLX's. mlx-lm's `Model.shard(group)` does the same with
equal shares only.

Slicing is lazy: with weights from `mx.load` of safetensors nothing has been read when a layer is
cut, and each layer is evaluated as soon as it is cut, so a rank reads one layer's full tensors at
a time and keeps only its slices (`mx.contiguous` copies them out of the full tensor, which is
then freed).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)

from ..counting import split
from ..errors import MlxinferError

QUANTIZED = (QuantizedAllToShardedLinear, QuantizedShardedToAllLinear)
_FLOAT_TWIN = {QuantizedAllToShardedLinear: AllToShardedLinear, QuantizedShardedToAllLinear: ShardedToAllLinear}


def shard(model, group) -> dict:
    """Split `model` across `group`'s ranks in place through its own `shard(group)`: ours cuts by our
    plan (shard_layers) and returns it, mlx-lm's classes cut equal shares; returns how, for reports."""
    if not hasattr(model, "shard"):
        raise MlxinferError(
            f"{model.info.definition} has no tensor-parallel split; run it on one rank (without mlx.launch)"
        )
    try:
        plan = model.shard(group)
    except ValueError as e:  # MLX's sharded layers: "Cannot shard the output of size 14 across 4 devices"
        raise MlxinferError(
            f"{model.info.definition} splits only into equal shares (mlx-lm's shard): {e}; use a number of "
            "ranks that divides its head counts"
        ) from None
    if isinstance(plan, split.SplitPlan):
        return plan.to_dict()
    return {"ranks": group.size(), "rule": "the model class's own shard(): equal shares of every head count"}


def shard_layers(model, group) -> split.SplitPlan:
    """Our Model: every layer cut by the plan for group.size() ranks, this rank's share evaluated."""
    cfg = model.config
    if not all(hasattr(x.mlp, "down_proj") for x in model.layers):
        raise MlxinferError(
            f"{model.info.definition}: its MLP (a mixture of experts) has no tensor-parallel split yet; "
            "run it on one rank"
        )
    groups = {  # the quantization group sizes of the matrices cut by columns, over every layer
        "o_proj": math.lcm(*(getattr(x.self_attn.o_proj, "group_size", 1) for x in model.layers)),
        "down_proj": math.lcm(*(getattr(x.mlp.down_proj, "group_size", 1) for x in model.layers)),
    }
    plan = split.plan(cfg, group.size(), groups)
    s = plan.shares[group.rank()]
    E = cfg.head_dim
    q = (s.q_heads[0] * E, s.q_heads[1] * E)
    kv = (s.kv_heads[0] * E, s.kv_heads[1] * E)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = rows(attn.q_proj, q, group)
        attn.k_proj = rows(attn.k_proj, kv, group)
        attn.v_proj = rows(attn.v_proj, kv, group)
        attn.o_proj = columns(attn.o_proj, q, group)
        attn.n_heads = s.q_heads[1] - s.q_heads[0]
        attn.n_kv_heads = s.kv_heads[1] - s.kv_heads[0]  # the KV cache holds these heads only
        mlp.gate_proj = rows(mlp.gate_proj, s.mlp_columns, group)
        mlp.up_proj = rows(mlp.up_proj, s.mlp_columns, group)
        mlp.down_proj = columns(mlp.down_proj, s.mlp_columns, group)
        mx.eval(layer.parameters())  # read this layer's tensors now; only the slices stay
    return plan


def _cut(a: mx.array, start: int, stop: int, axis: int) -> mx.array:
    index = (slice(None),) * (axis % a.ndim) + (slice(start, stop),)
    return mx.contiguous(a[index])


def rows(layer: nn.Module, span: tuple[int, int], group) -> nn.Module:
    """All-to-sharded: the output rows [start, stop) of a Linear or QuantizedLinear (and its bias)."""
    a, b = span
    bias = _cut(layer["bias"], a, b, 0) if "bias" in layer else None
    if isinstance(layer, nn.QuantizedLinear):
        parts = {k: _cut(layer[k], a, b, 0) for k in ("weight", "scales", "biases") if k in layer}
        return _build(QuantizedAllToShardedLinear, group, parts, bias, layer)
    return _build(AllToShardedLinear, group, {"weight": _cut(layer.weight, a, b, 0)}, bias)


def columns(layer: nn.Module, span: tuple[int, int], group) -> nn.Module:
    """Sharded-to-all: the input columns [start, stop) (for quantized weights a whole number of groups);
    the bias stays whole, added once after the all_sum."""
    a, b = span
    bias = layer["bias"] if "bias" in layer else None
    if isinstance(layer, nn.QuantizedLinear):
        g = layer.group_size
        if a % g or b % g or a * layer.bits % 32 or b * layer.bits % 32:  # the plan avoids this; a guard
            raise MlxinferError(f"columns {a}..{b} cut a quantization group of {g}; use another number of ranks")
        parts = {"weight": _cut(layer.weight, a * layer.bits // 32, b * layer.bits // 32, -1)}
        parts.update({k: _cut(layer[k], a // g, b // g, -1) for k in ("scales", "biases") if k in layer})
        return _build(QuantizedShardedToAllLinear, group, parts, bias, layer)
    return _build(ShardedToAllLinear, group, {"weight": _cut(layer.weight, a, b, -1)}, bias)


def _build(cls, group, arrays: dict, bias, quantized: nn.Module | None = None) -> nn.Module:
    """One of MLX's sharded layers holding these arrays. Its __init__ would check for equal shares and
    draw random weights, so it is skipped; everything the forward pass reads is set here."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.group = group
    if quantized is not None:
        layer.group_size, layer.bits = quantized.group_size, quantized.bits
        layer.mode = getattr(quantized, "mode", "affine")
    for name, value in arrays.items():
        setattr(layer, name, value)
    if bias is not None:
        layer.bias = bias
    if quantized is not None:
        layer.freeze()
    return layer


def float32_twin(layer: nn.Module, weight: mx.array) -> nn.Module:
    """The float32 path (convert.to_float32): a quantized sharded layer as its float twin holding
    `weight`, the slice dequantized."""
    bias = layer["bias"].astype(mx.float32) if "bias" in layer else None
    return _build(_FLOAT_TWIN[type(layer)], layer.group, {"weight": weight}, bias)
