"""Read tensors and build the model with bf16 or quantized modules, by Hugging Face names.

Sources: safetensors in Hugging Face layout (bf16/f16/f32, or MLX affine-quantized as
mlx-community writes them), and GGUF files: F32/F16/BF16/Q4_0/Q4_1/Q8_0, which `mx.load`
hands over as MLX affine weights with group size 32, and K-quants, i-quants and the rest
through gguf_tensors.py (exact MLX affine weights where the block allows, else re-fit to
8 bits); their names are mapped to Hugging Face's here. Never pickle.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import MlxinferError
from ..formats import safetensors
from ..formats.config import QUANT_BITS, QUANT_GROUPS, ModelConfig
from ..formats.gguf import MX_LOAD_TYPES, GGUFHeader, gguf_to_hf
from . import gguf_tensors

QUANT_PARTS = ("scales", "biases")
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|rope\.freqs|^rope_freqs\.weight)$")  # GGUF's: gguf_rope.py reads it
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")


def read_safetensors(directory: Path) -> dict[str, mx.array]:
    files = safetensors.shard_names(directory)
    if not files:
        ggufs = sorted(Path(directory).glob("*.gguf"))
        hint = f", or load {ggufs[0]} itself (a .gguf names its own config)" if ggufs else ""
        raise MlxinferError(f"no *.safetensors weights in {directory}; download the model's weights{hint}", "source")
    weights = {}
    for name in files:
        path = directory / name
        safetensors.read_header(path)  # every offset, dtype and size checked against the file first
        try:
            weights.update(mx.load(str(path)))
        except Exception as e:  # mlx raises RuntimeError/ValueError for a bad header or short file
            if "unsupported dtype" in str(e):  # a well-formed file MLX cannot load (F64, ...)
                raise MlxinferError(
                    f"{path} holds a tensor type MLX cannot load ({e}); convert the weights to float32, "
                    "float16 or bfloat16",
                    "source",
                ) from None
            raise MlxinferError(f"{path} is not a readable safetensors file ({e}); re-download it", "source") from None
    return {k: v for k, v in weights.items() if not _IGNORED.search(k)}


def read_gguf(header: GGUFHeader, cfg: ModelConfig, dequantize: bool = False) -> dict[str, mx.array]:
    """The file's tensors by Hugging Face names: `mx.load` for a file of its types, else gguf_tensors.py
    (K-quants, i-quants, ...: its rule); `dequantize`: every tensor as gguf-py's float32 values."""
    for t in header.tensors:  # every name placed before a byte is read
        if not _IGNORED.search(t.name):
            gguf_to_hf(t.name)
    if dequantize or header.float64_keys or not {t.type_name for t in header.tensors} <= MX_LOAD_TYPES:
        # (MLX 0.32's GGUF reader dies with SIGSEGV on a FLOAT64 metadata value: such files come this way too)
        names = {t.name for t in header.tensors if not _IGNORED.search(t.name)}
        raw = {}
        for name, parts in gguf_tensors.read(header, names, dequantize).items():
            for part, value in parts.items():
                raw[name if part == "weight" else f"{name.rsplit('.', 1)[0]}.{part}"] = _mx(value)
    else:
        try:
            raw = mx.load(str(header.path))
        except Exception as e:
            raise MlxinferError(f"{header.path} could not be read as GGUF ({e}); re-download it", "source") from None
    weights = {gguf_to_hf(k): v for k, v in raw.items() if not _IGNORED.search(k)}
    if cfg.architecture.gguf_permuted_qk:
        # llama.cpp stored q/k rows permuted for interleaved RoPE; undo it for our half-split RoPE
        for i in range(cfg.num_hidden_layers):
            for proj, heads in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.num_key_value_heads)):
                for part in ("weight", *QUANT_PARTS, "bias"):
                    key = f"model.layers.{i}.self_attn.{proj}.{part}"
                    if key in weights:
                        if weights[key].shape[0] % (2 * heads):
                            raise MlxinferError(
                                f"{header.path}: tensor '{key}' has {weights[key].shape[0]:,} rows, which "
                                f"{heads} heads cannot share; the file is corrupt or not a {cfg.model_type}",
                                "source",
                            )
                        weights[key] = unpermute_rows(weights[key], heads)
    return weights


def _mx(value) -> mx.array:
    """A numpy tensor from gguf_tensors.py in MLX (a BF16 tensor's uint16 bits viewed as bfloat16)."""
    import numpy as np

    return mx.array(value).view(mx.bfloat16) if value.dtype == np.uint16 else mx.array(value)


def _not_theirs(where: str) -> str:
    """What to do when the config and the tensors disagree (a GGUF file holds both)."""
    if where.lower().endswith(".gguf"):
        return "the file's metadata and tensors disagree: re-download or re-convert it"
    return "the config and weights do not belong together: use the config.json that came with these weights"


def layers_present(weights: dict) -> set[int]:
    """The layer numbers the tensor names hold (model.layers.3.*, h.3.*, blocks.3.*)."""
    return {int(m.group(1)) for name in weights if (m := _LAYER.search(name))}


def check_layers(cfg: ModelConfig, weights: dict, where: str) -> None:
    """The config's layer count against the layers the weights hold, before a layer is built."""
    present = layers_present(weights)
    n = cfg.num_hidden_layers
    if n > len(present) or any(i not in present for i in range(n)):
        raise MlxinferError(
            f"{where}: the config says {n:,} layers but the weights hold {len(present):,}; {_not_theirs(where)}",
            "source",
        )


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Rows of each head go from (pairs, 2) order back to (2, pairs) order; exact for packed rows too."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def quantization_of(weights: dict[str, mx.array], path: str, in_features: int, block: dict | None, where: str = ""):
    """(group_size, bits) for one module, from the config block or the tensors' shapes; None if float.
    `where`: the file or folder they came from, for the error."""
    if f"{path}.scales" not in weights or f"{path}.weight" not in weights:
        return None  # fill() names what is missing
    packed, scales = weights[f"{path}.weight"], weights[f"{path}.scales"]
    biases = weights.get(f"{path}.biases", scales)
    groups, words = (scales.shape[-1] if scales.ndim else 0), (packed.shape[-1] if packed.ndim else 0)
    inferred = (in_features // groups if groups else 0, words * 32 // in_features)
    if (
        packed.dtype != mx.uint32
        or scales.shape[:-1] != packed.shape[:-1]
        or biases.shape != scales.shape
        or groups * inferred[0] != in_features
        or inferred[1] * in_features != words * 32
        or inferred[0] not in QUANT_GROUPS
        or inferred[1] not in QUANT_BITS
    ):
        raise MlxinferError(
            f"{where + ': ' if where else ''}{path}: the quantized tensors (weight {tuple(packed.shape)} "
            f"{packed.dtype}, scales {tuple(scales.shape)}) are no MLX layout for the {in_features:,} inputs the "
            f"config implies; {_not_theirs(where)}",
            "source",
        )
    block = block or {}
    override = block.get(path)
    if isinstance(override, dict):
        declared = (override["group_size"], override["bits"])
    elif "bits" in block:
        declared = (block["group_size"], block["bits"])
    else:
        return inferred
    if declared != inferred:
        raise MlxinferError(
            f"{path}: config.json declares {declared[1]}-bit group {declared[0]} but the tensors are "
            f"{inferred[1]}-bit group {inferred[0]}; {_not_theirs('config.json')}",
            "source",
        )
    return declared


def quantize_like(model: nn.Module, weights: dict[str, mx.array], block: dict | None, where: str = "") -> None:
    """Swap in quantized modules wherever the tensors have scales, with their bits and group size (`where`:
    the file or folder they came from, for an error)."""

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or "weight" not in module:
            return False
        q = quantization_of(weights, path, module.weight.shape[-1], block, where)
        return False if q is None else {"group_size": q[0], "bits": q[1]}

    nn.quantize(model, class_predicate=predicate)


def fill(model: nn.Module, weights: dict[str, mx.array], where: str, evaluate: bool = True) -> None:
    """Load `weights` into `model`, every tensor present and of the shape the config implies; evaluated
    unless `evaluate=False` (a sharded load slices the lazy tensors first and reads only its share)."""
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise MlxinferError(
            f"{where} lacks {len(missing)} tensor(s) the config needs, e.g. '{missing[0]}'; "
            "the weights are incomplete or belong to another model",
            "source",
        )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise MlxinferError(
            f"{where} has tensor(s) the model's config does not describe, e.g. '{extra[0]}'; "
            + ("check the file's metadata" if str(where).endswith(".gguf") else "check config.json"),
            "source",
        )
    for name, param in expected.items():
        if weights[name].shape != param.shape:
            got, want = (_values_shape(model, name, shape) for shape in (weights[name].shape, param.shape))
            raise MlxinferError(
                f"{where}: tensor '{name}' has shape {got} but the model's config implies {want}; {_not_theirs(where)}",
                "source",
            )
        got, floating = weights[name].dtype, mx.issubdtype(param.dtype, mx.floating)
        if floating != mx.issubdtype(got, mx.floating) or (not floating and got != param.dtype):
            kind = "floating-point numbers" if floating else f"packed codes ({_dtype_name(param.dtype)})"
            raise MlxinferError(  # was: integers read as weights (garbage scores), or an assertion mid-conversion
                f"{where}: tensor '{name}' is stored as {_dtype_name(got)}, where the model reads {kind}; "
                f"{_not_theirs(where)}",
                "source",
            )
    model.load_weights(list(weights.items()), strict=True)
    if evaluate:
        mx.eval(model.parameters())


def _values_shape(model: nn.Module, name: str, shape) -> tuple:
    """A tensor's shape as values: a quantized module's packed uint32 columns unpacked (32 // bits each)."""
    stem, _, leaf = name.rpartition(".")
    bits = getattr(dict(model.named_modules()).get(stem), "bits", None) if leaf == "weight" else None
    return (*shape[:-1], shape[-1] * 32 // bits) if bits and shape else tuple(shape)


def untie(cfg: ModelConfig, weights: dict[str, mx.array]) -> ModelConfig:
    """Drop a tied table stored twice; a config silent on tying is decided by the tensors present."""
    from dataclasses import replace

    if cfg.tie_word_embeddings:
        for part in ("weight", *QUANT_PARTS):
            weights.pop(f"lm_head.{part}", None)  # some checkpoints store the tied table twice
    elif "lm_head.weight" not in weights and not cfg.tie_word_embeddings_given:
        cfg = replace(cfg, tie_word_embeddings=True)  # config.json was silent and there is no output table
    return cfg


def _dtype_name(dtype) -> str:
    return str(dtype).rpartition(".")[2]  # mlx.core.int16 -> int16
