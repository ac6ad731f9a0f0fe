"""Two ops the float32 CPU path computes its own way, because MLX's CPU versions are slow.

MLX's CPU back end evaluates exp, sigmoid, tanh, sin and cos one element at a time
(tens of times slower than a multiply), and its `mx.fast.rope` falls back on the CPU to a
chain of small ops that recomputes cos and sin on every call. On the float32 path, where
the matmuls go through a fast BLAS, these became a large share of prefill and decode
(docs/performance.md, "The float32 path's own ops").

  swiglu        silu(gate) * up with exp built from multiplies, adds and a bit shift,
                which MLX runs as one compiled elementwise kernel; within 3e-7
                relative of exp (tests/test_cpu_kernels.py).
  RopeTable     cos/sin of every position computed once (in float64, then rounded),
                so applying RoPE is a slice, four multiplies and a concatenate.
  logsumexp     the sampler's normalisation with the same exp (decode.py), so a batch
                of rows is not held up by 49k slow exps per row per step.
  exp_kept,     the sampler's softmax and the exps of its cuts (sampler/stages.py with
  softmax       fast=True) with the same exp: 32 rows of 49k scores took ~19 ms an exp
                pass through MLX's exp, a top-k cut's probabilities ~90 ms.
  top_k, top_p, the three cuts as one native node each (sampler/stages.py with fast=True): MLX's
  typical_p     CPU sort of one row of 49k scores took ~4 ms, a third of a decode step, its
                argpartition ~0.4 ms.

The model uses these only after `model/convert.py`'s to_float32 on a CPU device
(model/compute.py's Kernels, chosen at load); the as-loaded path keeps MLX's own ops, bit for bit the
same as mlx-lm's.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

_LN2_HI, _LN2_LO = 0.693145751953125, 1.42860682030941723212e-6  # ln 2 = hi + lo, hi exact in 12 bits
_EXP_COEFFS = tuple(1 / math.factorial(k) for k in range(7, -1, -1))  # Taylor, degree 7, highest first


def exp(x: mx.array) -> mx.array:
    """float32 e**x: x = n ln2 + r with |r| <= ln2/2, e**r by a degree-7 polynomial, 2**n by exponent bits."""
    x = mx.clip(x, -87.0, 88.0)  # beyond these float32 underflows to ~0 / overflows; 2**n must stay normal
    n = mx.floor(x * (1 / math.log(2)) + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO  # Cody-Waite: n * ln2 subtracted in two exact-ish steps
    p = mx.array(_EXP_COEFFS[0], mx.float32)
    for c in _EXP_COEFFS[1:]:
        p = p * r + c
    two_n = mx.left_shift(n.astype(mx.int32) + 127, 23).view(mx.float32)  # the float with exponent n
    return p * two_n


@mx.compile
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up = gate / (1 + e**-gate) * up, fused into one kernel per shape."""
    return gate / (1 + exp(-gate)) * up


@mx.compile
def _exp_shifted_sum(x: mx.array, m: mx.array) -> mx.array:
    e = mx.where(x == -math.inf, 0.0, exp(x - m))  # a token cut to -inf adds exactly 0
    return mx.sum(e, axis=-1, keepdims=True)


def logsumexp(x: mx.array) -> mx.array:
    """log(sum(e**x)) over the last axis, kept: the max plus the log of the shifted sum, with the
    polynomial exp (MLX's CPU exp takes ~18 ns an element: 60 ms a step for 64 rows of 49k scores)."""
    m = mx.max(x, axis=-1, keepdims=True)
    return m + mx.log(_exp_shifted_sum(x, m))


def log_softmax(x: mx.array) -> mx.array:
    """x - logsumexp(x) over the last axis: one node of the quantized path's extension where it is
    loaded (MLX's logsumexp on a CPU was ~1.2 ms a decode step for 49k scores), else logsumexp above."""
    native = _native()
    return native.log_softmax(x) if native is not None else x - logsumexp(x)


@mx.compile
def exp_kept(x: mx.array) -> mx.array:
    """e**x with the polynomial exp, exactly 0 where x is -inf (a token a cut removed)."""
    return mx.where(x == -math.inf, 0.0, exp(x))


def softmax(x: mx.array) -> mx.array:
    """e**log_softmax(x) over the last axis with the polynomial exp: one node of the extension where it is
    loaded, else log_softmax above and exp_kept."""
    native = _native()
    return native.softmax(x) if native is not None else exp_kept(log_softmax(x))


def top_k(x: mx.array, k: int) -> mx.array | None:
    """apply_top_k's cut as the extension's one node (one pass with a heap of the k highest; MLX's CPU
    argpartition of a 49k row took ~0.4 ms), or None where the extension is not loaded."""
    native = _native()
    return native.top_k(x, k) if native is not None else None


def top_p(x: mx.array, p: float, min_tokens_to_keep: int = 1) -> mx.array | None:
    """apply_top_p's cut as the extension's one node (a partial sort of the top tokens), or None where the
    extension is not loaded."""
    native = _native()
    return native.top_p(x, p, min_tokens_to_keep) if native is not None else None


def typical_p(x: mx.array, p: float, min_tokens_to_keep: int = 1) -> mx.array | None:
    """apply_typical_p's cut as the extension's one node (a partial sort by the distance from the entropy),
    or None where the extension is not loaded."""
    native = _native()
    return native.typical_p(x, p, min_tokens_to_keep) if native is not None else None


def _native():
    from . import qmm

    return qmm.kernel() if qmm.available(build_if_missing=False) else None


@mx.compile
def _rotate_half(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class RopeTable:
    """Non-interleaved RoPE (Hugging Face layout) from a cos/sin table that grows as positions are used.

    inv_freq: (E/2,) radians per position; scale: positions are multiplied by it (linear scaling).
    """

    def __init__(self, inv_freq: np.ndarray, scale: float, max_positions: int):
        self.inv_freq = np.asarray(inv_freq, np.float64)
        self.scale, self.max_positions = scale, max_positions
        self.cos = self.sin = None  # (P, E/2) float32

    def _grow(self, needed: int) -> None:
        size = 256
        while size < needed:
            size *= 2
        size = max(needed, min(size, self.max_positions))
        angles = np.arange(size, dtype=np.float64)[:, None] * self.scale * self.inv_freq[None]
        self.cos = mx.array(np.cos(angles).astype(np.float32))
        self.sin = mx.array(np.sin(angles).astype(np.float32))

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        """x: (B, heads, L, E) for positions offset .. offset + L - 1."""
        L = x.shape[2]
        if self.cos is None or offset + L > self.cos.shape[0]:
            self._grow(offset + L)
        cos, sin = self.cos[offset : offset + L], self.sin[offset : offset + L]  # (L, E/2)
        return _rotate_half(x, cos, sin)
