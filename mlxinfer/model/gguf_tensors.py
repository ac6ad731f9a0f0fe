"""GGUF tensors of the types `mx.load` does not read (K-quants, i-quants, Q5_0/Q5_1, ...), through the
`gguf` package's numpy dequantizer (maintained with llama.cpp), kept at the nearest MLX format:

  exact    the block's grid is an MLX affine group of 32, so the codes and each 32 values' scale and
           bias are taken from the block and mx.dequantize gives gguf-py's float32 values bit for bit:
           Q4_0 Q4_1 Q4_K -> 4-bit; Q5_0 Q5_1 Q5_K -> 5-bit; Q8_0 -> 8-bit; IQ4_NL IQ4_XS -> 8-bit (their
           16 table values are integers in -127..113: code = value + 128, scale = the block's)
  re-fit   Q2_K Q3_K Q6_K (16-value sub-blocks with a scale each: two to an MLX group) and every other
           type gguf-py dequantizes (IQ1_S ... IQ3_S, TQ1_0, TQ2_0, MXFP4, NVFP4): the float32 values,
           each group of 32 on an 8-bit grid from its min to its max (off by at most (max - min) / 510);
           a group of only -d, 0 and d (TQ1_0, TQ2_0) exactly, on the grid of step d
  float    F32 F16 BF16 as stored; any type, with `dequantize=True`: gguf-py's float32 values exactly

A tensor's scales and biases are float16 where float16 holds every one of them exactly (Q4_0, Q8_0, ...:
as mx.load keeps them), else float32 (a K-quant's d * sc has up to 17 significant bits). Sizes come from
the header, checked against the file before anything is read; tensors are converted a few rows at a
time, so the float32 values of a large tensor are never all held at once.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import MlxinferError
from ..formats.gguf import GGUFHeader, GGUFTensor
from ..formats.ggml_types import BY_NAME, EXACT_BITS, REFIT, REFIT_BITS

# exact types: the unit block (the block's scales set so that gguf-py returns its integer codes: byte
# offset -> bytes), and the offset that turns those into MLX's unsigned codes
_ONE, _ZERO = np.float16(1).tobytes(), np.float16(0).tobytes()
_K_UNIT = {0: _ONE, 2: _ZERO, 4: bytes([1] * 4 + [0] * 4 + [1] * 4)}  # every 6-bit scale 1, every min 0
EXACT: dict[str, tuple[dict[int, bytes], int]] = {
    "Q4_0": ({0: _ONE}, 8),
    "Q4_1": ({0: _ONE, 2: _ZERO}, 0),
    "Q5_0": ({0: _ONE}, 16),
    "Q5_1": ({0: _ONE, 2: _ZERO}, 0),
    "Q8_0": ({0: _ONE}, 128),
    "Q4_K": (_K_UNIT, 0),
    "Q5_K": (_K_UNIT, 0),
    "IQ4_NL": ({0: _ONE}, 128),
    "IQ4_XS": ({0: _ONE, 2: bytes([0xAA, 0xAA, 0x11, 0x11, 0x11, 0x11])}, 128),  # every 6-bit scale 33
}
FLOAT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16: its bits
SUPPORTED = set(EXACT) | REFIT | set(FLOAT)
GROUP = 32
CHUNK_VALUES = 1 << 22  # float32 values converted at a time (16 MiB), per thread
MAX_THREADS = 8


def check_types(header: GGUFHeader) -> None:
    """Every tensor of a type this module reads, before a byte is read."""
    for t in header.tensors:
        if t.type_name not in SUPPORTED:
            raise MlxinferError(
                f"{header.path}: tensor '{t.name}' is {t.type_name}, which the gguf package cannot dequantize; "
                "re-quantize the model with llama.cpp's llama-quantize to a K-quant (Q4_K_M, Q6_K) or Q8_0",
                "source",
            )


def read(header: GGUFHeader, names, dequantize: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """The tensors named (GGUF names) -> {"weight": ..., "scales": ..., "biases": ...} (numpy; float
    tensors and `dequantize=True` give "weight" alone)."""
    check_types(header)
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    out = {}
    for t in header.tensors:
        if t.name not in names:
            continue
        start = header.data_offset + t.offset
        raw = data[start : start + t.nbytes]
        if raw.size != t.nbytes:  # the file shrank since its header was read
            raise MlxinferError(
                f"{header.path} is truncated: tensor '{t.name}' needs {t.nbytes:,} bytes, the file holds "
                f"{raw.size:,} of them; re-download it",
                "source",
            )
        out[t.name] = _convert(t, raw, dequantize)
    return out


def _convert(t: GGUFTensor, raw: np.ndarray, dequantize: bool) -> dict[str, np.ndarray]:
    cols = t.shape[-1]
    rows = t.n_elements // cols
    if t.type_name in FLOAT:
        weight = raw.view(FLOAT[t.type_name]).reshape(t.shape)
        if dequantize and t.type_name == "BF16":  # a bfloat16 is the top half of its float32
            weight = (weight.astype(np.uint32) << 16).view(np.float32)
        return {"weight": weight.astype(np.float32) if dequantize else weight}
    row_bytes = t.nbytes // rows
    blocks = raw.reshape(rows, row_bytes)
    if dequantize or len(t.shape) != 2:  # a quantized vector or a stack: float32, as gguf-py gives it
        return {"weight": _chunks(blocks, cols, lambda b: _values(t.type_name, b)).reshape(t.shape)}
    bits = EXACT_BITS.get(t.type_name, REFIT_BITS)
    convert = _exact if t.type_name in EXACT else _refit
    weight = np.empty((rows, cols * bits // 32), np.uint32)
    scales, biases = (np.empty((rows, cols // GROUP), np.float32) for _ in range(2))

    def rows_from(r: int) -> None:  # each chunk writes its own rows: no result is held past its chunk
        weight[r : r + step], scales[r : r + step], biases[r : r + step] = convert(t.type_name, blocks[r : r + step])

    step = max(1, CHUNK_VALUES // cols)
    _each(rows_from, range(0, rows, step))
    scales, biases = _narrow(scales, biases)
    return {"weight": weight, "scales": scales, "biases": biases}


def _chunks(blocks: np.ndarray, cols: int, fn) -> np.ndarray:
    out = np.empty((blocks.shape[0], cols), np.float32)
    step = max(1, CHUNK_VALUES // cols)

    def rows_from(r: int) -> None:
        out[r : r + step] = fn(blocks[r : r + step])

    _each(rows_from, range(0, blocks.shape[0], step))
    return out


def _each(fn, starts) -> None:
    """fn(start) for every chunk, on up to one thread per core (numpy lets go of the GIL in its loops)."""
    starts = list(starts)
    workers = min(len(starts), os.cpu_count() or 1, MAX_THREADS)
    if workers < 2:
        for r in starts:
            fn(r)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, starts):  # re-raises a chunk's error here
            pass


def _values(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf-py's float32 dequantization of rows of blocks (a corrupt block's inf or NaN without numpy's
    warnings: the forward pass's check names it in one line)."""
    import gguf.quants as gq

    with np.errstate(over="ignore", invalid="ignore"):
        return gq.dequantize(np.ascontiguousarray(blocks), gq.GGMLQuantizationType[type_name])


def _exact(type_name: str, blocks: np.ndarray):
    """Rows of exact-type blocks -> (packed codes, scales, biases) whose affine dequantization is gguf-py's."""
    bits, (unit, offset) = EXACT_BITS[type_name], EXACT[type_name]
    block_values, block_bytes = BY_NAME[type_name]
    rows = blocks.shape[0]
    per_row = blocks.shape[1] // block_bytes
    b = blocks.reshape(rows * per_row, block_bytes)
    units = b.copy()
    for at, value in unit.items():
        units[:, at : at + len(value)] = np.frombuffer(value, np.uint8)
    codes = _values(type_name, units.reshape(blocks.shape)) + offset  # small integers, exact in float32
    with np.errstate(over="ignore", invalid="ignore"):  # a corrupt block's inf or NaN: refused downstream
        scale, bias = _grid(type_name, b, offset, blocks.shape)
    groups = block_values // GROUP
    return _pack(codes.astype(np.uint8), bits), scale.reshape(rows, per_row * groups), bias.reshape(rows, -1)


def _grid(type_name: str, b: np.ndarray, offset: int, row_shape) -> tuple[np.ndarray, np.ndarray]:
    """Each group of 32's (scale, bias), computed as gguf-py computes them (float32 products of the
    block's float16 and integer fields, so exact), (blocks, groups per block)."""
    import gguf.quants as gq

    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)  # (blocks, 1): every exact type starts with d
    if type_name in ("Q4_1", "Q5_1"):
        return d, b[:, 2:4].copy().view(np.float16).astype(np.float32)
    if type_name in ("Q4_K", "Q5_K"):
        sc, m = gq.Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
        dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))
    if type_name == "IQ4_XS":
        probe = b.copy()  # every index 8, the table's value 1: gguf-py returns each group's scale d * (ls - 32)
        probe[:, 8:] = 0x88
        scale = _values(type_name, probe.reshape(row_shape)).reshape(len(b), -1)[:, ::GROUP]
        return scale, -offset * scale
    return d, -offset * d  # Q4_0, Q5_0, Q8_0, IQ4_NL: w = d * (code - offset)


def _refit(type_name: str, blocks: np.ndarray):
    """gguf-py's float32 values, each group of 32 on an 8-bit affine grid from its min to its max; a group
    of only -d, 0 and d (the ternary TQ1_0 and TQ2_0) on the grid of step d from -d, which holds all three
    exactly (on the min-to-max grid 0 fell between two codes: each zero off by d / 255, all the same way)."""
    values = _values(type_name, blocks)
    rows, cols = values.shape
    g = values.reshape(rows, cols // GROUP, GROUP)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # a corrupt block's inf or NaN: refused
        lo, hi = g.min(-1), g.max(-1)  # downstream, as in _values
        d = np.maximum(-lo, hi)
        ternary = (d > 0) & ((g == 0) | (np.abs(g) == d[..., None])).all(-1)
        scale = np.where(ternary, d, (hi - lo) / np.float32(2**REFIT_BITS - 1))
        lo = np.where(ternary, -d, lo)
        codes = np.where(scale[..., None] > 0, np.rint((g - lo[..., None]) / scale[..., None]), 0)
        codes = np.clip(codes, 0, 2**REFIT_BITS - 1).astype(np.uint8).reshape(rows, cols)
    return _pack(codes, REFIT_BITS), scale, lo


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) codes -> MLX's packing: one little-endian bit stream per row, in uint32 words."""
    rows, cols = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    if bits == 4:
        return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.uint32)
    eight = codes.reshape(rows, cols // 8, 8).astype(np.uint64)  # eight codes fill `bits` whole bytes
    stream = (eight << (np.arange(8, dtype=np.uint64) * np.uint64(bits))).sum(-1, dtype=np.uint64)
    packed = stream.reshape(rows, cols // 8, 1).view(np.uint8)[:, :, :bits]
    return np.ascontiguousarray(packed).reshape(rows, cols * bits // 8).view(np.uint32)


def _narrow(scales: np.ndarray, biases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both in float16 where it holds every value of both exactly, else both float32 as given."""
    with np.errstate(over="ignore", invalid="ignore"):  # NaN or huge: they stay float32
        halves = scales.astype(np.float16), biases.astype(np.float16)
    pairs = zip(halves, (scales, biases))
    exact = all(np.isfinite(h).all() and np.array_equal(h.astype(np.float32), x) for h, x in pairs)
    return halves if exact else (scales, biases)
