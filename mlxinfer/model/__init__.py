"""The model layer: the forward pass (model.py), its KV cache, loading weights into it, the
compute dtype, and mlx-lm's twin for comparisons."""
