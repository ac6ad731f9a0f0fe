"""The server's prompt cache: prefilled prompts kept by their token ids, so that a prompt asked again
(an eval's repeated question, one prompt under many seeds) forks a prefill instead of running one."""

from __future__ import annotations

import collections
import copy
from typing import Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from ..model.cache import KVCache, rounded_room
from .decode import Prefilled


class PromptCache:
    """Prefilled prompts by their exact token ids, least recently used first out, within a byte bound.
    A prompt that comes again (an eval's repeated question, the same chat with other seeds) forks the
    kept cache instead of running the prompt again. Reuse gives the bits a new prefill would: a
    prompt is prefilled alone, the same way every time. Forks never write into the kept arrays
    (MLX writes a cache in place only when nothing else holds it)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.hits, self.bytes = max_bytes, 0, 0
        self._kept: collections.OrderedDict[tuple, tuple[Prefilled, int]] = collections.OrderedDict()

    def get(self, ids: list[int]) -> Optional[Prefilled]:
        kept = self._kept.get(tuple(ids))
        if kept is None:
            return None
        self._kept.move_to_end(tuple(ids))
        self.hits += 1
        return kept[0]

    def holds(self, ids: tuple) -> bool:
        """Whether `get` would find these ids (without counting a hit or reordering)."""
        return ids in self._kept

    def put(self, prefilled: Prefilled) -> Prefilled:
        """Keep `prefilled` (a copy of it cut to the prompt's positions) and return it as it is, for its rows now."""
        if self.max_bytes == 0:  # no prompt cache: nothing to copy
            return prefilled
        kept = Prefilled(prefilled.ids, [_fitted(c) for c in prefilled.cache], prefilled.logits)
        mx.eval([c.kv for c in kept.cache if isinstance(c, KVCache) and c.kv is not None])  # the copies, in one graph
        # a cache's state: our KVCache's arrays, or mlx-lm's (which may hold offsets and Nones too)
        leaves = tree_flatten([c.state for c in kept.cache] + [kept.logits])
        size = sum(a.nbytes for _, a in leaves if isinstance(a, mx.array))
        if size <= self.max_bytes:
            self._kept[tuple(prefilled.ids)] = (kept, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                self.bytes -= self._kept.popitem(last=False)[1][1]
        return prefilled

    def status(self) -> dict:
        return {"prompts": len(self._kept), "bytes": self.bytes, "hits": self.hits}


def _fitted(c):
    """One of our layer caches as a new buffer of its filled positions (rounded up to 16): a prefill reserves
    room by 256 positions, so a 31-token prompt kept ~12 MB where its keys and values are ~1.4 MB. A fork that
    needs more room grows it (KVCache.reserve). Any other cache as it is."""
    if type(c) is not KVCache or c.kv is None or c.kv.shape[3] <= rounded_room(c.offset):
        return c
    fitted = copy.copy(c)
    fitted.kv = mx.contiguous(c.kv[..., : rounded_room(c.offset), :])
    return fitted
