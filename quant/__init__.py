"""quant: make a quantized model, know what it costs in bytes, measure what it costs in quality.

- `quantize(source, out, bits=4, group_size=64, ...)`: any source (model directory, .gguf, hub repo
  id, or None for the embedded SmolLM2) to an mlx-community style directory of MLX affine weights,
  through the same `mx.quantize` call mlx-lm's `convert` makes; `bits=16` writes a float (bf16)
  directory instead, dequantizing a quantized or GGUF source.
- `convert_gguf(path, out)`: a GGUF file to the same directory layout, its Q4_0/Q4_1/Q8_0 tensors
  kept exactly (they are MLX affine weights with group size 32), norms left in float32.
- `evaluate(reference, candidates)`: bytes, bits per weight, and against the reference over the
  shipped text (quant/data/eval.txt): mean KL divergence of the next-token distributions, top-1
  agreement and perplexity.

The per-module policy is written the way mlx-community checkpoints write it: config.json's
`quantization` block holds the global `bits`/`group_size`/`mode` and, keyed by Hugging Face module
path, an override per module that differs: `"lm_head": {"group_size": 64, "bits": 8}`, or `false`
for a module left in float.
"""

import mlxinfer  # noqa: F401  (first: it loads a fast BLAS before anything imports mlx)

from .policy import FLOAT_BITS, VALID_BITS, VALID_GROUP_SIZES, Policy  # noqa: E402

__all__ = [
    "Policy",
    "VALID_BITS",
    "VALID_GROUP_SIZES",
    "FLOAT_BITS",
    "quantize",
    "convert_gguf",
    "evaluate",
    "QualityProgress",
    "check_quality_options",
    "quantize_tensor",
    "dequantize_tensor",
]


def __getattr__(name):
    import importlib

    where = {
        "quantize": "export",
        "convert_gguf": "export",
        "evaluate": "quality",
        "QualityProgress": "quality",
        "check_quality_options": "quality",
        "quantize_tensor": "affine",
        "dequantize_tensor": "affine",
    }
    if name in where:
        return getattr(importlib.import_module(f".{where[name]}", __name__), name)
    raise AttributeError(f"module 'mlxinfer_quant' has no attribute {name!r}")
