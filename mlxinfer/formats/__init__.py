"""File formats, read without a framework: config.json, safetensors headers and index, GGUF
header and tensor table, and where a model comes from. Nothing here imports mlx, so `count`
stands on this layer alone."""
