"""Read tensors, give them our names, and build the model with bf16 or quantized modules.

Sources: safetensors in Hugging Face layout (bf16/f16/f32, or MLX affine-quantized
as mlx-community writes them), and GGUF files (F32/F16/BF16/Q4_0/Q4_1/Q8_0, which
`mx.load` hands over as MLX affine weights with group size 32). Never pickle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .config import ModelConfig
from .errors import MlxinferError
from .gguf import LOADABLE, GGUFHeader
from .model import Model

QUANT_PARTS = ("scales", "biases")
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|rope\.freqs)$")

# Hugging Face module names -> ours (the forward pass reads like the lesson)
_HF_RENAMES = [
    (re.compile(r"^model\."), ""),
    (re.compile(r"\.self_attn(?=\.|$)"), ".attn"),
    (re.compile(r"\.input_layernorm(?=\.|$)"), ".attn_norm"),
    (re.compile(r"\.post_attention_layernorm(?=\.|$)"), ".mlp_norm"),
]
_GGUF_RENAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
    "attn_q": "attn.q_proj",
    "attn_k": "attn.k_proj",
    "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj",
    "attn_q_norm": "attn.q_norm",
    "attn_k_norm": "attn.k_norm",
    "attn_norm": "attn_norm",
    "ffn_norm": "mlp_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_to_ours(name: str) -> str:
    for pattern, repl in _HF_RENAMES:
        name = pattern.sub(repl, name)
    return name


def gguf_to_ours(name: str) -> str:
    m = re.match(r"^blk\.(\d+)\.(\w+)\.(\w+)$", name)
    if m:
        layer, module, part = m.groups()
        if module in _GGUF_RENAMES:
            return f"layers.{layer}.{_GGUF_RENAMES[module]}.{part}"
    else:
        module, _, part = name.partition(".")
        if module in _GGUF_RENAMES:
            return f"{_GGUF_RENAMES[module]}.{part}"
    raise MlxinferError(f"GGUF tensor '{name}' has no place in a supported model; the file is not a plain decoder")


def read_safetensors(directory: Path) -> dict[str, mx.array]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise MlxinferError(f"{index} is not a valid safetensors index ({e}); re-download it") from None
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise MlxinferError(f"no *.safetensors weights in {directory}; download the model's weights")
    weights = {}
    for name in files:
        path = directory / name
        if not path.exists():
            raise MlxinferError(f"{path} is listed in the index but missing; re-download the model")
        try:
            weights.update(mx.load(str(path)))
        except Exception as e:  # mlx raises RuntimeError/ValueError for a bad header or short file
            raise MlxinferError(f"{path} is not a readable safetensors file ({e}); re-download it") from None
    return {hf_to_ours(k): v for k, v in weights.items() if not _IGNORED.search(k)}


def read_gguf(header: GGUFHeader, cfg: ModelConfig) -> dict[str, mx.array]:
    bad = sorted({t.type_name for t in header.tensors} - LOADABLE)
    if bad:
        raise MlxinferError(
            f"{header.path} uses GGUF tensor types {', '.join(bad)}; this loader reads "
            f"{', '.join(sorted(LOADABLE))} (re-quantize with one of those)"
        )
    try:
        raw = mx.load(str(header.path))
    except Exception as e:
        raise MlxinferError(f"{header.path} could not be read as GGUF ({e}); re-download it") from None
    weights = {gguf_to_ours(k): v for k, v in raw.items() if not _IGNORED.search(k)}
    if cfg.model_type == "llama":
        # llama.cpp stores q/k rows permuted for interleaved RoPE; undo it for our half-split RoPE
        for i in range(cfg.num_hidden_layers):
            for proj, heads in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.num_key_value_heads)):
                for part in ("weight", *QUANT_PARTS, "bias"):
                    key = f"layers.{i}.attn.{proj}.{part}"
                    if key in weights:
                        weights[key] = unpermute_rows(weights[key], heads)
    return weights


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Rows of each head go from (pairs, 2) order back to (2, pairs) order; exact for packed rows too."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def quantization_of(weights: dict[str, mx.array], path: str, in_features: int, cfg: ModelConfig):
    """(group_size, bits) for one module, from the config block or the tensors' shapes; None if float."""
    if f"{path}.scales" not in weights:
        return None
    packed, scales = weights[f"{path}.weight"], weights[f"{path}.scales"]
    inferred = (in_features // scales.shape[-1], packed.shape[-1] * 32 // in_features)
    block = cfg.quantization or {}
    override = block.get(ours_to_hf(path), block.get(path))
    if isinstance(override, dict):
        declared = (override["group_size"], override["bits"])
    elif "bits" in block:
        declared = (block["group_size"], block["bits"])
    else:
        return inferred
    if declared != inferred:
        raise MlxinferError(
            f"{path}: config.json declares {declared[1]}-bit group {declared[0]} but the tensors are "
            f"{inferred[1]}-bit group {inferred[0]}; the config and weights do not belong together"
        )
    return declared


def ours_to_hf(name: str) -> str:
    """Our module or tensor name -> the Hugging Face one (mlx-lm and config.json overrides use these)."""
    if name.startswith("lm_head"):
        return name
    for pattern, repl in ((r"\.attn(?=\.|$)", ".self_attn"), (r"\.attn_norm(?=\.|$)", ".input_layernorm"),
                          (r"\.mlp_norm(?=\.|$)", ".post_attention_layernorm")):
        name = re.sub(pattern, repl, name)
    return f"model.{name}"


def build_model(cfg: ModelConfig, weights: dict[str, mx.array], where: str) -> Model:
    """A Model whose quantized modules match the tensors, filled and checked against the config."""
    if cfg.tie_word_embeddings:
        for part in ("weight", *QUANT_PARTS):
            weights.pop(f"lm_head.{part}", None)  # some checkpoints store the tied table twice
    elif "lm_head.weight" not in weights and not cfg.tie_word_embeddings_given:
        cfg = _with(cfg, tie_word_embeddings=True)  # config.json was silent and there is no output table
    model = Model(cfg)

    def predicate(path: str, module: nn.Module):
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            return False
        q = quantization_of(weights, path, module.weight.shape[1], cfg)
        return False if q is None else {"group_size": q[0], "bits": q[1]}

    nn.quantize(model, class_predicate=predicate)
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise MlxinferError(
            f"{where} lacks {len(missing)} tensor(s) the config needs, e.g. '{missing[0]}'; "
            "the weights are incomplete or belong to another model"
        )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise MlxinferError(
            f"{where} has tensor(s) the config does not describe, e.g. '{extra[0]}'; check config.json"
        )
    for name, param in expected.items():
        if weights[name].shape != param.shape:
            raise MlxinferError(
                f"{where}: tensor '{name}' has shape {tuple(weights[name].shape)} but config.json implies "
                f"{tuple(param.shape)}; the config and weights do not belong together"
            )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def _with(cfg: ModelConfig, **changes) -> ModelConfig:
    from dataclasses import replace

    return replace(cfg, **changes)
