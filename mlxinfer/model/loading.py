"""`load(source) -> (model, tokenizer)`, like `mlx_lm.load`, for every source kind."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..cpu import heap
from ..errors import MlxinferError, is_whole
from ..formats import gguf, sources
from ..formats.config import ModelConfig, quantization_blocks
from ..formats.paths import read_json_file
from ..tokenizer import vocabulary
from ..tokenizer_load import load_tokenizer, tokenizer_from_gguf
from . import convert, distributed, dtype_rule, mlx_lm_models, params
from .info import ModelInfo
from .model import Model
from .moe import stack_experts
from .weights import check_layers, fill, quantize_like, read_gguf, read_safetensors, untie


def load(source: str | Path | None = None, compute_dtype: str = "auto", group=None):
    """Load a model and its tokenizer: a local directory, a .gguf, a hub repo id, or None (or
    "embedded") for the embedded model. A GGUF's K-quants and i-quants load as model/gguf_tensors.py
    says; "model.gguf@float32" (or "embedded@float32") loads every tensor as the gguf package's float32
    dequantization of it, exactly.

    compute_dtype: "bfloat16" keeps the weights as stored (quantized stays quantized, like
    mlx_lm.load); "quantized" keeps quantized weights packed and computes in float32 through the
    batch-invariant CPU kernel (cpu/qmm.py); "float32" dequantizes/upcasts them once so every matmul
    goes through BLAS; "auto" picks quantized on a CPU for quantized weights when the kernel is
    built, else float32 with a fast BLAS when it fits in memory (see model/dtype_rule.py).
    The model's `info` (a ModelInfo) says where it came from, which definition runs it ("mlxinfer
    qwen3", or "mlx-lm gemma3_text" for an architecture model.py does not define), its
    generation_config.json and how its weights are held.

    group: an `mx.distributed` group of several ranks (under mlx.launch) to split the model across
    by tensor parallelism; each rank keeps its share (model/distributed.py, model/shard.py) and
    `info.sharding` says how. None or a single rank: the whole model.
    """
    dtype_rule.check_compute_dtype(compute_dtype)  # an unknown choice fails before any file is read
    if mx.default_device() == mx.cpu:  # large arrays reuse freed blocks instead of fresh mmaps (cpu/heap.py)
        heap.keep_large_buffers()
    if group is not None and not callable(getattr(group, "size", None)):
        raise MlxinferError(f"group must be an mx.distributed group or None, got {type(group).__name__}", "group")
    sharded = group is not None and group.size() > 1
    if sharded and compute_dtype in ("quantized", "int8"):  # distributed.finish: float32 or as stored
        raise MlxinferError(
            f"compute_dtype '{compute_dtype}' runs in one process only; a model split across ranks runs float32 "
            "or as stored: use float32, bfloat16 or auto",
            "compute_dtype",
        )
    if sharded:  # the same model on every rank, and a split that works, before any weight is read
        distributed.preflight(source, group)
    src = sources.resolve(source)
    if src.kind == "config":
        raise MlxinferError(
            f"{src.path} is a config file alone; point at the model directory that holds it with its weights", "source"
        )
    foreign = None  # mlx-lm's module for an architecture model.py does not define
    if src.kind == "gguf":
        header = gguf.read_header(src.path)
        cfg = gguf.config_from_header(header)
        weights = read_gguf(header, cfg, dequantize=src.dequantized)
        tokenizer = tokenizer_from_gguf(header)
        generation_config = None
    else:
        cfg = ModelConfig.from_file(src.path / "config.json", undescribed=True)
        check_quantization_layout(cfg, src.name)
        if not (cfg.architecture and cfg.architecture.ours):  # an unknown type fails before any weight is read
            foreign = mlx_lm_models.class_module(cfg, str(src.path / "config.json"))
        weights = read_safetensors(src.path)
        generation_config = read_generation_config(src.path)
    if not sharded:  # a rank holds its share only: distributed.preflight checked the split
        check_fits(weights, src.name)
    if foreign is None:
        if cfg.num_experts:
            weights = stack_experts(weights, cfg)
        cfg = untie(cfg, weights)
        check_layers(cfg, weights, str(src.path))  # before a billion blocks are built from a hostile config
        model = Model(cfg)
        quantize_like(model, weights, cfg.quantization, str(src.path))
        fill(model, weights, str(src.path), evaluate=not sharded)
        model.info = ModelInfo(src.name, f"mlxinfer {cfg.model_type}", src, generation_config)
    else:
        model, cfg = mlx_lm_models.build(foreign, cfg, weights, str(src.path), evaluate=not sharded)
        info = ModelInfo(src.name, mlx_lm_models.definition(foreign, cfg.model_type), src, generation_config)
        mlx_lm_models.serve(model, cfg, info)
    if src.kind != "gguf":  # after the weights are checked: a mismatch is named before any tokenizer error
        tokenizer = load_tokenizer(src.path, _config_eos(generation_config, cfg.vocab_size))
    check_vocabulary(model, tokenizer, src.name)
    model.info = replace(model.info, vocabulary=vocabulary(tokenizer))  # another model's tokenizer is named
    if sharded:
        weights.clear()  # the model holds the only references: a full tensor is freed once sliced
        model = distributed.finish(model, group, compute_dtype)
    else:
        nbytes = params.float32_nbytes(model)
        convert.apply(model, dtype_rule.choose_compute_dtype(compute_dtype, nbytes, convert.quantizable(model)))
    if mx.default_device() == mx.cpu:  # every decode step reads every weight: 2 MiB pages (cpu/heap.py)
        heap.huge_pages(leaf for _, leaf in tree_flatten(model.parameters()))
    return model, tokenizer


def _config_eos(generation_config: dict | None, vocab_size: int) -> list[int] | None:
    """generation_config.json's eos_token_id as a list of ids, checked: a string was taken apart into its
    characters (and sorted beside ints, a traceback), `true` read as id 1, an id past the vocabulary kept."""
    eos = (generation_config or {}).get("eos_token_id")
    if eos is None:
        return None
    ids = [eos] if not isinstance(eos, list) else eos
    if not ids or not all(is_whole(i) and 0 <= i < vocab_size for i in ids):
        raise MlxinferError(
            f"generation_config.json's eos_token_id must be a token id or a list of them, each from 0 to "
            f"{vocab_size - 1:,}, got {eos!r:.80}; fix or delete the file",
            "source",
        )
    return ids


def check_quantization_layout(cfg: ModelConfig, name: str) -> None:
    """Weights quantized in a layout these loaders do not read, named before any tensor is read: another
    library's (GPTQ, AWQ...), or, for model.py's own definitions, an MLX mode other than affine."""
    if cfg.foreign_quantization:
        raise MlxinferError(
            f"{name}'s weights are quantized with {cfg.foreign_quantization!r} (config.json's quantization_config), "
            "a layout mlxinfer does not read; use an MLX (mlx-community) or GGUF copy of the model",
            "source",
        )
    modes = {v.get("mode", "affine") for _, v in quantization_blocks(cfg.quantization or {})}
    if cfg.architecture and cfg.architecture.ours and modes - {"affine"}:
        raise MlxinferError(
            f"{name} is quantized in MLX's {', '.join(sorted(modes - {'affine'}))} mode; mlxinfer's {cfg.model_type} "
            "reads affine weights only: use an affine copy (mlxinfer quantize from the float weights)",
            "source",
        )


def check_fits(weights: dict, name: str) -> None:
    """The weights (lazy until filled: their sizes come from the file headers) against the machine's
    memory, before a byte is read: past it, the load would end in swapping or the process killed."""
    need, ram = sum(w.nbytes for w in weights.values()), dtype_rule.physical_ram_bytes()
    if ram is not None and need > ram:
        raise MlxinferError(
            f"{name}'s weights take {_amount(need)} but this machine has {_amount(ram)} of memory; use a "
            "smaller or more quantized model, or split it across machines (mlx.launch; docs/commands.md)",
            "source",
        )


def _amount(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def read_generation_config(directory: Path) -> dict | None:
    path = directory / "generation_config.json"
    if not path.exists():
        return None
    data = read_json_file(path, "generation_config.json")
    return data if isinstance(data, dict) else None


def check_vocabulary(model: Model, tokenizer, name: str) -> None:
    """The output table may have padding rows; it must not have fewer rows than the tokenizer has ids.
    The largest id counts, not the number of tokens: a vocabulary with gaps can be short and still
    hold an id past the table (its embedding row would be read out of bounds)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    n_tokens = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    if n_tokens > model.config.vocab_size:
        raise MlxinferError(
            f"{name}: the tokenizer has token ids up to {n_tokens - 1:,} but the model scores only "
            f"{model.config.vocab_size:,}; the tokenizer belongs to another model"
        )
