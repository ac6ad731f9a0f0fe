"""The KV cache: each layer's keys and values for every position seen so far.

Prefill writes many positions at once, decode one at a time; the next pass then
computes attention only for the new positions. Storage grows in steps of 256
positions so that decode does not copy the whole cache every token.
"""

from __future__ import annotations

import mlx.core as mx


class KVCache:
    step = 256

    def __init__(self):
        self.keys: mx.array | None = None  # (B, K, capacity, E)
        self.values: mx.array | None = None
        self.offset = 0  # positions filled

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append (B, K, L, E) keys/values; return all positions so far."""
        start, L = self.offset, keys.shape[2]
        if self.keys is None or start + L > self.keys.shape[2]:
            self._grow(keys, values, start + L)
        self.offset = start + L
        self.keys[..., start : self.offset, :] = keys
        self.values[..., start : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def _grow(self, keys: mx.array, values: mx.array, needed: int) -> None:
        B, K, _, E = keys.shape
        capacity = -(-needed // self.step) * self.step
        new_k = mx.zeros((B, K, capacity, E), keys.dtype)
        new_v = mx.zeros((B, K, capacity, values.shape[3]), values.dtype)
        if self.keys is not None and self.offset:
            new_k[..., : self.offset, :] = self.keys[..., : self.offset, :]
            new_v[..., : self.offset, :] = self.values[..., : self.offset, :]
        self.keys, self.values = new_k, new_v

    def trim(self, n: int) -> None:
        """Forget the last n positions (their storage is overwritten by the next update)."""
        self.offset = max(0, self.offset - n)

    def copy(self) -> "KVCache":
        """An independent cache with the same positions: reuse one prefill for many continuations."""
        other = KVCache()
        if self.keys is not None:
            other.keys = mx.array(self.keys)
            other.values = mx.array(self.values)
        other.offset = self.offset
        return other

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate (mlx-lm's loops call `mx.eval(c.state)` too)."""
        return [] if self.keys is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
