"""The quantized path's blocks on the native kernels: fewer, larger nodes per decode step.

MLX's CPU back end schedules every node of the graph for ~10 microseconds, and a decode step of a
30-layer model composed from MLX ops was ~1,200 nodes. Here a layer (model.Block, its `native`
block) is three:

* the input norm, then q, k and v as one kernel call (`linear_chain`: the three packed weights read
  side by side, each column's arithmetic its own, so the bits are those of three calls);
* RoPE and the KV cache update as one primitive (keys and values share one buffer: model/cache.py;
  native/qmm/attention.cpp), or inside the attention node where the cache's buffer is the decode's own
  (`KVCache.owned`: the copies cache.fork makes): two nodes a layer (~3% of a decode step on a 2-core CPU);
* attention, o_proj and the residual, then the MLP (its norm, gate and up as one call, SwiGLU on the
  two halves, down, plus the residual) as one: the attention node runs linear_chain's stages after
  it (`then`).

Each chained stage runs the row function its separate op runs (rms_norm, swiglu on the halves, the kernel,
an add), so the bits are those of the ops one node each. Qwen3's q/k head norms run inside the
attention nodes. `install(model)` puts this where the layout allows; anything else, and any call
the nodes do not take (another cache, an array mask, a replaced projection), keeps
the composed forward pass. Batch invariance holds as before: every row is computed alone in a fixed
order (attention.h).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx

from ..cpu import qlinear, qmm
from .cache import KVCache, PrefixedCache, RaggedCache


def _same_layout(mods) -> bool:
    return (
        all(isinstance(m, qlinear.QuantizedLinearF32) for m in mods)
        and len({(m.group_size, m.kernel_bits, m["scales"].dtype, "bias" in m) for m in mods}) == 1
    )


def _identity(layer, paths) -> tuple:
    """Which modules `fuse` checked (by path of names in the layer): the fused call is only for those."""
    ids = []
    for path in paths:
        m = layer
        for name in path:
            m = m[name]  # a Module is a dict of its children
        ids.append(id(m))
    return tuple(ids)


def _head_norms(attn) -> tuple[tuple, tuple]:
    """(weight, eps) of the q and k head norms (Qwen3), or two empty tuples: the kernel's defaults."""
    if not attn.qk_norm:
        return (), ()
    return (attn.q_norm["weight"], attn.q_norm.eps), (attn.k_norm["weight"], attn.k_norm.eps)


def _stage(mods, norm=None, swiglu: bool = False) -> tuple:
    """One linear_chain stage: the modules' weights side by side, after rms_norm or swiglu_halves."""
    m0 = mods[0]
    prologue = "rms_norm" if norm is not None else "swiglu_halves" if swiglu else ""
    weight, eps = (norm["weight"], norm.eps) if norm is not None else (None, 0.0)
    return (prologue, weight, eps, [m["weight"] for m in mods], [m["scales"] for m in mods],
            [m["biases"] for m in mods], m0.group_size, m0.kernel_bits)  # fmt: skip


def _qkv(kernel, attn, norm, h: mx.array) -> mx.array:
    """norm(h) @ [q; k; v].T (+ their biases): (B, L, (H + 2 Hk) E)."""
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    qkv = kernel.linear_chain(h, [_stage(mods, norm)])
    if "bias" in mods[0]:
        qkv = qkv + mx.concatenate([m["bias"] for m in mods])
    return qkv


class NativeBlock:
    """model.Block.__call__ on the native kernels (the modules are read at each call)."""

    ATTENTION = (("input_layernorm",),) + tuple(("self_attn", p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    MLP = (("post_attention_layernorm",),) + tuple(("mlp", p) for p in ("gate_proj", "up_proj", "down_proj"))

    def __init__(self, layer, attention: bool, mlp: bool):
        self.layer, self.kernel = layer, qmm.kernel()
        self.attention_checked = _identity(layer, self.ATTENTION) if attention else None
        self.mlp_checked = _identity(layer, self.MLP) if mlp else None

    def attention_fuses(self) -> bool:
        return self.attention_checked is not None and _identity(self.layer, self.ATTENTION) == self.attention_checked

    def mlp_fuses(self) -> bool:  # False once a projection is replaced (sharding)
        return self.mlp_checked is not None and _identity(self.layer, self.MLP) == self.mlp_checked

    def takes(self, h: mx.array, mask, cache) -> bool:
        """Whether __call__ takes this call; else model.Block composes attention (and then calls `mlp`):
        another class's cache or none, an array mask, a replaced projection."""
        if not self.attention_fuses():
            return False
        if isinstance(cache, RaggedCache):
            return True  # ragged rows: one position a row, whatever their lengths
        # a prompt of any length too: MLX's CPU softmax made its scaled_dot_product_attention ~14x slower on
        # a 2,000-token prompt than these nodes, whose scores are also the same bits in any chunking
        return isinstance(cache, KVCache) and isinstance(mask, (str, type(None)))

    def __call__(self, h: mx.array, cache: KVCache | RaggedCache) -> mx.array:
        """h (B, L, D) -> h + attn(norm(h)), then + mlp(norm(h)): norm + q/k/v of all rows in one node,
        RoPE and the cache write (one node a cache), then attention over each row's cache, o_proj, + h
        and the MLP in one node. Where the cache's buffers are their own (`owned`: a decode group's fork,
        the server's ragged rows) and there is no head norm, the attention node writes the new keys and
        values in place itself: for ragged rows 30 nodes a step where there were 30 x (A + 1)."""
        a = self.layer.self_attn
        B, L, _ = h.shape
        k, H, Hk = self.kernel, a.n_heads, a.n_kv_heads
        qkv = _qkv(k, a, self.layer.input_layernorm, h)  # (B, L, (H + 2 Hk) E)
        E = qkv.shape[-1] // (H + 2 * Hk)
        ragged = isinstance(cache, RaggedCache)
        caches, offsets = (cache.rows, cache.offsets) if ragged else ([cache], [cache.offset])
        prefix = cache.prefix if isinstance(cache, PrefixedCache) else None  # positions every row shares
        if not (ragged and cache.roomy):
            for c in caches:
                c.reserve((1 if ragged else B, Hk, L, E), E, mx.float32)
        cos, sin = a.rope.kernels.rope_table.tables(max(offsets) + L)
        qn, kn = _head_norms(a)
        in_node = cache.owned and not a.qk_norm  # written inside the attention node: one node a layer fewer
        for r, c in enumerate(caches):  # cache r holds qkv's row r (ragged), or all rows
            if not in_node:
                c.kv = k.write_cache(c.kv, qkv, cos, sin, offsets[r], H, Hk, r, *kn, base=c.base)
            c.offset += L
        kvs = [c.kv for c in caches]
        attend = partial(k.attend, qkv, cos, sin, kvs, offsets, H, Hk, a.scale, *qn)
        return self._projected(h, partial(attend, write_in_place=in_node, prefix=prefix))

    def _projected(self, h: mx.array, attend: Callable[..., mx.array]) -> mx.array:
        """h = h + o_proj(attend()), then h + mlp(norm(h)): o_proj, the residual and the MLP inside
        attend's node where o_proj has no bias and the MLP fuses (one node fewer a layer)."""
        o = self.layer.self_attn.o_proj
        if "bias" in o:
            return self.mlp(h + o(attend()))
        out_proj = (o["weight"], o["scales"], o["biases"], o.group_size, o.kernel_bits)
        if self.mlp_fuses():
            return attend(out_proj=out_proj, residual=h, then=self._mlp_stages())
        return self.mlp(attend(out_proj=out_proj, residual=h))

    def _mlp_stages(self) -> list:
        layer, m = self.layer, self.layer.mlp
        return [_stage((m.gate_proj, m.up_proj), layer.post_attention_layernorm), _stage((m.down_proj,), swiglu=True)]

    def mlp(self, h: mx.array) -> mx.array:
        """h + mlp(norm(h)): one node where the MLP fuses."""
        layer = self.layer
        if not self.mlp_fuses():
            return h + layer.mlp(layer.post_attention_layernorm(h))
        return self.kernel.linear_chain(h, self._mlp_stages(), h)


def shares_prefixes(model) -> bool:
    """Whether every layer's attention runs in a native node, which reads a PrefixedCache's shared positions
    where they lie (the composed attention would copy them into every row at every step)."""
    layers = getattr(model, "layers", None)
    return (
        bool(layers)
        and all(getattr(layer, "native", None) is not None for layer in layers)
        and all(layer.native.attention_fuses() for layer in layers)
    )


def install(model) -> None:
    """NativeBlock on model.py's blocks where their layout allows (convert.py, after Kernels.choose("native"))."""
    from .model import MLP, Attention

    if qmm.kernel() is None or not all(type(c) is KVCache for c in model.make_cache()):
        return
    for layer in model.layers:
        a, m = layer.self_attn, layer.mlp
        attention = (
            type(a) is Attention
            and type(layer.input_layernorm) is qlinear.RMSNormF32
            and (not a.qk_norm or (type(a.q_norm) is qlinear.RMSNormF32 and type(a.k_norm) is qlinear.RMSNormF32))
            and _same_layout((a.q_proj, a.k_proj, a.v_proj))
            and isinstance(a.o_proj, qlinear.QuantizedLinearF32)
        )
        mlp = (
            type(m) is MLP
            and type(layer.post_attention_layernorm) is qlinear.RMSNormF32
            and _same_layout((m.gate_proj, m.up_proj))
            and isinstance(m.down_proj, qlinear.QuantizedLinearF32)
            and not any("bias" in p for p in (m.gate_proj, m.up_proj, m.down_proj))
        )
        if attention or mlp:
            layer.native = NativeBlock(layer, attention, mlp)
