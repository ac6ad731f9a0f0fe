"""The exact answers' KV caches: a batch of token paths of one length, each continuing the prompt.

The prompt is prefilled once; each expanded path keeps only its last token's keys and values,
(layers, 2, K, E). A forward pass over B paths of length d runs on, per layer, a B-row cache of the
prompt's positions, each path's first d - 1 tokens (from its ancestors) and room for the token it runs
now; the pass writes that token's keys and values, which `at_position` reads back for the path to keep.

With our KVCache the prompt is not copied into the rows: a PrefixedCache holds it once, shared by every
row (the native attention reads it once a layer for all of them, with the same bits), and the rows hold
only the paths' own positions. `PathRows` keeps a pass's row buffers for the next pass of as many paths
and writes the paths' positions into them, in place (the walk holds them only between passes). Copying
the prompt into 32 rows was ~11 ms of a ~45 ms pass on a 2-core CPU, and reading 32 copies of it was
most of a pass's attention. mlx-lm's caches (keys, values, offset) get the prompt copied into each row;
any other cache (a rotating window, a recurrent state) is refused.
"""

from __future__ import annotations

import copy
from typing import Optional

import mlx.core as mx

from ..errors import MlxinferError
from ..model.cache import KVCache, PrefixedCache

ROOM = 16  # slots a new buffer holds past the paths' own positions, so that deeper passes reuse it


class PathRows:
    """The B-row caches of a walk's passes over one prompt cache of P positions: cache(chains) before a
    pass, keep(cache) after it has been evaluated."""

    def __init__(self, prompt_cache: list, P: int):
        self.prompts = [_prompt(c, P) for c in prompt_cache]  # (1, 2, K, P, E) a layer, each one buffer
        self.prompt_cache, self.P = prompt_cache, P
        self.kept: Optional[list] = None  # the last pass's row buffers, (B, 2, K, room, E) a layer

    def cache(self, chains: list[list[mx.array]]) -> list:
        """Per layer, a B-row cache: the prompt's P positions, then each path's ancestors' keys and values
        (chains[b]: d - 1 arrays (layers, 2, K, E), the same d for every path), then room for one more."""
        B, n, P = len(chains), len(chains[0]), self.P
        suffix = None
        if n:  # every ancestor's keys and values in one copy, (B (d - 1), layers, 2, K, E)
            flat = mx.stack([kv for chain in chains for kv in chain])
            suffix = flat.reshape(B, n, *flat.shape[1:]).transpose(0, 2, 3, 4, 1, 5)  # (B, layers, 2, K, n, E)
        kept, self.kept = self.kept, None  # the buffers' only holder is now this pass's graph: written in place
        reuse = kept is not None and kept[0].shape[0] == B and kept[0].shape[3] > n
        out = []
        for layer, (c, prompt) in enumerate(zip(self.prompt_cache, self.prompts)):
            rows = None if suffix is None else suffix[:, layer].astype(prompt.dtype)  # (B, 2, K, n, E)
            shared = isinstance(c, KVCache)
            if reuse:
                kv, kept[layer] = kept[layer], None
                if rows is not None:
                    kv[:, :, :, :n, :] = rows
            else:
                room = -(-(n + 1) // ROOM) * ROOM
                kv = _rows(None if shared else prompt, B, rows, room, prompt)
            if shared:
                out.append(PrefixedCache(prompt, kv, P + n))
                continue
            grown = copy.copy(c)
            grown.keys, grown.values, grown.offset = kv[:, 0], kv[:, 1], P + n
            out.append(grown)
        return out

    def keep(self, cache: list) -> None:
        """Hold an evaluated pass's row buffers for the next pass (our caches only: mlx-lm's keys and values
        are written into copies of their own)."""
        if all(isinstance(c, PrefixedCache) for c in cache):
            self.kept = [c.kv for c in cache]


def at_position(cache: list, at: int) -> mx.array:
    """(B, layers, 2, K, E): the keys and values each row's cache holds at position `at` (a copy: the
    buffers are written again by the next pass)."""
    return mx.stack([_position(c, at) for c in cache], axis=1)


def _prompt(cache, P: int) -> mx.array:
    """(1, 2, K, P, E): one layer's prompt positions, in a buffer of their own."""
    if isinstance(cache, KVCache):
        return mx.contiguous(cache.kv[:, :, :, :P, :])
    if getattr(cache, "keys", None) is not None and hasattr(cache, "offset"):
        return mx.stack([cache.keys[:, :, :P, :], cache.values[:, :, :P, :]], axis=1)
    raise MlxinferError(f"answers walks models with a plain KV cache; this one uses {type(cache).__name__}")


def _rows(prompt: Optional[mx.array], B: int, suffix: Optional[mx.array], room: int, like: mx.array) -> mx.array:
    """(B, 2, K, (P +) room, E): the prompt in every row when given, then each row's suffix (B, 2, K, n, E)
    or None, then zeros."""
    parts = [] if prompt is None else [mx.broadcast_to(prompt, (B, *prompt.shape[1:]))]
    if suffix is not None:
        parts.append(suffix)
    filled = 0 if suffix is None else suffix.shape[3]
    parts.append(mx.zeros((B, *like.shape[1:3], room - filled, like.shape[-1]), like.dtype))
    return mx.concatenate(parts, axis=3) if len(parts) > 1 else parts[0]


def _position(cache, at: int) -> mx.array:
    """(B, 2, K, E): the keys and values one layer's cache holds at position `at`."""
    if isinstance(cache, PrefixedCache) and at < cache.base:  # a shared position: the same in every row
        return mx.broadcast_to(
            cache.prefix[:, :, :, at, :], (cache.kv.shape[0], *cache.kv.shape[1:3], cache.kv.shape[-1])
        )
    if isinstance(cache, KVCache):
        return cache.kv[:, :, :, at - cache.base, :]
    return mx.stack([cache.keys[:, :, at, :], cache.values[:, :, at, :]], axis=1)
