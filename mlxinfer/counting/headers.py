"""Counting without a formula: a model type that no Architecture describes is counted from what its
safetensors headers store (names and shapes, never a weight), quantized weights unpacked to the
values they stand for, per-expert tensors gathered as mlx-lm stacks them."""

from __future__ import annotations

from ..errors import MlxinferError
from ..formats.architectures import ARCHITECTURES
from ..formats.config import ModelConfig
from .layout import _LAYER, Weight, stacked_name

ATTENTION = ("self_attn", "attn", "attention")
_STACKS = ("switch_mlp.", ".experts.")  # where mlx-lm keeps a layer's experts as one tensor a projection


def no_formula(model_type: str) -> str:
    return f"count has no formula for model_type '{model_type}' (it has: {', '.join(ARCHITECTURES)})"


def header_weights(cfg: ModelConfig, files: list[dict] | None) -> list[Weight]:
    if not files:
        raise MlxinferError(
            f"{no_formula(cfg.model_type)}; point it at the model's directory or repo id with its "
            "safetensors files, and it counts from their headers",
            "source",
        )
    shapes: dict[str, list[tuple[int, ...]]] = {}
    names = {t["name"] for f in files for t in f["tensors"]}
    for f in files:
        for t in f["tensors"]:
            name, stem = t["name"], t["name"].rpartition(".")[0]
            if name.endswith((".scales", ".biases")) and f"{stem}.weight" in names:
                continue  # a quantized weight's groups: not parameters
            shape = tuple(t["shape"])
            if f"{stem}.scales" in names and name.endswith(".weight"):
                shape = shape[:-1] + (shape[-1] * 32 // _bits(cfg, stem),)  # packed uint32 -> values
            shapes.setdefault(stacked_name(name), []).append(shape)
    weights = []
    for name, found in shapes.items():
        shape = found[0] if len(found) == 1 else (len(found), *found[0])  # experts stored one by one
        # stacked: one by one, or under switch_mlp or experts. (mlx-lm's gpt_oss: its biases one row an expert)
        stacked = len(shape) in (2, 3) and shape[0] == cfg.num_experts
        stacked = stacked and (len(shape) == 3 and len(found) > 1 or any(s in name for s in _STACKS))
        part, formula = _part(name), " x ".join(f"{d:,}" for d in shape)
        weights.append(Weight(name, shape, part, _label(name), formula, cfg.num_experts if stacked else 0))
    return weights


def expert_layers(weights: list[Weight]) -> tuple[int, ...]:
    """The layers whose headers hold stacked experts (config.json's num_experts of them)."""
    return tuple(sorted({w.layer for w in weights if w.experts and w.layer is not None}))


def _bits(cfg: ModelConfig, module: str) -> int:
    q = cfg.quantization or {}
    over = q.get(module)
    bits = over.get("bits") if isinstance(over, dict) else q.get("bits")
    if not bits:
        raise MlxinferError(f"{module} is stored quantized but config.json has no 'quantization' block to say its bits")
    return int(bits)


def _part(name: str) -> str:
    if name.startswith("lm_head."):
        return "output"
    m = _LAYER.match(name)
    if m is None:
        if "embed" in name:
            return "embedding"
        return "final_norm" if "norm" in name else "other"
    inside = name[m.end() :].split(".")
    if inside[0] in ATTENTION:
        return "attention"
    return "norms" if inside[-2].endswith("norm") else "mlp"


def _label(name: str) -> str:
    m = _LAYER.match(name)
    return name[m.end() :].removesuffix(".weight") if m else name.removesuffix(".weight")
