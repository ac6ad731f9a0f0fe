"""One decode step for ragged rows: each row has its own KV cache (and so its own length).

The server's rows come from different requests: their prompts differ in length, so they cannot
share one (B, K, T, E) cache. Each row keeps a one-row cache of its own, and each layer gets the
rows' caches as one RaggedCache. The layers are model.py's, unchanged: the projections, norms and
MLP have no notion of position, so they run batched over all rows (one matmul reads the weights
once for everyone); only RoPE (each row at its own offset), the cache update and attention run per
row (model.Attention; the native blocks' attention node takes every row's cache at once).

Batch invariance: on the weights as stored, MLX's CPU quantized matmul gives a row the same bits
alone or in a batch, and every per-row op is the op a one-row batch runs, on the same shapes, so a
row's scores are the bits `Model.__call__` gives it alone (tests/test_serve.py checks text against
`mlxinfer.sample`). The native path computes every row alone too (native/qmm/attention.h). On the
float32 BLAS path, sgemm over A rows and sgemv over one differ in the last bits, as in decode.py's
batches.

Only our own definitions (model.py) are walked here; mlx-lm's classes keep their own forward pass
(`supports` is False) and the batcher runs one forward per request for them.
"""

from __future__ import annotations

import mlx.core as mx

from .cache import KVCache, RaggedCache
from .model import Model


def supports(model) -> bool:
    """True where `step` can walk the layers: our Model, unsplit (a split model's layers end in
    collectives that every rank must run in the same order), with our KV cache."""
    if not isinstance(model, Model) or getattr(model.info, "sharding", None):
        return False
    attn = model.layers[0].self_attn
    return all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads"))


EVAL_EVERY = 10  # layers built before they start to run: a one-row step's graph takes ~2 ms of its ~8 to build


def step(model: Model, tokens: mx.array, caches: list[list[KVCache]]) -> mx.array:
    """Scores (A, V) for the next token of each row: `tokens` (A,) are the tokens just drawn and
    caches[r] is row r's one-row cache (a list over layers), updated in place. Where every row's
    buffers are its own (KVCache.owned: the copies cache.fork makes), the native blocks write the new
    keys and values inside their attention node, into those buffers."""
    A = tokens.shape[0]
    h = model.embed(tokens.reshape(A, 1))  # (A, 1, D)
    # a row's layers are written together, so layer 0 tells each row's room for all
    roomy = all(c[0].has_room(1) for c in caches)
    for i, layer in enumerate(model.layers):
        h = layer(h, None, RaggedCache([c[i] for c in caches], roomy))
        if i % EVAL_EVERY == EVAL_EVERY - 1 and i + 1 < len(model.layers):
            mx.async_eval(h)  # MLX runs these layers while the next ones are built (the same graph, the same bits)
    return model.logits_from_hidden(h)[:, -1, :]
