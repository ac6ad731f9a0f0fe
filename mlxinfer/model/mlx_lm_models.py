"""Every architecture that model.py does not define runs on mlx-lm's own class for it.

The class is chosen as mlx-lm's loader chooses it (`mlx_lm.models.<model_type>`, through mlx-lm's
MODEL_REMAPPING: `mistral` runs on its `llama`), never from code in the model's repository. The
weights come through our loaders (safetensors, sharded, MLX-quantized with per-module settings),
pass through the class's own `sanitize` as in `mlx_lm.load`, and are checked tensor by tensor.

The object returned is mlx-lm's model itself, its module tree and tensor names untouched (so
quant/ writes exactly what mlx-lm would), with what the engine reads beside `__call__`: `info`,
`config` (a ModelConfig, lenient for model types described nowhere here) and `make_cache`.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import replace
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxinferError, is_whole
from ..formats.config import LIMITS, ModelConfig
from .weights import fill, layers_present, quantize_like

_MODULE = re.compile(r"^[a-z][a-z0-9_]*$")


def mlx_lm_version() -> str:
    from mlx_lm import __version__

    return __version__


def class_module(cfg: ModelConfig, where: str) -> ModuleType:
    """mlx-lm's module for this model type (Model and ModelArgs), or a one-line error naming it."""
    from mlx_lm import utils

    if cfg.raw.get("model_file"):
        raise MlxinferError(
            f"{where} asks to run the model's own code ({cfg.raw['model_file']!r}); mlxinfer never runs code "
            "from a model's repository",
            "source",
        )
    name = utils.MODEL_REMAPPING.get(cfg.model_type, cfg.model_type)
    remap = getattr(utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    architectures = cfg.raw.get("architectures") or ()
    for architecture in [architectures] if isinstance(architectures, str) else architectures:
        name = remap.get((cfg.model_type, architecture), name)
    unknown = MlxinferError(
        f"unknown architecture '{cfg.model_type}' in {where}: neither mlxinfer nor mlx-lm {mlx_lm_version()} "
        "defines it (a newer mlx-lm may; mlxinfer never runs code from a model's repository)",
        "source",
    )
    if not _MODULE.match(name):
        raise unknown
    try:
        module = importlib.import_module(f"mlx_lm.models.{name}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("mlx_lm.models"):
            raise unknown from None
        raise MlxinferError(f"mlx-lm's {name} class needs the package '{e.name}'; install it", "source") from None
    if not (hasattr(module, "Model") and hasattr(module, "ModelArgs")):
        raise unknown
    return module


def definition(module: ModuleType, model_type: str) -> str:
    name = module.__name__.rpartition(".")[2]
    return f"mlx-lm {name}" + ("" if name == model_type else f" ({model_type})")


def build(module: ModuleType, cfg: ModelConfig, weights: dict[str, mx.array], where: str, evaluate: bool = True):
    """(mlx-lm's model holding `weights`, evaluated unless `evaluate` is False (a model to be split
    across ranks stays lazy until each rank has cut its share), and the config it runs with)."""
    name = module.__name__.rpartition(".")[2]
    _check_sizes(cfg, weights, where)
    try:
        args = module.ModelArgs.from_dict(cfg.raw)
        model = module.Model(args)
    except (TypeError, ValueError, KeyError, AttributeError, AssertionError, ArithmeticError) as e:
        raise MlxinferError(
            f"{where}: mlx-lm's {name} class cannot be built from this config.json ({_first(e)}); "
            "the config is incomplete or not one mlx-lm reads",
            "source",
        ) from None
    if hasattr(model, "sanitize"):
        try:
            weights = model.sanitize(weights)
        except KeyError as e:
            raise MlxinferError(
                f"{where} lacks the tensor {e.args[0]!r} that mlx-lm's {name} class needs; "
                "the weights are incomplete or belong to another model",
                "source",
            ) from None
        except (ValueError, IndexError, TypeError) as e:
            raise MlxinferError(
                f"{where}: mlx-lm's {name} class cannot read these weights ({_first(e)}); "
                "they are incomplete or belong to another model",
                "source",
            ) from None
    quantize_like(model, weights, cfg.quantization, where)
    fill(model, weights, where, evaluate=evaluate)
    model.eval()
    return model, _served_config(cfg, args, model)


def _check_sizes(cfg: ModelConfig, weights: dict, where: str) -> None:
    """The sizes mlx-lm's class builds from, checked as a described config's are (formats/config.LIMITS), and
    the layer count against the layers the weights hold: a config of 10**9 layers would build 10**9 modules."""
    for d in (cfg.raw, cfg.raw.get("text_config") if isinstance(cfg.raw.get("text_config"), dict) else {}):
        for key, most in LIMITS.items():
            v, least = d.get(key), 1 if key in ("hidden_size", "num_attention_heads", "num_hidden_layers") else 0
            if v is not None and not (is_whole(v) and least <= v <= most):
                raise MlxinferError(
                    f"{where}: {key} must be a whole number from {least} to {most:,}, got {v!r:.40}; fix config.json",
                    "source",
                )
    present = layers_present(weights)
    if present and cfg.num_hidden_layers > max(present) + 1:
        raise MlxinferError(
            f"{where}: the config says {cfg.num_hidden_layers:,} layers but the weights hold {max(present) + 1:,}; "
            "the weights are incomplete or belong to another model",
            "source",
        )


def serve(model: nn.Module, cfg: ModelConfig, info) -> nn.Module:
    """Give mlx-lm's model what the engine reads: config, info, and a cache maker if it has none."""
    model.config, model.info = cfg, info
    if not hasattr(model, "make_cache"):  # mlx-lm's default: one plain KV cache per layer
        from mlx_lm.models.cache import KVCache

        layers = len(model.layers)
        model.make_cache = lambda: [KVCache() for _ in range(layers)]
    return model


def _served_config(cfg: ModelConfig, args, model: nn.Module) -> ModelConfig:
    """The config with the facts the built model settles: its vocabulary, depth, context, tying."""
    from mlx.utils import tree_flatten

    names = {n for n, _ in tree_flatten(model.parameters())}

    def arg(name: str, fallback: int) -> int:
        value = getattr(args, name, None)
        return value if is_whole(value) and value > 0 else fallback

    vocab = arg("vocab_size", cfg.vocab_size)
    if not vocab and "model.embed_tokens.weight" in names:
        vocab = dict(tree_flatten(model.parameters()))["model.embed_tokens.weight"].shape[0]
    return replace(
        cfg,
        vocab_size=vocab,
        hidden_size=arg("hidden_size", cfg.hidden_size),
        num_hidden_layers=len(model.layers),
        max_position_embeddings=arg("max_position_embeddings", cfg.max_position_embeddings),
        tie_word_embeddings=not any(n.startswith("lm_head.") for n in names),
    )


def _first(e: Exception) -> str:
    text = str(e).splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
