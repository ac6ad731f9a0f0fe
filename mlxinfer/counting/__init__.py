"""`count`: parameters, bytes and operations per token, worked out from config.json alone,
then checked against what the checkpoint actually stores (safetensors or GGUF headers,
read by `stored`).

Pure Python on purpose: no mlx, mlx-lm, transformers or numpy, so it starts fast and
never loads (or downloads) a weight. huggingface_hub is imported only for a hub repo id.
"""

from .report import count, parse_rate

__all__ = ["count", "parse_rate"]
