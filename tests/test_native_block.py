"""The quantized path's native blocks (model/native_block.py) and the extension's ops under them.

(a) q/k/v (or gate/up) as one kernel call == the separate calls side by side, bit for bit, and a
    chain of stages (norm, matmul, SwiGLU, matmul, + residual) as one node == its ops one node each;
(b) SwiGLU on the two halves == SwiGLU on two arrays, and a quantized table's rows dequantized in
    one node == mx.dequantize of the gathered rows, bit for bit;
(c) log_softmax against float64, masked (-inf) scores adding nothing;
(d) write_cache + attend against a float64 RoPE + causal grouped-query attention, rows alone ==
    rows in a batch bit for bit, attend with its output projection and residual == attend, then the
    chain's one stage (and with a layer's MLP after it == that MLP as its own chain), and the
    server's rows (each its own cache and offset) in one attend node == attend for each row
    alone, the cache written in place when nothing else holds it and copied when something does;
(e) the embedded model: the fused layers against the composed forward pass they replace (scores
    and greedy text), and the node count of one decode step, side by side; a prompt scored in one
    pass, in chunks and token by token, bit for bit alike.
"""

from __future__ import annotations

import collections
import io
import re

import mlx.core as mx
import numpy as np
import pytest

from mlxinfer.cpu import qmm
from mlxinfer.engine.decode import prefill

if not qmm.available():
    pytest.skip(f"the quantized matmul kernel is not available here: {qmm.status()['reason']}", allow_module_level=True)

K = qmm.kernel()
RNG = np.random.default_rng(7)


def normal(*shape) -> mx.array:
    return mx.array(RNG.standard_normal(shape).astype(np.float32))


def side_by_side(x, ws, scales, biases, group_size, bits) -> mx.array:
    """x times several weights in one node: a chain of one stage, no prologue."""
    return K.linear_chain(x, [("", None, 0.0, ws, scales, biases, group_size, bits)])


@pytest.mark.parametrize("bits,group_size", [(4, 32), (8, 64), (4, 128)])
def test_one_call_over_several_weights_equals_separate_calls(bits, group_size):
    weights = [mx.quantize(normal(n, 256), group_size=group_size, bits=bits) for n in (96, 32, 40)]
    for rows in (1, 3, 8):
        x = normal(rows, 256)
        alone = [K.quantized_matmul(x, w, s, b, group_size, bits) for w, s, b in weights]
        cat = side_by_side(x, *[[q[i] for q in weights] for i in range(3)], group_size, bits)
        assert cat.shape == (rows, 168)
        assert mx.array_equal(cat, mx.concatenate(alone, axis=-1)).item(), rows


@pytest.mark.parametrize(
    "bits,group_size,scale_dtype", [(4, 32, mx.float16), (8, 64, mx.bfloat16), (4, 128, mx.float32)]
)
def test_a_chain_of_stages_equals_its_ops_one_node_each(bits, group_size, scale_dtype):
    """norm, then two weights side by side, SwiGLU on the halves, down, + residual: the MLP of a layer
    as one node has the bits of rms_norm, the two matmuls side by side, swiglu on the halves,
    quantized_matmul, add."""

    def q(n, k):
        w, s, b = mx.quantize(normal(n, k), group_size=group_size, bits=bits)
        return w, s.astype(scale_dtype), b.astype(scale_dtype)

    gate, up, down = q(384, 256), q(384, 256), q(256, 384)
    norm = normal(256) + 1
    for rows in (1, 5):
        h = normal(rows, 1, 256)
        stages = [
            ("rms_norm", norm, 1e-5, *[[m[i] for m in (gate, up)] for i in range(3)], group_size, bits),
            ("swiglu_halves", None, 0.0, [down[0]], [down[1]], [down[2]], group_size, bits),
        ]
        chain = K.linear_chain(h, stages, h)
        gate_up = mx.concatenate(
            [K.quantized_matmul(K.rms_norm(h, norm, 1e-5), *m, group_size, bits) for m in (gate, up)], axis=-1
        )
        swiglu = K.swiglu(gate_up[..., :384], gate_up[..., 384:])
        ops = h + K.quantized_matmul(swiglu, *down, group_size, bits)
        assert chain.shape == (rows, 1, 256)
        assert mx.array_equal(chain, ops).item(), rows
        one = K.linear_chain(h, stages[:1])  # one stage, no residual: the two matmuls of the norm
        assert mx.array_equal(one, gate_up).item()


def test_a_chain_refuses_what_it_cannot_run():
    w, s, b = mx.quantize(normal(64, 128), group_size=64, bits=4)
    x = normal(2, 128)
    with pytest.raises(ValueError, match="prologue is"):
        K.linear_chain(x, [("gelu", None, 0.0, [w], [s], [b], 64, 4)])
    with pytest.raises(ValueError, match="rms_norm needs a 1-D weight"):
        K.linear_chain(x, [("rms_norm", normal(64), 1e-5, [w], [s], [b], 64, 4)])
    with pytest.raises(ValueError, match="does not match w"):  # the second stage's input is 64 wide, not 128
        K.linear_chain(x, [("", None, 0.0, [w], [s], [b], 64, 4)] * 2)
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        K.linear_chain(x, [("", None, 0.0, [w], [s], [b], 64, 4)], x)


@pytest.mark.parametrize(
    "bits,group_size,scale_dtype", [(8, 32, mx.float16), (4, 64, mx.bfloat16), (4, 128, mx.float32)]
)
def test_dequantized_rows_equal_mx_dequantize_of_the_gathered_rows(bits, group_size, scale_dtype):
    w, s, b = mx.quantize(normal(50, 256), group_size=group_size, bits=bits)
    s, b = s.astype(scale_dtype), b.astype(scale_dtype)
    ids = mx.array([[3, 49, 0], [7, 7, 12]])
    want = mx.dequantize(
        w[ids], scales=s[ids].astype(mx.float32), biases=b[ids].astype(mx.float32), group_size=group_size, bits=bits
    )
    got = K.dequantize_rows(ids, w, s, b, group_size, bits)
    assert got.shape == (2, 3, 256) and mx.array_equal(got, want).item()
    assert mx.array_equal(
        K.dequantize_rows(ids.T, w, s, b, group_size, bits), want.transpose(1, 0, 2)
    ).item()  # strided ids
    outside = K.dequantize_rows(mx.array([50, -1, 0]), w, s, b, group_size, bits)  # never a read past the table
    assert mx.isnan(outside[:2]).all().item() and mx.array_equal(outside[2], want[0, 2]).item()
    with pytest.raises(ValueError, match="ids must be integers"):
        K.dequantize_rows(mx.array([1.0]), w, s, b, group_size, bits)


@np.errstate(invalid="ignore")  # -inf - -inf where the mask is: those entries are checked apart
def test_log_softmax_against_float64_and_masked_scores():
    x = np.array(normal(4, 49_153)) * 5
    x[1, ::3] = -np.inf  # a mask: those tokens are impossible
    got = np.array(K.log_softmax(mx.array(x)))
    x64 = x.astype(np.float64)
    want = x64 - (x64.max(-1, keepdims=True) + np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    finite = np.isfinite(x)
    # float32 rounding of x - lse, and the polynomial exp's ~1e-7 relative error in the sum
    lse = np.abs(x64 - want)
    err = np.abs(got - want)[finite]
    assert (err <= 4 * np.finfo(np.float32).eps * (np.abs(x64) + lse)[finite] + 1e-6).all()
    peer = np.array(mx.array(x) - mx.logsumexp(mx.array(x), axis=-1, keepdims=True))  # MLX's own, as a yardstick
    assert err.max() <= np.abs(peer - want)[finite].max()
    assert np.isneginf(got[~finite]).all()
    assert abs(np.exp(got[1][finite[1]].astype(np.float64)).sum() - 1) < 1e-5
    assert np.isneginf(np.array(K.log_softmax(mx.full((1, 9), -np.inf)))).all()


def rope64(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    c, s = cos[positions].astype(np.float64), sin[positions].astype(np.float64)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def reference(qkv, keys, cos, sin, offset, H, Hk, scale):
    """float64: the new keys rotated into the cache, then each query over positions 0 .. its own."""
    B, L, _ = qkv.shape
    E = keys.shape[-1]
    q = qkv[..., : H * E].reshape(B, L, H, E)
    k = qkv[..., H * E : (H + Hk) * E].reshape(B, L, Hk, E)
    v = qkv[..., (H + Hk) * E :].reshape(B, L, Hk, E)
    pos = offset + np.arange(L)
    q = rope64(q.astype(np.float64), pos[None, :, None], cos, sin)
    k = rope64(k.astype(np.float64), pos[None, :, None], cos, sin)
    ks, vs = keys.astype(np.float64).copy(), keys.astype(np.float64).copy() * 0.5  # values: see caller
    ks[:, :, offset : offset + L] = k.transpose(0, 2, 1, 3)
    vs[:, :, offset : offset + L] = v.transpose(0, 2, 1, 3)
    out = np.zeros((B, L, H, E))
    for b in range(B):
        for h in range(H):
            for i in range(L):
                s = ks[b, h // (H // Hk), : offset + i + 1] @ q[b, i, h] * scale
                p = np.exp(s - s.max())
                out[b, i, h] = p @ vs[b, h // (H // Hk), : offset + i + 1] / p.sum()
    return out.reshape(B, L, H * E), ks, vs


@pytest.mark.parametrize("L,offset", [(1, 0), (1, 37), (5, 11), (16, 0)])
@pytest.mark.parametrize("H,Hk,E", [(6, 2, 16), (10, 2, 48), (8, 1, 64)])  # query heads a KV head: 3, 5, 8
def test_attention_against_float64_and_rows_alone(L, offset, H, Hk, E):
    B, cap = 3, 64
    scale = E**-0.5
    angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(0, E, 2) / E))[None]
    cos, sin = mx.array(np.cos(angles).astype(np.float32)), mx.array(np.sin(angles).astype(np.float32))
    qkv = np.array(normal(B, L, (H + 2 * Hk) * E))
    keys = np.array(normal(B, Hk, cap, E))
    kv = np.stack([keys, keys * 0.5], axis=1)  # (B, 2, Hk, cap, E): reference() builds the values alike

    def run(rows):
        written = K.write_cache(mx.array(kv[rows]), mx.array(qkv[rows]), cos, sin, offset, H, Hk)
        out = K.attend(mx.array(qkv[rows]), cos, sin, [written], [offset], H, Hk, scale)
        mx.eval(out, written)
        return out, written

    out, written = run(slice(None))
    o = mx.quantize(normal(64, H * E), group_size=32, bits=4)
    h = normal(B, L, 64)
    projected = K.attend(mx.array(qkv), cos, sin, [written], [offset], H, Hk, scale, out_proj=(*o, 32, 4), residual=h)
    chained = K.linear_chain(out, [("", None, 0.0, [o[0]], [o[1]], [o[2]], 32, 4)], h)  # the same, two nodes
    assert mx.array_equal(projected, chained).item()
    # a layer's MLP after it in the same node == the MLP as its own chain node on that result
    gate_up, down, norm = mx.quantize(normal(128, 64), 32, 4), mx.quantize(normal(64, 64), 32, 4), normal(64)
    mlp = [("rms_norm", norm, 1e-5, [gate_up[0]], [gate_up[1]], [gate_up[2]], 32, 4),
           ("swiglu_halves", None, 0.0, [down[0]], [down[1]], [down[2]], 32, 4)]  # fmt: skip
    layer = K.attend(
        mx.array(qkv), cos, sin, [written], [offset], H, Hk, scale, out_proj=(*o, 32, 4), residual=h, then=mlp
    )
    assert mx.array_equal(layer, K.linear_chain(projected, mlp, projected)).item()
    with pytest.raises(ValueError, match="needs out_proj and a residual"):
        K.attend(mx.array(qkv), cos, sin, [written], [offset], H, Hk, scale, out_proj=(*o, 32, 4), then=mlp)
    with pytest.raises(ValueError, match="keep the output's width"):
        K.attend(
            mx.array(qkv), cos, sin, [written], [offset], H, Hk, scale, out_proj=(*o, 32, 4), residual=h, then=mlp[:1]
        )
    want, want_k, want_v = reference(qkv, keys, np.array(cos), np.array(sin), offset, H, Hk, scale)
    assert np.abs(np.array(out) - want).max() < 1e-5
    assert np.abs(np.array(written[:, 0]) - want_k).max() < 1e-5
    assert np.abs(np.array(written[:, 1]) - want_v).max() < 1e-6
    for r in range(B):
        alone, _ = run(slice(r, r + 1))
        assert mx.array_equal(alone[0], out[r]).item(), r
    # the rows grouped into caches another way (two in one, one alone): the same bits
    regrouped = K.attend(mx.array(qkv), cos, sin, [written[:2], written[2:]], [offset, offset], H, Hk, scale)
    assert mx.array_equal(regrouped, out).item()
    if L == 1:  # the server's rows: each its own cache and offset, one attention node for all of them
        offsets = [offset, 3, offset + 7][:B]
        caches = [
            K.write_cache(mx.array(kv[r : r + 1]), mx.array(qkv), cos, sin, at, H, Hk, r)
            for r, at in enumerate(offsets)
        ]
        together = K.attend(mx.array(qkv), cos, sin, caches, offsets, H, Hk, scale)
        for r, at in enumerate(offsets):
            one = K.attend(mx.array(qkv[r : r + 1]), cos, sin, [caches[r]], [at], H, Hk, scale)
            assert mx.array_equal(together[r], one[0]).item(), r
        projected = K.attend(mx.array(qkv), cos, sin, caches, offsets, H, Hk, scale, out_proj=(*o, 32, 4), residual=h)
        stage = [("", None, 0.0, [o[0]], [o[1]], [o[2]], 32, 4)]
        assert mx.array_equal(projected, K.linear_chain(together, stage, h)).item()
        layers = K.attend(
            mx.array(qkv), cos, sin, caches, offsets, H, Hk, scale, out_proj=(*o, 32, 4), residual=h, then=mlp
        )
        assert mx.array_equal(layers, K.linear_chain(projected, mlp, projected)).item()
        with pytest.raises(ValueError, match="one offset per cache"):
            K.attend(mx.array(qkv), cos, sin, caches, offsets[:-1], H, Hk, scale)
        # the writes inside the node, into copies of the caches before write_cache: the same caches
        # and the same output; and what it refuses (it would write into a copy, or into a shared buffer)
        own = [mx.array(kv[r : r + 1]) for r in range(B)]
        in_node = K.attend(mx.array(qkv), cos, sin, own, offsets, H, Hk, scale, write_in_place=True)
        assert mx.array_equal(in_node, together).item()
        assert all(mx.array_equal(a, b).item() for a, b in zip(own, caches))
        with pytest.raises(ValueError, match="float32 caches"):
            halves = [c.astype(mx.bfloat16) for c in own]
            K.attend(mx.array(qkv), cos, sin, halves, offsets, H, Hk, scale, write_in_place=True)
        with pytest.raises(ValueError, match="without a head norm"):
            K.attend(mx.array(qkv), cos, sin, own, offsets, H, Hk, scale, normal(E), 1e-6, write_in_place=True)
        shared = [mx.broadcast_to(mx.zeros((1, 1, 1, 1, 1)), c.shape) for c in own]  # one element for all
        with pytest.raises(RuntimeError, match="a buffer of its own"):
            mx.eval(K.attend(mx.array(qkv), cos, sin, shared, offsets, H, Hk, scale, write_in_place=True))


@pytest.mark.parametrize("L,offset,base", [(1, 37, 37), (1, 37, 20), (5, 11, 11), (3, 9, 1)])
@pytest.mark.parametrize("H,Hk,E", [(6, 2, 16), (8, 1, 64)])
def test_a_prefix_the_rows_share_gives_the_bits_of_it_copied_into_each_row(L, offset, base, H, Hk, E):
    """attend's prefix (positions below base held once for every row, the exact answers' prompt) against the
    same positions copied into each row's cache: the same cache writes and the same output, bit for bit,
    with the output projection and a layer's MLP in the node too."""
    B, cap = 3, 64
    angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(0, E, 2) / E))[None]
    cos, sin = mx.array(np.cos(angles).astype(np.float32)), mx.array(np.sin(angles).astype(np.float32))
    qkv = normal(B, L, (H + 2 * Hk) * E)
    keys = np.array(normal(B, Hk, cap, E))
    kv = np.stack([keys, keys * 0.5], axis=1)
    kv[:, :, :, :base] = kv[:1, :, :, :base]  # the rows' first base positions are one prefix
    full = K.write_cache(mx.array(kv), qkv, cos, sin, offset, H, Hk)
    own = K.write_cache(mx.array(kv[:, :, :, base:]), qkv, cos, sin, offset, H, Hk, base=base)
    prefix = mx.array(kv[:1, :, :, :base])
    assert mx.array_equal(own, full[:, :, :, base:]).item()
    o = mx.quantize(normal(64, H * E), group_size=32, bits=4)
    gate_up, down, norm = mx.quantize(normal(128, 64), 32, 4), mx.quantize(normal(64, 64), 32, 4), normal(64)
    mlp = [("rms_norm", norm, 1e-5, [gate_up[0]], [gate_up[1]], [gate_up[2]], 32, 4),
           ("swiglu_halves", None, 0.0, [down[0]], [down[1]], [down[2]], 32, 4)]  # fmt: skip
    h = normal(B, L, 64)
    for kw in ({}, {"out_proj": (*o, 32, 4), "residual": h}, {"out_proj": (*o, 32, 4), "residual": h, "then": mlp}):
        want = K.attend(qkv, cos, sin, [full], [offset], H, Hk, E**-0.5, **kw)
        got = K.attend(qkv, cos, sin, [own], [offset], H, Hk, E**-0.5, prefix=prefix, **kw)
        assert mx.array_equal(got, want).item(), kw
    with pytest.raises(ValueError, match="a prefix must be"):
        K.attend(qkv, cos, sin, [own], [offset], H, Hk, 1.0, prefix=mx.array(kv[:2, :, :, :base]))
    with pytest.raises(ValueError, match="no room"):  # a position before the cache's first slot
        K.write_cache(mx.array(kv[:, :, :, base:]), qkv, cos, sin, base - 1, H, Hk, base=base)


def test_the_walks_passes_on_a_shared_prompt_give_the_bits_of_a_copied_one(embedded_quantized, embedded_int8):
    """The exact answers' passes hold the prompt once (PathRows' PrefixedCache); on both native paths a pass's
    scores and the keys and values its paths keep are those of the prompt copied into every row."""
    import copy

    from mlxinfer.engine.decode import prefill
    from mlxinfer.engine.path_cache import PathRows, at_position

    for model, tok in (embedded_quantized, embedded_int8):
        ids = tok.encode("Name one herb to add to tomato soup.")
        P, B, d = len(ids), 5, 3
        prompt = prefill(model, ids)
        shape = at_position(prompt.cache, P - 1)[0].shape
        chains = [[normal(*shape) for _ in range(d - 1)] for _ in range(B)]
        tokens = mx.array([[11], [22], [33], [44], [55]], dtype=mx.int32)
        shared = PathRows(prompt.cache, P).cache(chains)
        copied = []
        for layer, c in enumerate(prompt.cache):
            rows = mx.stack([mx.stack(chain, axis=3) for chain in chains])[:, layer]  # (B, 2, K, d - 1, E)
            head = mx.broadcast_to(c.kv[:, :, :, :P, :], (B, *c.kv.shape[1:3], P, c.kv.shape[4]))
            room = mx.zeros((B, *c.kv.shape[1:3], 1, c.kv.shape[4]))
            grown = copy.copy(c)
            grown.kv, grown.offset = mx.concatenate([head, rows, room], axis=3), P + d - 1
            copied.append(grown)
        assert all(type(layer.native).__name__ == "NativeBlock" for layer in model.layers)
        for a, b in ((model(tokens, cache=shared), model(tokens, cache=copied)),
                     (at_position(shared, P + d - 1), at_position(copied, P + d - 1))):  # fmt: skip
            assert mx.array_equal(a, b).item(), model.info.compute_dtype


def _address(a: mx.array) -> int:
    return np.array(a, copy=False).__array_interface__["data"][0]


def test_the_cache_is_written_in_place_unless_something_else_holds_it():
    H, Hk, E = 2, 1, 8
    cos, sin = mx.ones((8, E // 2)), mx.zeros((8, E // 2))
    qkv = normal(1, 1, (H + 2 * Hk) * E)
    cache = mx.zeros((1, 2, Hk, 8, E)) + 0  # a computed array: its buffer belongs to no one else
    mx.eval(cache)
    before = _address(cache)
    written = K.write_cache(cache, qkv, cos, sin, 0, H, Hk)
    del cache  # only the graph holds the old cache now: it can be written where it lies
    mx.eval(written)
    assert _address(written) == before
    held = mx.zeros((1, 2, Hk, 8, E)) + 0
    mx.eval(held)
    copy = K.write_cache(held, qkv, cos, sin, 0, H, Hk)
    mx.eval(copy)
    assert _address(copy) != _address(held) and not mx.any(held).item()  # the held array is unchanged
    assert mx.array_equal(copy[0, 0, 0, 0], qkv[0, 0, H * E : (H + Hk) * E]).item()  # the key: cos 1, sin 0
    assert mx.array_equal(copy[0, 1, 0, 0], qkv[0, 0, (H + Hk) * E :]).item()  # the value, as it is


def test_bad_shapes_are_refused():
    cache = mx.zeros((1, 2, 2, 8, 16))
    trig = mx.zeros((8, 8))
    with pytest.raises(ValueError, match="no room"):
        K.write_cache(cache, mx.zeros((1, 1, 8 * 16)), trig, trig, 8, 4, 2)
    with pytest.raises(ValueError, match="keys, then values"):
        K.write_cache(mx.zeros((1, 2, 8, 16)), mx.zeros((1, 1, 8 * 16)), trig, trig, 0, 4, 2)
    with pytest.raises(ValueError, match="a residual needs out_proj"):
        K.attend(mx.zeros((1, 1, 6 * 16)), trig, trig, [cache], [0], 2, 2, 1.0, residual=mx.zeros((1, 1, 32)))
    with pytest.raises(ValueError, match="does not match w"):
        w = mx.quantize(mx.zeros((8, 64)), group_size=32, bits=4)
        K.attend(mx.zeros((1, 1, 6 * 16)), trig, trig, [cache], [0], 2, 2, 1.0, out_proj=(*w, 32, 4))
    with pytest.raises(ValueError, match="n_heads must be a multiple"):
        K.attend(mx.zeros((1, 1, 7 * 16)), trig, trig, [cache], [0], 3, 2, 1.0)


def _nodes(model, cache) -> int:
    dot = io.StringIO()
    mx.export_to_dot(dot, model(mx.array([[163]]), cache))
    return sum(collections.Counter(re.findall(r'label ="?([A-Za-z_0-9]+)', dot.getvalue())).values())


def _fused_against_composed(model, ids: list[int]):
    """(the fused pass's first scores, greedy tokens and nodes a step), the same for the composed pass."""
    fused = [layer.native for layer in model.layers]
    assert all(f is not None and f.attention_fuses() for f in fused), "the model's attention should be fused"

    def greedy():
        cache = model.make_cache()
        scores = model(mx.array([ids]), cache)[:, -1, :]
        first, out = scores, []
        for _ in range(12):
            out.append(mx.argmax(scores, axis=-1).item())
            scores = model(mx.array([[out[-1]]]), cache)[:, -1, :]
        return first, out, _nodes(model, cache)

    with_fused = greedy()
    try:
        for layer in model.layers:
            layer.native = None
        composed = greedy()
    finally:
        for layer, f in zip(model.layers, fused):
            layer.native = f
    return with_fused, composed


def test_the_model_with_fused_layers_matches_the_composed_pass(embedded_quantized):
    model, tok = embedded_quantized
    ids = tok.encode("The quick brown fox jumps over the lazy dog and then")
    (fused_first, fused_tokens, fused_nodes), (first, tokens, nodes) = _fused_against_composed(model, ids)
    err = mx.max(mx.abs(fused_first - first)).item()
    assert err < 1e-3 * mx.max(mx.abs(first)).item(), err
    assert fused_tokens == tokens
    assert fused_nodes * 2 < nodes, (fused_nodes, nodes)


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("qwen3", {}),  # per-head q/k RMSNorm before RoPE, inside the attention nodes
        ("qwen2", {}),  # q/k/v biases, added to the fused q/k/v
        ("llama", {"attention_bias": True, "mlp_bias": True}),  # o_proj's bias; an MLP with biases stays composed
    ],
)
def test_other_layouts_fuse_where_they_can_and_match_the_composed_pass(tmp_path, arch, overrides):
    import mlxinfer

    from checkpoints import quantized_copy, write_checkpoint

    src = write_checkpoint(tmp_path / arch, arch, **overrides)
    model, _ = mlxinfer.load(quantized_copy(src, tmp_path / f"{arch}-4bit", 4, 64), compute_dtype="quantized")
    assert model.layers[0].native.mlp_fuses() == (not overrides.get("mlp_bias", False))
    ids = list(range(5, 29))
    (fused_first, fused_tokens, _), (first, tokens, _) = _fused_against_composed(model, ids)
    assert mx.allclose(fused_first, first, rtol=1e-4, atol=1e-4).item(), mx.max(mx.abs(fused_first - first)).item()
    assert fused_tokens == tokens
    # the server's step (model/ragged.py): rows of different lengths, each its own cache, one pass for
    # all; each row's scores are the bits of its prompt run alone
    from mlxinfer.model import ragged
    from mlxinfer.model.cache import KVCache

    prompts, caches, alone = [ids[:5], ids[:11], ids[:2]], [], []
    for p in prompts:
        cache = model.make_cache()
        mx.eval(model(mx.array([p[:-1]]), cache), [c.state for c in cache])
        caches.append(cache)
        alone.append(model(mx.array([p]), model.make_cache())[0, -1])
    written = [[KVCache() for _ in c] for c in caches]  # the same caches, owned
    for mine, theirs in zip(written, caches):
        for a, b in zip(mine, theirs):
            a.kv, a.offset, a.owned = mx.array(b.kv), b.offset, True  # a copy of its own, as cache.fork makes
    tokens = mx.array([p[-1] for p in prompts])
    together = ragged.step(model, tokens, caches)
    in_place = ragged.step(model, tokens, written)  # the writes inside the attention node
    for r in range(len(prompts)):
        assert mx.array_equal(together[r], alone[r]).item(), r
        assert mx.array_equal(in_place[r], alone[r]).item(), r
        for a, b in zip(written[r], caches[r]):
            assert a.offset == b.offset and mx.array_equal(a.kv, b.kv).item()
    # the next position, written into the same buffers, against the write node's
    assert mx.array_equal(ragged.step(model, tokens, written), ragged.step(model, tokens, caches)).item()
    assert all(c[0].offset == len(p) + 1 for c, p in zip(written, prompts))


@pytest.mark.parametrize("shared", [False, True])  # True: the rows' prompt held once (PrefixedCache), as sample's
def test_a_decode_groups_own_cache_is_written_inside_the_attention_node(embedded_quantized, shared):
    """A decode group's cache (a fork: buffers of its own, KVCache.owned) takes each step's keys and values
    inside the attention node: one node a layer fewer, the same scores bit for bit, and the same cache
    contents as the write node's, also across a buffer that grows (reserve) and rows that leave."""
    from mlxinfer.model.cache import fork, keep_rows

    model, tok = embedded_quantized
    ids = tok.encode("The quick brown fox jumps over the lazy dog")
    prompt = model.make_cache()
    mx.eval(model(mx.array([ids[:-1]]), prompt), [c.state for c in prompt])

    def steps(owned: bool):
        cache = fork(prompt, 3, len(ids) + 2, shared)  # room rounded up to 16 positions: 20 steps grow it
        assert all(type(c).__name__ == ("PrefixedCache" if shared else "KVCache") for c in cache)
        for c in cache:
            c.owned = owned
        tokens, scores = mx.array([[ids[-1]]] * 3), []
        for step in range(20):
            if step == 3:  # a row leaves the group
                cache, tokens = keep_rows(cache, [0, 2]), tokens[mx.array([0, 2])]
            logits = model(tokens, cache)[:, -1, :]
            mx.eval(logits)
            scores.append(logits)
            tokens = mx.argmax(logits, axis=-1)[:, None]
        dot = io.StringIO()
        mx.export_to_dot(dot, model(tokens, cache))
        return scores, cache, len(re.findall(r'label ="?([A-Za-z_0-9]+)', dot.getvalue()))

    (written, cache_a, nodes_a), (in_node, cache_b, nodes_b) = steps(False), steps(True)
    assert nodes_a - nodes_b == len(model.layers), (nodes_a, nodes_b)
    assert all(mx.array_equal(a, b).item() for a, b in zip(written, in_node))
    for a, b in zip(cache_a, cache_b):
        assert a.offset == b.offset == len(ids) + 20  # with the step the node count built
        assert a.kv.shape[3] > 16 and b.kv.shape == a.kv.shape  # the buffer grew (reserve)
        mx.eval(a.kv, b.kv)
        filled = a.offset - a.base - 1
        assert mx.array_equal(a.kv[..., :filled, :], b.kv[..., :filled, :]).item()


def test_a_prompt_scores_alike_in_one_pass_in_chunks_and_token_by_token(embedded_quantized):
    """Every prompt position is computed alone (the kernel's rows, attention per query), so prefill
    gives the last position the bits that feeding the prompt one token at a time gives it."""
    model, tok = embedded_quantized
    ids = tok.encode("The quick brown fox jumps over the lazy dog because it was late for dinner")

    def last(chunks):
        cache = model.make_cache()
        for chunk in chunks:
            scores = model(mx.array([chunk]), cache)[0, -1]
        return scores

    whole = last([ids])
    assert mx.array_equal(whole, last([[t] for t in ids])).item()
    assert mx.array_equal(whole, last([ids[:7], ids[7:]])).item()
    # past 256 tokens in one pass too (those chunks went through MLX's attention, other bits, ~14x slower)
    long = (ids * 40)[:600]
    whole = last([long])
    assert mx.array_equal(whole, last([long[:300], long[300:]])).item()
    assert mx.array_equal(whole, last([long[:597], *[[t] for t in long[597:]]])).item()


def test_prefill_takes_short_chunks_on_the_native_path_and_scores_alike(embedded_quantized):
    """prefill's default chunk on this path is 512 tokens (a chunk is one evaluation Ctrl-C cannot
    break into), and its scores are the bits of one 2048-token chunk."""
    model, tok = embedded_quantized
    ids = (tok.encode("The quick brown fox jumps over the lazy dog because it was late for dinner") * 40)[:600]
    seen = []
    short = prefill(model, ids, progress=lambda done, total: seen.append(done))
    assert seen == [512, 600]
    assert mx.array_equal(short.logits, prefill(model, ids, step_size=2048).logits).item()


def test_rows_forked_with_little_room_decode_the_same_bits_and_grow_past_it(embedded_quantized):
    """cache.fork(positions=...) cuts each row's buffer to the room it will use (the prompt and the tokens
    to come); the rows' scores equal those of rows forked with the prompt's whole buffer, also after they
    outgrow the cut (the buffer grows as KVCache.reserve grows any), and keep_rows keeps them so."""
    from mlxinfer.model.cache import fork

    model, tok = embedded_quantized
    ids = tok.encode("Name one herb to add to tomato soup.")
    prompt = model.make_cache()
    mx.eval(model(mx.array([ids]), prompt))
    cut, whole = fork(prompt, 3, positions=len(ids) + 2), fork(prompt, 3)
    room = cut[0].kv.shape[3]
    assert room == -(-(len(ids) + 2) // 16) * 16 < whole[0].kv.shape[3]
    cut, whole = _decode_alike(model, cut, whole, room - len(ids) + 3)  # three positions past the cut's room
    assert cut[0].offset == whole[0].offset == room + 3 and cut[0].kv.shape[3] > room


def _decode_alike(model, one: list, other: list, steps: int) -> tuple[list, list]:
    """Three rows greedily decoded `steps` positions on two caches, rows 2 and 0 kept after the second step
    (keep_rows): the same scores, bit for bit, at every step. The caches at the end."""
    from mlxinfer.model.cache import keep_rows

    tokens = mx.array([[100], [200], [300]])
    for step in range(steps):
        if step == 2:
            one, other = keep_rows(one, [2, 0]), keep_rows(other, [2, 0])
            tokens = tokens[mx.array([2, 0])]
        a, b = model(tokens, one)[:, -1], model(tokens, other)[:, -1]
        assert mx.array_equal(a, b).item(), step
        tokens = mx.argmax(a, axis=-1)[:, None]
    return one, other


def test_rows_forked_with_the_prompt_shared_decode_the_bits_of_copied_ones(
    embedded_quantized, embedded_int8, monkeypatch
):
    """On the native paths a batch's rows hold the prompt once (cache.fork(shared=True): PrefixedCache):
    their scores equal those of rows with the prompt copied in, past their first room and through
    keep_rows; and `sample` forks its groups so, with the texts of copied forks."""
    from mlxinfer.model.cache import PrefixedCache, fork

    for model, tok in (embedded_quantized, embedded_int8):
        ids = tok.encode("Name one herb to add to tomato soup.")
        prompt = model.make_cache()
        mx.eval(model(mx.array([ids]), prompt))
        shared, copied = fork(prompt, 3, len(ids) + 2, shared=True), fork(prompt, 3, len(ids) + 2)
        assert all(type(c) is PrefixedCache and c.base == len(ids) for c in shared)
        room = shared[0].kv.shape[3]
        shared, copied = _decode_alike(model, shared, copied, room + 3)  # three positions past the first room
        assert shared[0].offset == copied[0].offset and shared[0].kv.shape[3] > room

        assert _sampled(model, tok, monkeypatch, shared=True) == _sampled(model, tok, monkeypatch, shared=False)


def _sampled(model, tok, monkeypatch, shared: bool) -> list[str]:
    """sample's texts with its groups forked with the prompt shared or copied (and checked to be)."""
    import mlxinfer
    from conftest import HERB, HERB_SEEDS
    from mlxinfer.engine import core
    from mlxinfer.model.cache import PrefixedCache, fork

    made = []

    def forked(cache, rows, positions=None, _shared=False):
        made.append(fork(cache, rows, positions, shared))
        return made[-1]

    monkeypatch.setattr(core, "fork", forked)
    texts = [c.text for c in mlxinfer.sample(model, tok, HERB, **HERB_SEEDS).completions]
    assert made and all((type(c) is PrefixedCache) == shared for c in made[0])
    return texts
