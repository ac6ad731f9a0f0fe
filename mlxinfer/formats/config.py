"""The model's shape, read from config.json (or GGUF metadata), checked against its model type's
Architecture (architectures.py); a type described nowhere here gets a lenient config instead, for
mlx-lm's class to run and `count` to count from the file headers.

No mlx import here: `count` reads configs without loading a framework.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MlxinferError, is_whole
from .architectures import ARCHITECTURES, Architecture
from .paths import read_json_file

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
KNOWN_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}
SUPPORTED = tuple(ARCHITECTURES)
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
QUANT_MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")
FIX = "fix config.json"  # what a message about a wrong value ends with (a GGUF file passes its own)


class _WrongValue(MlxinferError):
    """A value the config gives wrongly, named with the key and the value; from_dict adds the fix, which
    depends on where the config came from (config.json, or a GGUF file's metadata)."""


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
    # a mixture of experts (0 experts: dense): each token's MLP is k of n expert MLPs, picked by a router
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # one expert's MLP width
    norm_topk_prob: bool = False  # the k chosen experts' weights rescaled to sum to 1
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is the mixture; the others are dense
    described: bool = True  # False: no Architecture for it here (mlx-lm's class runs it; count reads headers)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def architecture(self) -> Architecture | None:
        return ARCHITECTURES.get(self.model_type)

    @property
    def foreign_quantization(self) -> str | None:
        """quantization_config's quant_method (GPTQ, AWQ, fp8, bitsandbytes...) where the weights are
        quantized in a layout other than MLX's; None for float or MLX weights."""
        q = self.raw.get("quantization_config")
        method = q.get("quant_method") if isinstance(q, dict) and self.quantization is None else None
        return str(method)[:40] if method is not None else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        d.pop("tie_word_embeddings_given")
        d["moe_layers"] = list(self.moe_layers)
        return d

    @classmethod
    def from_dict(
        cls, d: dict[str, Any], where: str = "config.json", undescribed: bool = False, fix: str = FIX
    ) -> "ModelConfig":
        """A config.json read and checked against its Architecture. undescribed=True: a model_type
        with no Architecture here gives a lenient config (the fields the engine reads, 0 where
        missing) instead of an error; the caller decides what can run it. fix: what a message about
        a wrong value ends with."""
        try:
            return cls._checked(d, where, undescribed)
        except _WrongValue as e:
            raise MlxinferError(f"{e}; {fix}", *e.params) from None

    @classmethod
    def _checked(cls, d: dict[str, Any], where: str, undescribed: bool) -> "ModelConfig":
        if not isinstance(d, dict):
            raise MlxinferError(f"{where} is not a JSON object; point at a model's config.json")
        model_type = d.get("model_type")
        if model_type is None:
            raise MlxinferError(f"{where} has no 'model_type'; add one of: {', '.join(SUPPORTED)}")
        if not isinstance(model_type, str):
            raise _WrongValue(
                f"{where}: 'model_type' must be a string naming the architecture, got {_short(model_type)}"
            )
        if model_type not in ARCHITECTURES:
            if undescribed:
                return cls._undescribed(d, where)
            raise MlxinferError(
                f"unknown architecture {_short(model_type)} in {where}; supported: {', '.join(SUPPORTED)}"
            )
        arch = ARCHITECTURES[model_type]
        for name in REQUIRED:
            if name not in d:
                raise MlxinferError(f"{where} is missing the field '{name}' that {model_type} needs; add it")
        ints = {name: _positive_int(d, name, where) for name in REQUIRED}
        heads = ints["num_attention_heads"]
        kv_heads = _positive_int(d, "num_key_value_heads", where) if d.get("num_key_value_heads") is not None else heads
        if heads % kv_heads:
            raise _WrongValue(
                f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        if d.get("head_dim") is not None and arch.config_head_dim:  # 0 is an error, not unset
            head_dim = _positive_int(d, "head_dim", where)
        elif arch.head_dim is not None:
            head_dim = arch.head_dim
        else:
            if ints["hidden_size"] % heads:
                raise MlxinferError(
                    f"{where}: hidden_size {ints['hidden_size']} is not divisible by num_attention_heads {heads};"
                    " add an explicit head_dim"
                )
            head_dim = ints["hidden_size"] // heads
        attention_bias = _flag(d, "attention_bias", False, where)
        # unset or null: the architecture's; 0 is an error
        context = (
            _positive_int(d, "max_position_embeddings", where)
            if d.get("max_position_embeddings") is not None
            else arch.context
        )
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is not None and arch.ours:  # mlx-lm's classes read their own kinds (yarn, ...)
            _check_rope_scaling(rope_scaling, where)
        return cls(
            model_type=model_type,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_number(d, "rms_norm_eps", 1e-6, where, 0.0, 1.0),
            rope_theta=_number(d, "rope_theta", 10000.0, where, 0.0, 1e30),
            rope_scaling=rope_scaling,
            max_position_embeddings=context,
            tie_word_embeddings=_flag(d, "tie_word_embeddings", arch.tied, where),
            tie_word_embeddings_given="tie_word_embeddings" in d,
            qkv_bias=attention_bias if arch.qkv_bias is None else arch.qkv_bias,
            o_bias=attention_bias if arch.o_bias is None else arch.o_bias,
            mlp_bias=_flag(d, "mlp_bias", False, where) if arch.mlp_bias is None else arch.mlp_bias,
            qk_norm=arch.qk_norm,
            dtype=_dtype(d, where),
            quantization=_quantization(d, where),
            raw=dict(d),
            **_experts(d, arch, ints["num_hidden_layers"], where),
            **ints,
        )

    @classmethod
    def _undescribed(cls, d: dict, where: str) -> "ModelConfig":
        text = d.get("text_config") if isinstance(d.get("text_config"), dict) else {}

        def number(name: str) -> int:
            v = d.get(name, text.get(name))
            return v if is_whole(v) and 0 < v <= LIMITS.get(name, 1 << 40) else 0

        heads = number("num_attention_heads")
        n = number("num_experts") or number("num_local_experts") or number("n_routed_experts")
        k = number("num_experts_per_tok")
        experts = {"num_experts": n, "num_experts_per_tok": k, "moe_intermediate_size": number("moe_intermediate_size")}
        if not 0 < k <= n:  # the layers with experts are found in the headers (counting/headers.py)
            experts = {}
        return cls(
            model_type=d["model_type"],
            vocab_size=number("vocab_size"),
            hidden_size=number("hidden_size"),
            intermediate_size=number("intermediate_size"),
            num_hidden_layers=number("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=number("num_key_value_heads") or heads,
            head_dim=number("head_dim") or (number("hidden_size") // heads if heads else 0),
            max_position_embeddings=number("max_position_embeddings") or 4096,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            tie_word_embeddings_given="tie_word_embeddings" in d or "tie_word_embeddings" in text,
            dtype=_dtype(d, where),
            quantization=_quantization(d, where),
            described=False,
            **experts,
            raw=dict(d),
        )

    @classmethod
    def from_file(cls, path: str | Path, undescribed: bool = False) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise MlxinferError(f"no config.json at {path.parent}; point at a model directory that has one")
        data = read_json_file(path, "config.json")
        return cls.from_dict(data, where=str(path), undescribed=undescribed)


def _experts(d: dict, arch: Architecture, layers: int, where: str) -> dict:
    """The mixture-of-experts fields, for an architecture that has one."""
    if not arch.moe:
        return {}
    for name in (arch.experts, "num_experts_per_tok", arch.expert_width):
        if name not in d:
            raise MlxinferError(f"{where} is missing the field '{name}' that {d['model_type']} needs; add it")
    n, k = _positive_int(d, arch.experts, where), _positive_int(d, "num_experts_per_tok", where)
    if k > n:
        raise _WrongValue(f"{where}: num_experts_per_tok {k} is more than the {n} experts ({arch.experts})")
    step = _positive_int(d, "decoder_sparse_step", where) if d.get("decoder_sparse_step") else 1
    dense = d.get("mlp_only_layers") or []  # qwen3_moe: every step-th layer is sparse, except these
    if not isinstance(dense, list) or not all(is_whole(i) for i in dense):
        raise _WrongValue(f"{where}: 'mlp_only_layers' must be a list of layer numbers, got {_short(dense)}")
    dense = set(dense)
    return {
        "num_experts": n,
        "num_experts_per_tok": k,
        "moe_intermediate_size": _positive_int(d, arch.expert_width, where),
        "norm_topk_prob": bool(d.get("norm_topk_prob", False)),
        "moe_layers": tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
    }


def _dtype(d: dict, where: str) -> str:
    dtype = d.get("torch_dtype") or d.get("dtype") or "float32"
    if not isinstance(dtype, str) or dtype not in KNOWN_DTYPES:
        raise MlxinferError(f"{where}: unsupported dtype {_short(dtype)}; use one of {', '.join(KNOWN_DTYPES)}")
    return dtype


def _quantization(d: dict, where: str) -> dict | None:
    quant = d.get("quantization")
    mlx_copy = isinstance(d.get("quantization_config"), dict) and "quant_method" not in d["quantization_config"]
    if quant is None and mlx_copy and "bits" in d["quantization_config"]:
        quant = d["quantization_config"]  # the copy mlx-lm writes for transformers (GPTQ's and AWQ's name a method)
    if quant is not None:
        _check_quantization(quant, where)
    return quant


def _positive_int(d: dict, name: str, where: str) -> int:
    value, limit = d[name], LIMITS.get(name, 1 << 40)
    if not is_whole(value) or not 0 < value <= limit:
        raise _WrongValue(f"{where}: '{name}' must be a positive integer up to {limit:,}, got {_short(value)}")
    return value


def _flag(d: dict, name: str, default: bool, where: str) -> bool:
    """true or false (0 and 1 too), or the default when absent or null; a string such as "false" is refused,
    where bool() would read it as true."""
    value = d.get(name)
    if value is None:
        return default
    if value not in (True, False) or not isinstance(value, (bool, int)):
        raise _WrongValue(f"{where}: '{name}' must be true or false, got {_short(value)}")
    return bool(value)


def _number(d: dict, name: str, default: float, where: str, low: float, high: float) -> float:
    """A finite number in (low, high], or the default when absent."""
    value = d.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (low < value <= high and math.isfinite(value))
    ):
        raise _WrongValue(f"{where}: '{name}' must be a number in ({low:g}, {high:g}], got {_short(value)}")
    return float(value)


def quantization_blocks(quant: dict) -> list[tuple[str, dict]]:
    """MLX's quantization block as ("", the global entry) and (module path, its override) for each
    per-module override that is a dict."""
    return [("", quant), *((k, v) for k, v in quant.items() if isinstance(v, dict))]


def _check_quantization(quant, where: str) -> None:
    """MLX's block: global bits and group_size, then per-module overrides (a dict of both, or true/false)."""
    need = f"{where}: 'quantization' needs 'bits' in {QUANT_BITS} and 'group_size' in {QUANT_GROUPS}"
    if not isinstance(quant, dict):
        raise _WrongValue(f"{need}, got {_short(quant)}")
    for key, value in quantization_blocks(quant):
        groups = (16, *QUANT_GROUPS) if value.get("mode", quant.get("mode")) == "nvfp4" else QUANT_GROUPS  # 16: nvfp4's
        if value.get("bits") not in QUANT_BITS or value.get("group_size") not in groups:
            raise _WrongValue(f"{need}{f' (for {key!r})' if key else ''}, got {_short(value)}")
    for key in ("bits", "group_size"):
        if isinstance(quant[key], bool):
            raise _WrongValue(f"{need}, got {_short(quant)}")
    for key, value in quantization_blocks(quant):
        if value.get("mode", "affine") not in QUANT_MODES:
            raise _WrongValue(
                f"{where}: 'quantization' mode {_short(value.get('mode'))}{f' (for {key!r})' if key else ''} is "
                f"not one of MLX's: {', '.join(QUANT_MODES)}"
            )


def _check_rope_scaling(scaling, where: str) -> None:
    if not isinstance(scaling, dict):
        raise _WrongValue(f"{where}: rope_scaling must be an object (or null), got {_short(scaling)}")
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
