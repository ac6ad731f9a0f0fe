"""`load(source) -> (model, tokenizer)`, like `mlx_lm.load`, for every source kind."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MlxinferError
from ..formats import gguf, sources
from ..formats.config import ModelConfig
from ..tokenizer import load_tokenizer, tokenizer_from_gguf
from . import compute
from .info import ModelInfo
from .model import Model
from .weights import check_layers, fill, quantize_like, read_gguf, read_safetensors, untie


def load(source: str | Path | None = None, compute_dtype: str = "auto"):
    """Load a model and its tokenizer: a local directory, a .gguf, a hub repo id, or None (or
    "embedded") for the embedded model.

    compute_dtype: "bfloat16" keeps the weights as stored (quantized stays quantized, like
    mlx_lm.load); "float32" dequantizes/upcasts them once so every matmul goes through BLAS;
    "auto" picks float32 on a CPU with a fast BLAS when it fits in memory (see compute.py).
    The model's `info` (a ModelInfo) says where it came from, which definition runs it, its
    generation_config.json and how its weights are held.
    """
    compute.check_compute_dtype(compute_dtype)  # an unknown choice fails before any file is read
    src = sources.resolve(source)
    if src.kind == "config":
        raise MlxinferError(
            f"{src.path} is a config file alone; point at the model directory that holds it with its weights", "source"
        )
    if src.kind == "gguf":
        header = gguf.read_header(src.path)
        cfg = gguf.config_from_header(header)
        weights = read_gguf(header, cfg)
        tokenizer = tokenizer_from_gguf(header)
        generation_config = None
    else:
        cfg = ModelConfig.from_file(src.path / "config.json")
        weights = read_safetensors(src.path)
        generation_config = read_generation_config(src.path)
        eos = (generation_config or {}).get("eos_token_id")
        tokenizer = load_tokenizer(src.path, [eos] if isinstance(eos, int) else eos)
    cfg = untie(cfg, weights)
    check_layers(cfg, weights, str(src.path))
    model = Model(cfg)
    quantize_like(model, weights, cfg.quantization)
    fill(model, weights, str(src.path))
    check_vocabulary(model, tokenizer, src.name)
    model.info = ModelInfo(src.name, f"mlxinfer {cfg.model_type}", src, generation_config)
    compute.apply(model, compute.choose_compute_dtype(compute_dtype, compute.float32_nbytes(model)))
    return model, tokenizer


def read_generation_config(directory: Path) -> dict | None:
    path = directory / "generation_config.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MlxinferError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    return data if isinstance(data, dict) else None


def check_vocabulary(model: Model, tokenizer, name: str) -> None:
    """The output table may have padding rows; it must not have fewer rows than the tokenizer has ids."""
    n_tokens = len(tokenizer)
    if n_tokens > model.config.vocab_size:
        raise MlxinferError(
            f"{name}: the tokenizer has {n_tokens:,} tokens but the model scores only "
            f"{model.config.vocab_size:,}; the tokenizer belongs to another model"
        )
