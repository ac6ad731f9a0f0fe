"""The exact answers' KV caches: a batch of token paths of one length, each continuing the prompt.

The prompt is prefilled once; each expanded path keeps only its last token's keys and values,
(layers, 2, K, E). A forward pass over B paths of length d builds, per layer, one B-row cache of the
prompt's positions (shared, broadcast), each path's first d - 1 tokens (from its ancestors) and room
for the token it runs now; the pass writes that token's keys and values, which `at_position` reads
back for the path to keep. Our KVCache (keys and values in one buffer) and mlx-lm's (keys, values,
offset) are both read; any other cache (a rotating window, a recurrent state) is refused.
"""

from __future__ import annotations

import copy
from typing import Optional

import mlx.core as mx

from ..errors import MlxinferError
from ..model.cache import KVCache


def paths_cache(prompt_cache: list, P: int, chains: list[list[mx.array]]) -> list:
    """Per layer, a B-row cache: the prompt's P positions, then each path's ancestors' keys and values
    (chains[b]: d - 1 arrays (layers, 2, K, E), the same d for every path), then room for one more."""
    B, n = len(chains), len(chains[0])
    suffix = mx.stack([mx.stack(c, axis=3) for c in chains]) if n else None  # (B, layers, 2, K, d - 1, E)
    return [_grown(c, B, None if suffix is None else suffix[:, layer], P) for layer, c in enumerate(prompt_cache)]


def at_position(cache: list, at: int) -> mx.array:
    """(B, layers, 2, K, E): the keys and values each row's cache holds at position `at`."""
    return mx.stack([_position(c, at) for c in cache], axis=1)


def _grown(cache, B: int, suffix: Optional[mx.array], P: int):
    """A B-row copy of one layer's prompt cache with each row's suffix positions after the prompt, and
    room for one more: suffix (B, 2, K, n, E) or None."""
    if isinstance(cache, KVCache):
        prompt = cache.kv[:, :, :, :P, :]  # (1, 2, K, P, E)
        parts = [mx.broadcast_to(prompt, (B, *prompt.shape[1:]))]
    elif getattr(cache, "keys", None) is not None and hasattr(cache, "offset"):
        prompt = mx.stack([cache.keys[:, :, :P, :], cache.values[:, :, :P, :]], axis=1)
        parts = [mx.broadcast_to(prompt, (B, *prompt.shape[1:]))]
    else:
        raise MlxinferError(f"answers walks models with a plain KV cache; this one uses {type(cache).__name__}")
    if suffix is not None:
        parts.append(suffix.astype(prompt.dtype))
    parts.append(mx.zeros((B, *prompt.shape[1:3], 1, prompt.shape[-1]), prompt.dtype))
    kv = mx.concatenate(parts, axis=3)  # (B, 2, K, P + n + 1, E)
    grown = copy.copy(cache)
    if isinstance(cache, KVCache):
        grown.kv = kv
    else:
        grown.keys, grown.values = kv[:, 0], kv[:, 1]
    grown.offset = kv.shape[3] - 1
    return grown


def _position(cache, at: int) -> mx.array:
    """(B, 2, K, E): the keys and values one layer's cache holds at position `at`."""
    if isinstance(cache, KVCache):
        return cache.kv[:, :, :, at, :]
    return mx.stack([cache.keys[:, :, at, :], cache.values[:, :, at, :]], axis=1)
