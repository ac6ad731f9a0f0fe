"""The KV cache: each layer's keys and values for every position seen so far.

Prefill writes many positions at once, decode one at a time; the next pass then computes
attention only for the new positions. Storage grows in steps of 256 positions so that decode
does not copy the whole cache every token.

Rows: a cache holds B sequences that share their length. `fork` turns the prompt's one row
into B continuations (each seed of an experiment) and `keep_rows` drops the rows that have
finished. Both work on mlx-lm's caches too (they keep `keys`/`values` the same way).
"""

from __future__ import annotations

import copy

import mlx.core as mx

from .. import defaults
from ..errors import MlxinferError, is_whole


class KVCache:
    """One layer's cache: keys and values in one buffer, kv (B, 2, K, capacity, E), so that the
    quantized path writes both in one node (model/native_block.py); `keys` and `values` are views of it."""

    step = 256
    base = 0  # positions held elsewhere, before the buffer's first slot (PrefixedCache)
    # the buffer is held by nothing that must keep its old contents (a copy that fork made): the
    # attention node may write the new keys and values into it itself (model/native_block.py)
    owned = False

    def __init__(self):
        self.kv: mx.array | None = None  # (B, 2, K, capacity, E): [:, 0] keys, [:, 1] values
        self.offset = 0  # positions filled

    @property
    def keys(self) -> mx.array | None:  # (B, K, capacity, E)
        return None if self.kv is None else self.kv[:, 0]

    @property
    def values(self) -> mx.array | None:
        return None if self.kv is None else self.kv[:, 1]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append (B, K, L, E) keys/values; return all positions so far."""
        start, L = self.offset - self.base, keys.shape[2]
        self.reserve(keys.shape, values.shape[3], keys.dtype)
        self.offset += L
        self.kv[:, 0, :, start : start + L, :] = keys
        self.kv[:, 1, :, start : start + L, :] = values
        return self.kv[:, 0, :, : start + L, :], self.kv[:, 1, :, : start + L, :]

    def reserve(self, shape: tuple, value_size: int, dtype) -> None:
        """Room for L more positions of keys shaped (B, K, L, E) and values of value_size: what
        update_and_fetch needs, and what a caller that writes them itself needs (model/native_block.py)."""
        B, K, L, E = shape
        if value_size != E:
            raise ValueError(f"keys of {E} and values of {value_size} values a head do not share one buffer")
        if self.has_room(L):
            return
        filled = self.offset - self.base
        capacity = -(-(filled + L) // self.step) * self.step
        kv = mx.zeros((B, 2, K, capacity, E), dtype)
        if self.kv is not None and filled:
            kv[..., :filled, :] = self.kv[..., :filled, :]
        self.kv = kv

    def has_room(self, L: int) -> bool:
        """Whether the buffer holds L more positions without growing."""
        return self.kv is not None and self.offset - self.base + L <= self.kv.shape[3]

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate (mlx-lm's loops call `mx.eval(c.state)` too)."""
        return [] if self.kv is None else [self.kv]

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes


class PrefixedCache(KVCache):
    """A KVCache whose rows share their first `base` positions, held once: prefix (1, 2, K, base, E), the
    prompt a batch's rows continue (a seeded batch's forks, the exact answers' paths: engine/path_cache.py).
    kv's slot s holds position base + s, so the rows do not each copy the prefix, and the native attention
    reads it once for all of them (the same bits a row has with the prefix copied in). The composed
    attention reads a copy of both."""

    def __init__(self, prefix: mx.array, kv: mx.array, offset: int):
        self.prefix, self.kv, self.offset = prefix, kv, offset
        self.base = prefix.shape[3]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        own_keys, own_values = super().update_and_fetch(keys, values)
        shared = mx.broadcast_to(self.prefix, (keys.shape[0], *self.prefix.shape[1:]))
        return mx.concatenate([shared[:, 0], own_keys], axis=2), mx.concatenate([shared[:, 1], own_values], axis=2)


class RaggedCache:
    """One layer's caches for rows of different lengths (model/ragged.py): row r's own one-row cache
    rows[r], at offsets[r]. owned: every row's buffer is its own (KVCache.owned); roomy: every row has
    room for one more position (checked once a step). The native blocks then write the new keys and
    values inside their attention node."""

    def __init__(self, rows: list[KVCache], roomy: bool = False):
        self.rows, self.offsets, self.roomy = rows, [c.offset for c in rows], roomy
        self.owned = all(c.owned for c in rows)


def _map_rows(cache: list, fn) -> list:
    """A new cache list whose row arrays are fn(array); the given caches are left as they are."""
    out = []
    for c in cache:
        c = copy.copy(c)
        if isinstance(c, KVCache):
            c.kv = None if c.kv is None else fn(c.kv)  # rows on axis 0, as in keys and values
        elif getattr(c, "keys", None) is not None:
            c.keys, c.values = fn(c.keys), fn(c.values)
        elif isinstance(getattr(c, "cache", None), list):  # mlx-lm's ArraysCache (recurrent state)
            c.cache = [None if a is None else fn(a) for a in c.cache]
        out.append(c)
    return out


def fork(cache: list, rows: int, positions: int | None = None, shared: bool = False) -> list:
    """`rows` independent continuations of a one-row cache: (1, ...) -> (rows, ...), in new buffers
    (mx.array copies), each KVCache marked `owned`: the attention node writes each step into it. Copies of whole rows
    (concatenate), not mx.repeat, whose CPU copy of a 32-row, 256-position cache took ~5x longer.
    positions: room the rows will use at most (the prompt and the tokens still to come); our caches'
    buffers are cut to it (rounded up to 16), so that this copy and each keep_rows copy only that.
    shared (a model whose attention reads prefixes in place: native_block.shares_prefixes): several rows'
    caches become PrefixedCaches, the prompt held once for all of them and each row's buffer empty room."""
    if not isinstance(cache, list) or not all(hasattr(c, "state") for c in cache):
        raise MlxinferError("cache must be a model's cache (a list of layer caches: prefill(...).cache)", "cache")
    if not is_whole(rows) or not 1 <= rows <= defaults.MAX_SEEDS:
        raise MlxinferError(f"rows must be a whole number from 1 to {defaults.MAX_SEEDS:,}, got {rows!r:.40}", "rows")
    if shared and rows > 1 and positions is not None and all(type(c) is KVCache and c.kv is not None for c in cache):
        out = [_prefixed(c, rows, positions) for c in cache]
    else:
        if positions is not None:
            cache = [_cut(c, rounded_room(positions)) for c in cache]
        out = _map_rows(cache, lambda a: mx.concatenate([a] * rows, axis=0) if rows > 1 else mx.array(a))
    for c in out:
        if isinstance(c, KVCache):
            c.owned = True
    return out


def rounded_room(positions: int) -> int:
    return -(-positions // 16) * 16  # a forked buffer's room, in steps of 16 positions


def _prefixed(c: KVCache, rows: int, positions: int) -> PrefixedCache:
    _, _, K, _, E = c.kv.shape
    room = rounded_room(max(positions - c.offset, 1))
    return PrefixedCache(mx.contiguous(c.kv[..., : c.offset, :]), mx.zeros((rows, 2, K, room, E), c.kv.dtype), c.offset)


def _cut(c, room: int):
    """One of our caches with its buffer viewed up to `room` positions where it holds more and its filled
    ones fit; any other cache as it is (a KVCache that outgrows it grows, as in reserve)."""
    if not isinstance(c, KVCache) or c.kv is None or not c.offset <= room < c.kv.shape[3]:
        return c
    c = copy.copy(c)
    c.kv = c.kv[..., :room, :]
    return c


def keep_rows(cache: list, rows: list[int]) -> list:
    """Only these rows, in this order (the others have finished)."""
    index = mx.array(rows, dtype=mx.int32)
    return _map_rows(cache, lambda a: a[index])
