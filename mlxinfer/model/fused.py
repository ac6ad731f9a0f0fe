"""The quantized path's fused layers: fewer, larger nodes per decode step.

MLX's CPU back end schedules every node of the graph for a few microseconds, and a decode step of
a 30-layer model composed from MLX ops was ~1,200 nodes. Here, per layer:

* q, k and v projections as one kernel call (`quantized_matmul_cat`: the three packed weights read
  side by side, each column's arithmetic its own, so the bits are those of three calls);
* RoPE and the KV cache update as one primitive per cache, attention as one (native/qmm/attention.cpp);
* gate and up projections as one kernel call and SwiGLU on its two halves.

A layer is 12 nodes instead of ~39; Qwen3's q/k head norms run inside the attention nodes.
`fuse(model)` installs this on model.py's Attention and MLP (their `fused` hook) where the layout
allows; anything else keeps the composed forward pass.
Batch invariance holds as before: every row is computed alone in a fixed order (attention.h).
"""

from __future__ import annotations

import mlx.core as mx

from ..cpu import qlinear, qmm
from .cache import KVCache

# Above this many query x key pairs per head, prefill attention goes through MLX's
# scaled_dot_product_attention (BLAS matmuls) instead of the primitive's per-query loop.
MAX_FUSED_PAIRS = 1 << 16


def _same_layout(mods) -> bool:
    return (
        all(isinstance(m, qlinear.QuantizedLinearF32) for m in mods)
        and len({(m.group_size, m.bits, m["scales"].dtype, "bias" in m) for m in mods}) == 1
    )


def _identity(module, names) -> tuple:
    """Which projection modules `fuse` checked: the fused call is only for those."""
    return tuple(id(module[n]) for n in names)


def _head_norms(attn) -> tuple[tuple, tuple]:
    """(weight, eps) of the q and k head norms (Qwen3), or two empty tuples: the kernel's defaults."""
    if not attn.qk_norm:
        return (), ()
    return (attn.q_norm["weight"], attn.q_norm.eps), (attn.k_norm["weight"], attn.k_norm.eps)


def _matmul_cat(x: mx.array, mods) -> mx.array:
    m0 = mods[0]
    y = qmm.kernel().quantized_matmul_cat(
        x, [m["weight"] for m in mods], [m["scales"] for m in mods], [m["biases"] for m in mods], m0.group_size, m0.bits
    )
    if "bias" in m0:
        y = y + mx.concatenate([m["bias"] for m in mods])
    return y


class FusedAttention:
    """model.Attention.__call__ for the quantized path (its projections are read at each call)."""

    def __init__(self, attn):
        self.attn, self.checked = attn, _identity(attn, ("q_proj", "k_proj", "v_proj"))

    def __call__(self, x: mx.array, mask, cache) -> mx.array:
        a = self.attn
        B, L, _ = x.shape
        if (
            _identity(a, ("q_proj", "k_proj", "v_proj")) != self.checked  # replaced since (sharding)
            or not isinstance(cache, KVCache)  # none, or another class's cache: the composed pass handles it
            or not isinstance(mask, (str, type(None)))
            or L * (cache.offset + L) > MAX_FUSED_PAIRS
        ):
            return a.composed(x, mask, cache)
        qkv = _matmul_cat(x, (a.q_proj, a.k_proj, a.v_proj))  # (B, L, (H + 2 Hk) E)
        E = qkv.shape[-1] // (a.n_heads + 2 * a.n_kv_heads)
        cos, sin = a.rope._table.tables(cache.offset + L)
        cache.reserve((B, a.n_kv_heads, L, E), E, mx.float32)
        k, H, Hk, at = qmm.kernel(), a.n_heads, a.n_kv_heads, cache.offset
        qn, kn = _head_norms(a)
        cache.keys = k.write_cache(cache.keys, qkv, cos, sin, at, H, Hk, False, -1, *kn)
        cache.values = k.write_cache(cache.values, qkv, cos, sin, at, H, Hk, True)
        out = k.attend(qkv, cos, sin, cache.keys, cache.values, at, H, Hk, a.scale, -1, *qn)
        cache.offset += L
        return a.o_proj(out)  # (B, L, H E) -> (B, L, D)


def attention_per_row(attn, x: mx.array, caches: list[KVCache]) -> mx.array:
    """rows.py's attention for rows that each have their own one-row cache (and length): q/k/v of all
    rows in one kernel call, then each row's RoPE, cache writes and attention at its own offset, three
    nodes a row (the composed walk was ~14)."""
    A, H, Hk = x.shape[0], attn.n_heads, attn.n_kv_heads
    qkv = _matmul_cat(x, (attn.q_proj, attn.k_proj, attn.v_proj))  # (A, 1, (H + 2 Hk) E)
    E = qkv.shape[-1] // (H + 2 * Hk)
    cos, sin = attn.rope._table.tables(max(c.offset for c in caches) + 1)
    k, outs = qmm.kernel(), []
    qn, kn = _head_norms(attn)
    for r, cache in enumerate(caches):
        cache.reserve((1, Hk, 1, E), E, mx.float32)
        at = cache.offset
        cache.keys = k.write_cache(cache.keys, qkv, cos, sin, at, H, Hk, False, r, *kn)
        cache.values = k.write_cache(cache.values, qkv, cos, sin, at, H, Hk, True, r)
        outs.append(k.attend(qkv, cos, sin, cache.keys, cache.values, at, H, Hk, attn.scale, r, *qn))
        cache.offset = at + 1
    return attn.o_proj(mx.concatenate(outs) if A > 1 else outs[0])  # (A, 1, H E) -> (A, 1, D)


class FusedMLP:
    """model.MLP.__call__ with gate and up as one matmul."""

    def __init__(self, mlp):
        self.mlp, self.checked = mlp, _identity(mlp, ("gate_proj", "up_proj"))

    def __call__(self, x: mx.array) -> mx.array:
        m = self.mlp
        if _identity(m, ("gate_proj", "up_proj")) != self.checked:  # replaced since (sharding)
            return m.composed(x)
        return m.down_proj(qmm.kernel().swiglu_halves(_matmul_cat(x, (m.gate_proj, m.up_proj))))


def fuse(model) -> int:
    """Install the fused layers on model.py's blocks where their layout allows; returns how many."""
    from .model import MLP, Attention

    if (
        qmm.kernel() is None
        or not hasattr(model, "make_cache")
        or not all(type(c) is KVCache for c in model.make_cache())
    ):
        return 0
    count = 0
    for layer in model.layers:
        a = layer.self_attn
        if (
            type(a) is Attention
            and (not a.qk_norm or (type(a.q_norm) is qlinear.RMSNormF32 and type(a.k_norm) is qlinear.RMSNormF32))
            and isinstance(a.rope._table, qlinear.RopeTableF32)
            and _same_layout((a.q_proj, a.k_proj, a.v_proj))
        ):
            a.fused = FusedAttention(a)
            count += 1
        m = layer.mlp
        if type(m) is MLP and m.activation is qlinear.swiglu and _same_layout((m.gate_proj, m.up_proj)):
            if "bias" not in m.gate_proj:
                m.fused = FusedMLP(m)
                count += 1
    return count
