"""`load(source) -> (model, tokenizer)`, like `mlx_lm.load`, for every source kind."""

from __future__ import annotations

import json
from pathlib import Path

from . import gguf, sources
from .compute import apply_compute_dtype, check_compute_dtype, choose_compute_dtype, float32_nbytes
from .config import ModelConfig
from .errors import MlxinferError
from .model import Model
from .tokenizer import load_tokenizer, tokenizer_from_gguf
from .weights import build_model, read_gguf, read_safetensors


def load(source: str | Path | None = None, compute_dtype: str = "bfloat16"):
    """Load a model and its tokenizer: local dir, .gguf, hub repo id, or None for the embedded model.

    compute_dtype: "bfloat16" keeps the weights as stored (quantized stays quantized, like
    mlx_lm.load); "float32" dequantizes/upcasts them once so every matmul goes through BLAS;
    "auto" picks float32 on a CPU with a fast BLAS when it fits in memory (see compute.py).
    The model carries `.config`, `.source` (a ModelSource), `.generation_config` (the
    checkpoint's sampling defaults, or None) and `.compute_dtype`.
    """
    check_compute_dtype(compute_dtype)  # an unknown choice fails before any file is read
    src = sources.resolve(source)
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
    model = build_model(cfg, weights, where=str(src.path))
    check_vocabulary(model, tokenizer, src.name)
    model.compute_dtype = choose_compute_dtype(compute_dtype, float32_nbytes(model))
    apply_compute_dtype(model, model.compute_dtype)
    model.source = src
    model.generation_config = generation_config
    return model, tokenizer


def read_generation_config(directory: Path) -> dict | None:
    path = directory / "generation_config.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
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
