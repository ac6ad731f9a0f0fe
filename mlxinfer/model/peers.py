"""mlx-lm's own model class, built from one of our loaded models: the peer we measure against.

For a GGUF file (which mlx-lm does not load) this is the only way to run mlx-lm's forward
pass on the same weights; for directories it equals `mlx_lm.load`. Both models use Hugging
Face's tensor names, so the tensors move across as they are.
"""

from __future__ import annotations

import importlib

import mlx.nn as nn
from mlx.utils import tree_flatten

from .params import has_int8_layers


def mlx_lm_twin(model) -> nn.Module:
    """mlx-lm's model (its class for our architecture: `Architecture.mlx_lm`) holding exactly our tensors
    (quantized modules alike).
    A model loaded through mlx-lm's own class (definition "mlx-lm ...") is its own twin."""
    if not model.info.definition.startswith("mlxinfer "):
        return model
    if has_int8_layers(model):  # its weights are in the int8 kernel's order (cpu/qlinear.int8_twin)
        from ..errors import MlxinferError

        raise MlxinferError(
            "mlx-lm's twin needs the weights in MLX's layout; load the model with compute_dtype other than int8",
            "compute_dtype",
        )
    cfg = model.config
    arch = importlib.import_module(f"mlx_lm.models.{cfg.architecture.mlx_lm}")
    args = arch.ModelArgs.from_dict(
        {
            **cfg.raw,
            "model_type": cfg.model_type,
            "hidden_size": cfg.hidden_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps,
            "vocab_size": cfg.vocab_size,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_bias": cfg.o_bias,
        }
    )
    twin = arch.Model(args)
    modules = dict(model.named_modules())

    def same_quantization(path: str, _module) -> dict | bool:
        ours = modules.get(path)
        return {"group_size": ours.group_size, "bits": ours.bits} if hasattr(ours, "bits") else False

    nn.quantize(twin, class_predicate=same_quantization)
    twin.load_weights(tree_flatten(model.parameters()), strict=True)
    return twin
