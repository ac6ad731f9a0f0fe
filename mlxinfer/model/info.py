"""What a loaded model is, beside its weights: where it came from, which definition runs it, the
checkpoint's sampling defaults and how its weights are held. `load` fills it; commands, reports
and the engine read it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..formats.sources import ModelSource


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what the user asked for, for output
    definition: str  # which forward pass runs: "mlxinfer llama", "mlx-lm gemma3_text"
    source: ModelSource | None = None
    generation_config: dict | None = None  # the checkpoint's generation_config.json, if any
    # "quantized" (packed weights, float32 arithmetic), "int8" (packed, activations rounded to 8 bits),
    # "float32" (dequantized for BLAS) or "bfloat16" (as stored)
    compute_dtype: str = "bfloat16"
    weights: str = ""  # how they are held now: "4-bit quantized (activations float16)", "float32"
    cpu_kernels: bool = False  # the float32 CPU path's RoPE table and polynomial exp
    sharding: dict | None = None  # split across ranks (model/distributed.py): the plan, each rank's bytes
    vocabulary: str = ""  # the fingerprint of the tokenizer loaded with it (tokenizer.vocabulary)

    @classmethod
    def unnamed(cls, definition: str) -> "ModelInfo":
        return cls(name="", definition=definition)

    def to_dict(self) -> dict:
        """Every field as JSON takes it (the source's path as text)."""
        out = asdict(self)
        if self.source is not None and self.source.path is not None:
            out["source"]["path"] = str(self.source.path)
        return out
