"""A mixture of experts in place of the MLP (Qwen3-MoE): a router scores n expert MLPs for each
token, the token goes through the k best, and their outputs are added up, weighted by the
router's probabilities. The other n - k experts cost nothing for that token.

The n experts' matrices are stacked, (n, out, in) per projection, and run with MLX's gather
matmuls: each row of the input is multiplied only by its own experts' matrices. Module names
are mlx-lm's (`mlp.gate` is the router, `mlp.switch_mlp.up_proj` the stacked experts), as
mlx-community stores them; Hugging Face's per-expert tensors are stacked on load (`stack_experts`).
Shapes: B batch, L positions, D hidden size, F expert width, n experts, k experts per token.
"""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxinferError
from ..formats.config import ModelConfig
from .compute import Kernels
from .params import dequantize

ROUTER_QUANTIZATION = {"group_size": 64, "bits": 8}  # mlx-lm's convert keeps Qwen3-MoE routers at 8 bits


class Experts(nn.Module):
    """n bias-free Linear layers stacked: weight (n, out, in)."""

    def __init__(self, n: int, in_dims: int, out_dims: int):
        super().__init__()
        self.weight = mx.zeros((n, out_dims, in_dims))  # replaced by the checkpoint's tensor on load

    def __call__(self, x: mx.array, experts: mx.array, sorted_experts: bool = False) -> mx.array:
        # row r of x times the matrix of expert experts[r]: (..., 1, in) -> (..., 1, out)
        return mx.gather_mm(x, self.weight.swapaxes(-1, -2), rhs_indices=experts, sorted_indices=sorted_experts)

    def to_quantized(self, group_size: int = 64, bits: int = 4, mode: str = "affine") -> "QuantizedExperts":
        weight, scales, *biases = mx.quantize(self.weight, group_size, bits, mode=mode)  # no biases but affine
        return QuantizedExperts(weight, scales, biases[0] if biases else None, group_size, bits, mode)


class QuantizedExperts(nn.Module):
    """The same, each expert's matrix MLX-quantized (packed weight, scales, biases), run by gather_qmm."""

    def __init__(self, weight: mx.array, scales: mx.array, biases: mx.array | None, group_size, bits, mode):
        super().__init__()
        self.weight, self.scales = weight, scales
        if biases is not None:
            self.biases = biases
        self.group_size, self.bits, self.mode = group_size, bits, mode

    def __call__(self, x: mx.array, experts: mx.array, sorted_experts: bool = False) -> mx.array:
        return mx.gather_qmm(
            x,
            self.weight,
            self.scales,
            self.get("biases"),
            rhs_indices=experts,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
            sorted_indices=sorted_experts,
        )

    def dequantized(self, dtype=mx.float32) -> Experts:
        out = Experts(1, 1, 1)
        out.weight = dequantize(
            self.weight, self.scales, self.get("biases"), self.group_size, self.bits, dtype, self.mode
        )
        return out


class ExpertMLPs(nn.Module):
    """n SwiGLU MLPs, D -> F -> D, stacked; each token runs its k."""

    def __init__(self, D: int, F: int, n: int, kernels: Kernels | None = None):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = Experts(n, D, F), Experts(n, D, F), Experts(n, F, D)
        self.kernels = kernels or Kernels()

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        x = mx.expand_dims(x, (-2, -3))  # (B, L, 1, 1, D): one row per token, shared by its k experts
        grouped = experts.size >= 64  # many rows: group them by expert, so each matrix is read in one run
        rows, back = experts, None
        if grouped:
            x, rows, back = group_by_expert(x, experts)  # (B * L * k, 1, D), (B * L * k,)
        h = self.kernels.swiglu(self.gate_proj(x, rows, grouped), self.up_proj(x, rows, grouped))  # (..., 1, F)
        y = self.down_proj(h, rows, grouped)  # (..., 1, D)
        if grouped:
            y = mx.unflatten(y[back], 0, experts.shape)
        return y.squeeze(-2)  # (B, L, k, D)


def group_by_expert(x: mx.array, experts: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """One row per (token, expert) in expert order, their experts, and the order that puts them back."""
    k = experts.shape[-1]
    flat = experts.flatten()
    order = mx.argsort(flat)
    return x.flatten(0, -3)[order // k], flat[order], mx.argsort(order)


class SparseMoE(nn.Module):
    """The router picks k of n experts per token; their outputs, weighted by its probabilities, add up."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels | None = None):
        super().__init__()
        D, n = cfg.hidden_size, cfg.num_experts
        self.k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(D, n, bias=False)  # the router: one score per expert
        self.switch_mlp = ExpertMLPs(D, cfg.moe_intermediate_size, n, kernels)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """(experts (B, L, k), weights (B, L, k)): each token's k most probable experts, in no order."""
        probs = mx.softmax(self.gate(x), axis=-1, precise=True)  # (B, L, n)
        experts = mx.argpartition(probs, kth=-self.k, axis=-1)[..., -self.k :]
        weights = mx.take_along_axis(probs, experts, axis=-1)
        if self.norm_topk_prob:  # the k weights rescaled to sum to 1
            weights = weights / mx.sum(weights, axis=-1, keepdims=True)
        return experts, weights

    def __call__(self, x: mx.array) -> mx.array:
        experts, weights = self.route(x)
        y = self.switch_mlp(x, experts)  # (B, L, k, D)
        return (y * weights[..., None]).sum(axis=-2).astype(y.dtype)  # (B, L, D)


_PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)$")


def stack_experts(weights: dict[str, mx.array], cfg: ModelConfig) -> dict[str, mx.array]:
    """Hugging Face stores each expert apart (`mlp.experts.7.up_proj.weight`); stack them into
    `mlp.switch_mlp.up_proj.weight`, (n, out, in), as mlx-lm does. A missing expert is named."""
    groups: dict[tuple[str, str, str], dict[int, mx.array]] = {}
    for name in [n for n in weights if _PER_EXPERT.match(n)]:
        layer, e, proj, part = _PER_EXPERT.match(name).groups()
        groups.setdefault((layer, proj, part), {})[int(e)] = weights.pop(name)
    for (layer, proj, part), by_expert in groups.items():
        missing = next((e for e in range(cfg.num_experts) if e not in by_expert), None)
        beyond = max(by_expert)
        if missing is not None or beyond >= cfg.num_experts:
            which, verb = (missing, "lack") if missing is not None else (beyond, "have")
            raise MlxinferError(
                f"the weights {verb} '{layer}.experts.{which}.{proj}.{part}' ({cfg.num_experts} experts in "
                "config.json); the checkpoint is incomplete or belongs to another model",
                "source",
            )
        weights[f"{layer}.switch_mlp.{proj}.{part}"] = mx.stack([by_expert[e] for e in range(cfg.num_experts)])
    return weights


def last_token_routing(model, ids: mx.array) -> list[tuple[int, list[int], list[float]]]:
    """(layer, experts best first, their weights) for each layer with experts: what the router chose
    for the last token of `ids` (1, L). Runs the blocks as Model.run_layers does, reading each router
    on the way (one forward pass; no cache)."""
    h = model.embed(ids)  # (1, L, D)
    mask = "causal" if ids.shape[1] > 1 else None
    chosen = []
    for i, block in enumerate(model.layers):
        h = h + block.self_attn(block.input_layernorm(h), mask, None)
        x = block.post_attention_layernorm(h)
        if isinstance(block.mlp, SparseMoE):
            experts, weights = block.mlp.route(x[:, -1:])  # (1, 1, k) each
            chosen.append((i, experts[0, 0], weights[0, 0]))
        h = h + block.mlp(x)
    out = []
    for i, experts, weights in chosen:
        order = mx.argsort(-weights)
        out.append((i, experts[order].tolist(), weights[order].astype(mx.float32).tolist()))
    return out
