"""The model's shape, read from config.json (or GGUF metadata).

No mlx import here: `count` reads configs without loading a framework.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MlxinferError


@dataclass(frozen=True)
class Architecture:
    """What an architecture adds to the plain Llama block. The model definition (model.py) and
    `count` (counting.py) both read these, through ModelConfig, so they cannot drift apart.
    None: as config.json's `attention_bias` says (Hugging Face's rule for that family)."""

    qkv_bias: bool | None  # q/k/v projections carry biases
    o_bias: bool | None  # the attention's output projection carries a bias
    qk_norm: bool  # an RMSNorm over each query and key head before RoPE
    context: int  # max_position_embeddings when config.json does not say


ARCHITECTURES = {
    "llama": Architecture(qkv_bias=None, o_bias=None, qk_norm=False, context=2048),
    "qwen2": Architecture(qkv_bias=True, o_bias=False, qk_norm=False, context=32768),
    "qwen3": Architecture(qkv_bias=None, o_bias=None, qk_norm=True, context=32768),
}
SUPPORTED = tuple(ARCHITECTURES)

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
KNOWN_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Far beyond any released model, and checked before anything is built from a config: a size read from a
# file must not make a loop or an allocation without end (the loader then checks each against the tensors)
LIMITS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 14,
    "num_key_value_heads": 1 << 14,
    "head_dim": 1 << 16,
    "max_position_embeddings": 1 << 40,
}
QUANT_BITS, QUANT_GROUPS = (1, 2, 3, 4, 5, 6, 8), (32, 64, 128)  # what mx.quantize takes


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    tie_word_embeddings_given: bool = True  # False: config.json was silent, the weights decide
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry biases (see Architecture)
    o_bias: bool = False
    mlp_bias: bool = False  # Llama's mlp_bias: gate/up/down carry biases
    qk_norm: bool = False  # Qwen3: RMSNorm on each query/key head before RoPE
    dtype: str = "float32"  # the checkpoint's stored float type
    quantization: dict | None = None  # MLX affine block: bits, group_size, per-module overrides
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        d.pop("tie_word_embeddings_given")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config.json") -> "ModelConfig":
        if not isinstance(d, dict):
            raise MlxinferError(f"{where} is not a JSON object; point at a model's config.json")
        model_type = d.get("model_type")
        if model_type is None:
            raise MlxinferError(f"{where} has no 'model_type'; add one of: {', '.join(SUPPORTED)}")
        if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
            raise MlxinferError(f"unknown architecture '{model_type}' in {where}; supported: {', '.join(SUPPORTED)}")
        arch = ARCHITECTURES[model_type]
        for name in REQUIRED:
            if name not in d:
                raise MlxinferError(f"{where} is missing the field '{name}' that {model_type} needs; add it")
        ints = {name: _positive_int(d, name, where) for name in REQUIRED}
        heads = ints["num_attention_heads"]
        kv_heads = _positive_int(d, "num_key_value_heads", where) if d.get("num_key_value_heads") else heads
        if heads % kv_heads:
            raise MlxinferError(
                f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        if d.get("head_dim"):
            head_dim = _positive_int(d, "head_dim", where)
        else:
            if ints["hidden_size"] % heads:
                raise MlxinferError(
                    f"{where}: hidden_size {ints['hidden_size']} is not divisible by num_attention_heads {heads};"
                    " add an explicit head_dim"
                )
            head_dim = ints["hidden_size"] // heads
        dtype = d.get("torch_dtype") or d.get("dtype") or "float32"
        if not isinstance(dtype, str) or dtype not in KNOWN_DTYPES:
            raise MlxinferError(f"{where}: unsupported dtype '{dtype}'; use one of {', '.join(KNOWN_DTYPES)}")
        quant = d.get("quantization")
        if quant is None and isinstance(d.get("quantization_config"), dict) and "bits" in d["quantization_config"]:
            quant = d["quantization_config"]  # the copy mlx-lm writes for transformers
        if quant is not None:
            _check_quantization(quant, where)
        attention_bias = bool(d.get("attention_bias", False))
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is not None:
            _check_rope_scaling(rope_scaling, where)
        return cls(
            model_type=model_type,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_number(d, "rms_norm_eps", 1e-6, where, 0.0, 1.0),
            rope_theta=_number(d, "rope_theta", 10000.0, where, 0.0, 1e30),
            rope_scaling=rope_scaling,
            max_position_embeddings=_positive_int(
                {"max_position_embeddings": d.get("max_position_embeddings") or arch.context},
                "max_position_embeddings",
                where,
            ),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            tie_word_embeddings_given="tie_word_embeddings" in d,
            qkv_bias=attention_bias if arch.qkv_bias is None else arch.qkv_bias,
            o_bias=attention_bias if arch.o_bias is None else arch.o_bias,
            mlp_bias=bool(d.get("mlp_bias", False)) and model_type == "llama",
            qk_norm=arch.qk_norm,
            dtype=dtype,
            quantization=quant,
            raw=dict(d),
            **ints,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise MlxinferError(f"no config.json at {path.parent}; point at a model directory that has one")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise MlxinferError(f"{path} is not valid JSON ({e.__class__.__name__}: {e}); re-download it") from None
        except OSError as e:
            raise MlxinferError(f"{path} cannot be read ({e.strerror or e}); check the path") from None
        return cls.from_dict(data, where=str(path))


def _positive_int(d: dict, name: str, where: str) -> int:
    value, limit = d[name], LIMITS.get(name, 1 << 40)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise MlxinferError(f"{where}: '{name}' must be a positive integer up to {limit:,}, got {_short(value)}")
    return value


def _number(d: dict, name: str, default: float, where: str, low: float, high: float) -> float:
    """A finite number in (low, high], or the default when absent."""
    value = d.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (low < value <= high and math.isfinite(value))
    ):
        raise MlxinferError(f"{where}: '{name}' must be a number in ({low:g}, {high:g}], got {_short(value)}")
    return float(value)


def _check_quantization(quant, where: str) -> None:
    """MLX's block: global bits and group_size, then per-module overrides (a dict of both, or true/false)."""
    bad = f"{where}: 'quantization' needs 'bits' in {QUANT_BITS} and 'group_size' in {QUANT_GROUPS}"
    if not isinstance(quant, dict):
        raise MlxinferError(bad)
    for key, value in [("", quant), *((k, v) for k, v in quant.items() if isinstance(v, dict))]:
        if value.get("bits") not in QUANT_BITS or value.get("group_size") not in QUANT_GROUPS:
            raise MlxinferError(f"{bad}{f' (for {key!r})' if key else ''}")
    for key in ("bits", "group_size"):
        if isinstance(quant[key], bool):
            raise MlxinferError(bad)


def _check_rope_scaling(scaling, where: str) -> None:
    if not isinstance(scaling, dict):
        raise MlxinferError(f"{where}: rope_scaling must be an object (or null), got {_short(scaling)}")
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind not in ("default", "linear", "llama3"):
        raise MlxinferError(
            f"{where}: rope_scaling type {_short(kind)} is not supported; supported: default, linear, llama3"
        )
    if kind == "default":
        return
    d = {"factor": scaling.get("factor")}
    _number(d, "factor", None, f"{where}: rope_scaling", 0.0, 1e6)
    if kind == "llama3":
        low = _number(scaling, "low_freq_factor", 1.0, f"{where}: rope_scaling", 0.0, 1e6)
        _number(scaling, "high_freq_factor", 4.0, f"{where}: rope_scaling", low, 1e6)
        _number(scaling, "original_max_position_embeddings", 8192, f"{where}: rope_scaling", 0.0, 1 << 40)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
