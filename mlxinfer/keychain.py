"""MLX's random keys for many rows at once, in numpy: the same bits, without a call per row.

A seeded row's draws come from the key chain that MLX's global stream follows after
`mx.random.seed(seed)`: `state = mx.random.key(seed)`, then per draw
`state, sub = mx.random.split(state)`. Both are Threefry-2x32 (MLX's RandomBits), a pure
function of the key and a counter, so a chain for each of B rows is a few numpy operations on
(B,) arrays instead of B MLX calls per step. `uniform` is `mx.random.uniform(shape=(1,), key=sub)`,
the one number MLX's inverse-CDF categorical draws for a row. tests/test_draw_kernel.py checks all
three against MLX, and the engine checks the whole draw against mx.random.categorical before use.
No mlx import.
"""

from __future__ import annotations

import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
_UPPER = np.nextafter(np.float32(1.0), np.float32(0.0))  # uniform draws in [0, 1)
_SCALE = np.float32(4294967295.0)  # MLX divides by UINT32_MAX as a float32 (= 2**32)


def threefry(k0: np.ndarray, k1: np.ndarray, c0, c1) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds of keys (k0, k1) over counters (c0, c1): uint32 arrays, broadcast."""
    k0, k1 = np.asarray(k0, np.uint32), np.asarray(k1, np.uint32)
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as it should
        x0 = np.asarray(c0, np.uint32) + ks[0]
        x1 = np.asarray(c1, np.uint32) + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
                x1 = x1 ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def split(chains: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(next state, subkey), each (B, 2): `mx.random.split(key)` row by row. split gives the
    bits of shape (2, 2) from the key: counters (0, 2) and (1, 3) fill [[a, b], [c, d]]."""
    k0, k1 = chains[:, 0], chains[:, 1]
    a, c = threefry(k0, k1, 0, 2)
    b, d = threefry(k0, k1, 1, 3)
    return np.stack([a, b], 1), np.stack([c, d], 1)


def uniform(subkeys: np.ndarray) -> np.ndarray:
    """(B,) float32: `mx.random.uniform(shape=(1,), key=k)` for each row's key (one 32-bit draw,
    counter (0, 0), divided by 2**32 in float32 and kept below 1)."""
    bits = threefry(subkeys[:, 0], subkeys[:, 1], 0, 0)[0]
    return np.minimum(bits.astype(np.float32) / _SCALE, _UPPER)
