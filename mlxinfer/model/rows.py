"""One decode step for rows that each have their own KV cache (and so their own length).

The server's rows come from different requests: their prompts differ in length, so they cannot
share one (B, K, T, E) cache. Each row keeps a one-row cache of its own. The projections, norms
and MLP have no notion of position, so they run batched over all rows (one matmul reads the weights
once for everyone); only RoPE (each row at its own offset), the cache update and attention run per
row. That is the layer walk of model.py's Block/Attention, taken apart where position matters.

Batch invariance: on the weights as stored, MLX's CPU quantized matmul gives a row the same bits
alone or in a batch, and every per-row op here is the op model.py runs for a one-row batch, on the
same shapes, so a row's scores are the bits `Model.__call__` gives it alone (tests/test_serve.py
checks text against `mlxinfer.sample`). The quantized path's kernel and its fused attention
(fused.FusedBlock.attention_rows: one cache write a row, one attention node for all rows) compute
every row alone too, so the same holds there by construction. On the float32 BLAS path, sgemm over
A rows and sgemv over one differ in the last bits, as in decode.py's batches.

Only our own definitions (model.py) are walked here; mlx-lm's classes keep their own forward pass
(`supports` is False) and the batcher runs one forward per request for them.
"""

from __future__ import annotations

import mlx.core as mx

from .cache import KVCache
from .model import Model


def supports(model) -> bool:
    """True where `step` can walk the layers: our Model, unsplit (a split model's layers end in
    collectives that every rank must run in the same order), with our KV cache."""
    if not isinstance(model, Model) or getattr(model.info, "sharding", None):
        return False
    attn = model.layers[0].self_attn
    return all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads"))


EVAL_EVERY = 10  # layers built before they start to run: a one-row step's graph takes ~2 ms of its ~8 to build


def step(model: Model, tokens: mx.array, caches: list[list[KVCache]], owned: bool = False) -> mx.array:
    """Scores (A, V) for the next token of each row: `tokens` (A,) are the tokens just drawn and
    caches[r] is row r's one-row cache (a list over layers), updated in place.

    owned: each row's cache arrays are held by nothing else that must keep their old contents (the
    server's rows, each forked into a copy of its own: cache.fork); the quantized path then writes
    the new keys and values inside its attention node, into those buffers (fused.attention_rows)."""
    A = tokens.shape[0]
    h = model.embed(tokens.reshape(A, 1))  # (A, 1, D)
    # a row's layers are written together, so layer 0 tells each row's position and room for all
    offsets = [c[0].offset for c in caches]
    roomy = all(c[0].has_room(1) for c in caches)
    for i, layer in enumerate(model.layers):
        rows, fused = [c[i] for c in caches], layer.fused
        if fused is not None and fused.attention_fuses():
            h = fused.attention_rows(h, rows, owned, offsets if roomy else None)  # the MLP too
        else:
            h = h + _attention(layer.self_attn, layer.input_layernorm(h), rows)
            h = fused.mlp(h) if fused is not None else h + layer.mlp(layer.post_attention_layernorm(h))
        if i % EVAL_EVERY == EVAL_EVERY - 1 and i + 1 < len(model.layers):
            mx.async_eval(h)  # MLX runs these layers while the next ones are built (the same graph, the same bits)
    return model.logits_from_hidden(h)[:, -1, :]


def _rope(rope, x: mx.array, offsets: list[int]) -> mx.array:
    """model.RoPE for one position per row, row r at offsets[r]. Where the rotation is mx.fast.rope's
    (no table: the weights as stored), one op: it takes an array of offsets, one per batch row, and
    gives each row the bits it gives that row alone (tests/test_serve.py compares with sample). The
    float32 path's cos/sin table (cpu/kernels.py) is called row by row through RoPE itself."""
    if getattr(rope, "_table", True) is None:
        offset = mx.array(offsets)
        return mx.fast.rope(
            x, rope.dims, traditional=False, base=rope.base, scale=rope.scale, offset=offset, freqs=rope._freqs
        )
    parts = mx.split(x, len(offsets), axis=0) if len(offsets) > 1 else [x]
    return mx.concatenate([rope(part, offset=o) for part, o in zip(parts, offsets)])


def _attention(attn, x: mx.array, caches: list[KVCache]) -> mx.array:
    """model.Attention.__call__ for one new position per row, each row at its own offset."""
    A = x.shape[0]
    q = attn.q_proj(x).reshape(A, 1, attn.n_heads, -1)  # (A, 1, H, E): batched, no position yet
    k = attn.k_proj(x).reshape(A, 1, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(A, 1, attn.n_kv_heads, -1)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # (A, heads, 1, E)
    offsets = [cache.offset for cache in caches]
    q, k = _rope(attn.rope, q, offsets), _rope(attn.rope, k, offsets)
    outs = []
    # one split op per tensor instead of A slices: per-row ops are what a step of many rows costs
    qs, ks, vs = (mx.split(t, A, axis=0) if A > 1 else [t] for t in (q, k, v))
    for r, cache in enumerate(caches):
        # the row's own cache, and attention over its keys only
        kr, vr = cache.update_and_fetch(ks[r], vs[r])
        outs.append(mx.fast.scaled_dot_product_attention(qs[r], kr, vr, scale=attn.scale, mask=None))
    out = mx.concatenate(outs) if A > 1 else outs[0]  # (A, H, 1, E)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(A, 1, -1))
