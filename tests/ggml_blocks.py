"""K-quant and i-quant blocks written with numpy in llama.cpp's layouts, for tests.

The `gguf` package dequantizes these types but cannot quantize them, so the tests build the raw blocks
here: each function takes float32 rows (a multiple of the type's block per row) and returns the uint8
blocks, (rows, bytes per row). The scale choices are simple (min/max per sub-block, never llama.cpp's
search), so the files are valid but not llama.cpp's best; test_ggml_blocks.py checks that the package's
own dequantizer reads every layout back within the type's step. Written from ggml's block structs
(block_q4_K and friends), not from mlxinfer's loader.
"""

from __future__ import annotations

import numpy as np

QK = 256  # a K-quant super-block
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _f16(x: np.ndarray) -> np.ndarray:
    """float32 -> the float16 bytes of each value, (..., 2), and the float16 values back as float32."""
    h = x.astype(np.float16)
    return h.reshape(*h.shape, 1).view(np.uint8), h.astype(np.float32)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    rows, cols = x.shape
    assert cols % size == 0, f"rows of {cols} values are no whole number of {size}-value blocks"
    return x.astype(np.float32).reshape(rows * cols // size, size)


def _rows(blocks: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(blocks).reshape(rows, -1)


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins -> the 12 bytes of block_q4_K/block_q5_K's `scales`."""
    low = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    mid = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    high = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return np.concatenate([low, mid, high], axis=1).astype(np.uint8)


def _affine_sub_blocks(x: np.ndarray, levels: int, scale_levels: int):
    """Sub-blocks of (n, sub, size) to w = d*sc*q - dmin*m: (d bytes, dmin bytes, sc, m, q)."""
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    scale, offset = (hi - lo) / levels, -lo
    d_bytes, d = _f16(scale.max(-1) / scale_levels)
    m_bytes, dmin = _f16(offset.max(-1) / scale_levels)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, scale_levels).astype(np.uint8)
    m = np.clip(np.rint(_div(offset, dmin[:, None])), 0, scale_levels).astype(np.uint8)
    step, base = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_div(x + base[..., None], step[..., None])), 0, levels).astype(np.uint8)
    return d_bytes, m_bytes, sc, m, q


def q4_k(x: np.ndarray) -> np.ndarray:
    """block_q4_K (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit q."""
    b = _blocks(x, QK).reshape(-1, 8, 32)
    d, dmin, sc, m, q = _affine_sub_blocks(b, 15, 63)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # 32 bytes hold sub-blocks 2c (low) and 2c+1 (high)
    return _rows(np.concatenate([d, dmin, _k_scales(sc, m), qs], axis=1), x.shape[0])


def q5_k(x: np.ndarray) -> np.ndarray:
    """block_q5_K (176 bytes): q4_K's header, 32 bytes of fifth bits (bit i: sub-block i), 128 of low nibbles."""
    b = _blocks(x, QK).reshape(-1, 8, 32)
    d, dmin, sc, m, q = _affine_sub_blocks(b, 31, 63)
    low, high = q & 0xF, q >> 4
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    qh = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8)  # (n, 32)
    return _rows(np.concatenate([d, dmin, _k_scales(sc, m), qh, qs], axis=1), x.shape[0])


def q6_k(x: np.ndarray) -> np.ndarray:
    """block_q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2 bits, 16 int8 scales, d (f16);
    w = d * scale * (q - 32) over 16-value sub-blocks."""
    b = _blocks(x, QK)
    n = b.shape[0]
    scale = np.abs(b.reshape(n, 16, 16)).max(-1) / 31
    d_bytes, d = _f16(scale.max(-1) / 127)
    sc = np.clip(np.rint(_div(scale, d[:, None])), -128, 127)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(_div(b.reshape(n, 16, 16), step)), -32, 31) + 32).astype(np.uint8).reshape(n, 8, 32)
    low = (q & 0xF).reshape(n, 2, 2, 2, 32)  # [half][nibble][which 32 of the 64 bytes][byte]
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)  # [half][2-bit field][byte]
    qh = (high << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2, dtype=np.uint8).reshape(n, 64)
    return _rows(np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d_bytes], axis=1), x.shape[0])


def q3_k(x: np.ndarray) -> np.ndarray:
    """block_q3_K (110 bytes): 32 bytes of high bits (hmask), 64 of low 2 bits, 12 of 6-bit scales, d (f16);
    w = d * (scale - 32) * q, q in -4..3, over 16-value sub-blocks."""
    b = _blocks(x, QK)
    n = b.shape[0]
    scale = np.abs(b.reshape(n, 16, 16)).max(-1) / 4
    d_bytes, d = _f16(scale.max(-1) / 31)
    sc = np.clip(np.rint(_div(scale, d[:, None])), -32, 31)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(_div(b.reshape(n, 16, 16), step)), -4, 3) + 4).astype(np.uint8).reshape(n, 256)
    s6 = (sc + 32).astype(np.uint8)
    s_low, s_high = s6 & 0xF, s6 >> 4
    shifts = (2 * np.arange(4, dtype=np.uint8))[:, None]
    s_high = (s_high.reshape(n, 4, 4) << shifts).sum(1, dtype=np.uint8)  # byte 8 + k: 2 bits of scales k, 4+k, ...
    scales = np.concatenate([s_low[:, :8] | (s_low[:, 8:] << 4), s_high], axis=1)
    ql = (q & 3).reshape(n, 2, 4, 32)
    qs = (ql << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2, dtype=np.uint8).reshape(n, 64)
    hbit = (q >> 2).reshape(n, 8, 32)
    hmask = (hbit << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8)
    return _rows(np.concatenate([hmask, qs, scales, d_bytes], axis=1), x.shape[0])


def q2_k(x: np.ndarray) -> np.ndarray:
    """block_q2_K (84 bytes): 16 bytes of 4-bit scale | 4-bit min, 64 of 2-bit q, d, dmin (f16);
    w = d * scale * q - dmin * min over 16-value sub-blocks."""
    b = _blocks(x, QK)
    n = b.shape[0]
    d, dmin, sc, m, q = _affine_sub_blocks(b.reshape(n, 16, 16), 3, 15)
    ql = q.reshape(n, 2, 4, 32)
    qs = (ql << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2, dtype=np.uint8).reshape(n, 64)
    return _rows(np.concatenate([sc | (m << 4), qs, d, dmin], axis=1), x.shape[0])


def _nearest_iq4(x: np.ndarray) -> np.ndarray:
    return np.abs(x[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def iq4_nl(x: np.ndarray) -> np.ndarray:
    """block_iq4_nl (18 bytes, 32 values): d (f16), 16 bytes of 4-bit indices into the non-linear table."""
    b = _blocks(x, 32)
    d_bytes, d = _f16(np.abs(b).max(-1) / 127)
    idx = _nearest_iq4(_div(b, d[:, None]))
    qs = idx[:, :16] | (idx[:, 16:] << 4)
    return _rows(np.concatenate([d_bytes, qs], axis=1), x.shape[0])


def iq4_xs(x: np.ndarray) -> np.ndarray:
    """block_iq4_xs (136 bytes): d (f16), 2 bytes of scales' high bits, 4 of low nibbles, 128 of indices;
    w = d * (scale - 32) * table[index] over 32-value sub-blocks."""
    b = _blocks(x, QK).reshape(-1, 8, 32)
    n = b.shape[0]
    scale = np.abs(b).max(-1) / 127
    d_bytes, d = _f16(scale.max(-1) / 31)
    ls = np.clip(np.rint(_div(scale, d[:, None])), -32, 31)
    idx = _nearest_iq4(_div(b, (d[:, None] * ls)[..., None]))
    s6 = (ls + 32).astype(np.uint16)
    scales_h = ((s6 >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(1, dtype=np.uint16)
    low = (s6 & 0xF).astype(np.uint8)
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)
    qs = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(n, 128)
    return _rows(np.concatenate([d_bytes, scales_h[:, None].view(np.uint8), scales_l, qs], axis=1), x.shape[0])


def q8_k(x: np.ndarray) -> np.ndarray:
    """block_q8_K (292 bytes): d (float32), 256 int8 q, 16 int16 sums of 16 q each (ggml's activation type)."""
    b = _blocks(x, QK)
    d = (np.abs(b).max(-1, keepdims=True) / 127).astype(np.float32)
    q = np.clip(np.rint(_div(b, d)), -127, 127).astype(np.int8)
    sums = q.reshape(-1, 16, 16).sum(-1, dtype=np.int16)
    return _rows(np.concatenate([d.view(np.uint8), q.view(np.uint8), sums.view(np.uint8)], axis=1), x.shape[0])


WRITERS = {"Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}
ACTIVATION_TYPES = {"Q8_K": q8_k}  # the package cannot dequantize it: for the tests of that error


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """Raw blocks of `type_name` for float32 rows x: this module's writers, else the gguf package's quantizer."""
    if type_name in WRITERS or type_name in ACTIVATION_TYPES:
        return {**WRITERS, **ACTIVATION_TYPES}[type_name](x)
    import gguf

    return gguf.quants.quantize(x.astype(np.float32), gguf.GGMLQuantizationType[type_name])
