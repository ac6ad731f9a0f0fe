"""A GGUF's RoPE settings as config.json's `rope_scaling`.

llama.cpp's converter writes linear scaling as metadata (`{arch}.rope.scaling.type`, `.factor`) and
Llama 3.1's scaling as a tensor, `rope_freqs.weight`: one factor per rotary pair (the frequency is divided
by it). The factors come from four numbers (factor, low_freq_factor, high_freq_factor and the original
context); they are recovered here and accepted only when they give every stored factor back, so the
model's own llama3 RoPE computes what llama.cpp computes. Anything else is one line saying so.
"""

from __future__ import annotations

import math
import struct

from ..errors import MlxinferError

LOW, HIGH = 1.0, 4.0  # Llama 3.1, 3.2 and 3.3's low_freq_factor and high_freq_factor
ORIGINAL_CONTEXT = 8192  # their original_max_position_embeddings
TOLERANCE = 1e-5  # relative: the stored factors are float32


def rope_scaling(header, arch: str, head_dim: int, base: float) -> dict | None:
    """config.json's rope_scaling for this file, or None for plain RoPE."""
    m = header.metadata
    kind = m.get(f"{arch}.rope.scaling.type")
    tensor = next((t for t in header.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is not None:
        return _llama3(header, tensor, head_dim, base, m.get(f"{arch}.rope.scaling.original_context_length"))
    if kind in (None, "none"):
        return None
    factor = m.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and isinstance(factor, (int, float)) and factor > 0:
        return {"rope_type": "linear", "factor": float(factor)}
    raise MlxinferError(
        f"{header.path}: {arch}.rope.scaling.type {kind!r} (factor {factor!r}) is not a RoPE scaling this loader "
        "applies (linear and Llama 3's are); use the model's safetensors checkpoint"
    )


def llama3_factors(head_dim: int, base: float, factor: float, original: float, low=LOW, high=HIGH) -> list[float]:
    """The factor each rotary pair's frequency is divided by, as convert_hf_to_gguf.py computes them."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama3(header, tensor, head_dim: int, base: float, original) -> dict:
    stored = _read_f32(header, tensor, head_dim // 2)
    factor = max(stored)
    candidates = [c for c in (original, ORIGINAL_CONTEXT) if isinstance(c, int) and c > 0]
    for i, r in enumerate(stored):  # a pair on the ramp gives the original context outright
        if 1 < r < factor:
            smooth = (1 / r - 1 / factor) / (1 - 1 / factor)
            candidates.append(round(2 * math.pi * base ** (2 * i / head_dim) * (smooth * (HIGH - LOW) + LOW)))
    for c in candidates:
        want = llama3_factors(head_dim, base, factor, c)
        if all(abs(a - b) <= TOLERANCE * b for a, b in zip(stored, want)):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": LOW,
                "high_freq_factor": HIGH,
                "original_max_position_embeddings": c,
            }
    raise MlxinferError(
        f"{header.path}: rope_freqs.weight holds RoPE factors that Llama 3's scaling does not give (factor "
        f"{factor:g}); this loader applies only those: use the model's safetensors checkpoint"
    )


def _read_f32(header, tensor, n: int) -> list[float]:
    if tensor.type_name != "F32" or tensor.shape != (n,):
        raise MlxinferError(
            f"{header.path}: rope_freqs.weight is {tensor.type_name} {list(tensor.shape)}, not {n} F32 factors "
            "(one per rotary pair); the file is corrupt"
        )
    with open(header.path, "rb") as f:  # its place in the file was checked with the header
        f.seek(header.data_offset + tensor.offset)
        data = f.read(4 * n)
    if len(data) != 4 * n:
        raise MlxinferError(f"{header.path} is truncated inside rope_freqs.weight; re-download it")
    values = list(struct.unpack(f"<{n}f", data))
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise MlxinferError(f"{header.path}: rope_freqs.weight holds factors that are not positive numbers")
    return values
