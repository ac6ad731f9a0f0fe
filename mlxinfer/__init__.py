"""mlxinfer: open a language model and see what it computes.

The public API, in the shape of mlx-lm's (`load`, `generate`, `stream_generate`):

    model, tokenizer = mlxinfer.load()                  # the embedded model; or a dir, .gguf, repo id
    mlxinfer.next_token_table(model, tokenizer, prompt)  # one forward pass: the lesson's table
    mlxinfer.generate(model, tokenizer, prompt, ...)     # text (or schema-valid JSON) and its stats
    mlxinfer.stream_generate(model, tokenizer, prompt)   # the same, a step at a time
    mlxinfer.sample(model, tokenizer, prompt, seeds=10)  # seeded experiment: one completion per seed
    mlxinfer.count("path/to/model")                      # parameters and bytes, no mlx needed

Attributes load lazily so that `import mlxinfer` (and `count`) stays free of mlx until a
function needs it. The sampler's stages are public too, in `mlxinfer.sampler`.
"""

from .cpu import blas as _blas

_blas.preload()  # a fast BLAS (MKL or OpenBLAS) must be loaded before anything imports mlx; see cpu/blas.py

from .errors import MlxinferError  # noqa: E402
from .settings import GREEDY, SamplerSettings  # noqa: E402

_LAZY = {
    "load": ("model.loading", "load"),
    "count": ("counting", "count"),
    "next_token_table": ("engine.tables", "next_token_table"),
    "next_token_scores": ("engine.tables", "next_token_scores"),
    "table_from_scores": ("engine.tables", "table_from_scores"),
    "explain": ("engine.tables", "explain"),
    "expert_routing": ("engine.tables", "expert_routing"),
    "generate": ("engine.generate", "generate"),
    "stream_generate": ("engine.generate", "stream_generate"),
    "sample": ("engine.experiments", "sample"),
    "prefill": ("engine.decode", "prefill"),
    "sweep": ("engine.sweep", "sweep"),
    "settings_grid": ("engine.sweep", "settings_grid"),
    "encode_prompt": ("tokenizer", "encode_prompt"),
    "system_info": ("model.compute", "system_info"),
    "ModelConfig": ("formats.config", "ModelConfig"),
}

__all__ = ["MlxinferError", "SamplerSettings", "GREEDY", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'mlxinfer' has no attribute {name!r}")
