"""The int8 path (compute_dtype="int8"; native/qmm/int8.cpp): the activations rounded to 8 bits per group,
the products summed as exact integers.

(a) the kernel (VNNI or AVX2 here) against its portable code, bit for bit, every bits x group size x a K
    with each kind of short segment, 1..17 rows; and both against the definition computed in float64;
(b) the distance to the float32 kernel is what rounding x to the 8-bit grid allows (|x - d xq| <= d / 2);
(c) a row alone == the same row inside a batch, bit for bit (the kernel, and the whole model);
(d) the repacked layout holds MLX's values exactly (a table lookup dequantizes to mx.dequantize's);
(e) the embedded model on the int8 path: the lesson's greedy text, and its distance to the float32 path;
(f) what it refuses: layouts it does not take, a layer MLX would misread.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import ROOT

import mlxinfer
from mlxinfer.cpu import qlinear, qmm
from mlxinfer.model import convert, params
from mlxinfer.tokenizer import encode_prompt

if not qmm.available():
    pytest.skip(f"the quantized matmul kernel is not available here: {qmm.status()['reason']}", allow_module_level=True)

K8 = qmm.kernel()
FLAG = K8.int8_flag()
# K values: 576 = 18 groups of 32 (8 + 8 + 2), 1408 = 11 groups of 128 (8 + 2 + 1), 960 = 15 groups of 64 (8+4+2+1);
# 8-bit groups of 32 also take an odd number of groups (544 = 8 + 8 + 1: a segment of one operand)
CASES = [(bits, gs, k) for bits in (4, 8) for gs, k in ((32, 576), (32, 256), (64, 960), (128, 1408), (128, 1024))]
CASES += [(8, 32, 544)]


def int8_weights(n: int, k: int, bits: int, gs: int, seed: int):
    w = mx.array(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
    s, b = s.astype(mx.float16), b.astype(mx.float16)  # as a GGUF stores them
    packed = (K8.repack_int8(wq, gs, bits), K8.int8_lane_groups(s, k, gs), K8.int8_lane_groups(b, k, gs))
    return (wq, s, b), packed


def definition(x: np.ndarray, wq, s, b, bits: int, gs: int) -> np.ndarray:
    """y = sum_g d (s I + b X) in float64, from MLX's own layout: x rounded per group to xq = rint(x * 127 / max|x|)."""
    from test_qmm import unpack

    q = unpack(wq, bits).astype(np.int64)
    n, k = q.shape
    xg = x.reshape(x.shape[0], k // gs, gs)
    amax = np.abs(xg).max(-1)
    inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint((xg * inv[..., None]).astype(np.float32)).astype(np.int64)
    d = (amax / np.float32(127)).astype(np.float64)
    integer = np.einsum("mgi,ngi->mng", xq, q.reshape(n, k // gs, gs))
    s64, b64 = np.array(s.astype(mx.float32)).astype(np.float64), np.array(b.astype(mx.float32)).astype(np.float64)
    return (d[:, None, :] * (integer * s64[None] + b64[None] * xq.sum(-1)[:, None, :])).sum(-1)


@pytest.mark.parametrize("bits,gs,k", CASES)
def test_the_kernel_equals_its_portable_code_and_the_definition(bits, gs, k, tile_width):
    (wq, s, b), (w8, s8, b8) = int8_weights(45, k, bits, gs, seed=k + bits)
    for rows in (1, 2, 5, 17):
        x = mx.array(np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32))
        fast = np.array(K8.quantized_matmul(x, w8, s8, b8, gs, bits | FLAG))
        portable = np.array(K8.qmm_int8(x, w8, s8, b8, gs, bits, reference=True))
        assert np.array_equal(fast.view(np.uint32), portable.view(np.uint32)), rows
        want = definition(np.array(x), wq, s, b, bits, gs)
        assert np.abs(fast - want).max() <= 1e-5 * np.abs(want).max(), rows


@pytest.mark.parametrize("bits,gs,k", CASES[:3])
def test_the_distance_to_float32_is_the_rounding_of_x(bits, gs, k):
    """|y_int8 - y_float32| <= sum_k |s q + b| * d / 2 (each x moves at most half a step of its group's
    8-bit grid), plus float32 slack: the int8 path computes what it says, and no worse."""
    (wq, s, b), (w8, s8, b8) = int8_weights(300, k, bits, gs, seed=3)
    x = np.random.default_rng(4).standard_normal((9, k)).astype(np.float32)
    got = np.array(K8.quantized_matmul(mx.array(x), w8, s8, b8, gs, bits | FLAG)).astype(np.float64)
    ref = np.array(qmm.quantized_matmul(mx.array(x), wq, s, b, gs, bits)).astype(np.float64)
    w = np.abs(np.array(mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=gs, bits=bits)))
    half_step = np.repeat(np.abs(x.reshape(9, -1, gs)).max(-1) / 127 / 2, gs, axis=1)  # (M, K)
    bound = half_step @ w.T.astype(np.float64)
    err = np.abs(got - ref)
    assert (err <= bound * 1.001 + 1e-4).all(), float((err / bound).max())
    assert err.max() > 0  # it does round: this is not the float32 kernel


@pytest.mark.parametrize("bits,gs,k", [(4, 32, 576), (8, 32, 576), (4, 64, 960), (8, 128, 1408)])
def test_a_row_alone_equals_the_row_in_a_batch(bits, gs, k, tile_width):
    _, (w8, s8, b8) = int8_weights(200, k, bits, gs, seed=5)
    batch = mx.random.normal((37, k), key=mx.random.key(6))
    full = K8.quantized_matmul(batch, w8, s8, b8, gs, bits | FLAG)
    mx.eval(full)
    for r in (0, 1, 17, 36):
        assert mx.array_equal(
            K8.quantized_matmul(batch[r : r + 1], w8, s8, b8, gs, bits | FLAG), full[r : r + 1]
        ).item()
    for start, size in ((3, 2), (10, 3), (0, 33)):  # every remainder of the row tiles
        part = K8.quantized_matmul(batch[start : start + size], w8, s8, b8, gs, bits | FLAG)
        assert mx.array_equal(part, full[start : start + size]).item(), (start, size)


@pytest.mark.parametrize("bits,gs,k", [(4, 32, 576), (8, 64, 960), (4, 128, 1408)])
def test_the_repacked_table_holds_mlx_values(bits, gs, k):
    (wq, s, b), (w8, s8, b8) = int8_weights(50, k, bits, gs, seed=7)
    ids = mx.array([0, 7, 49, 7])
    got = K8.dequantize_rows(ids, w8, s8, b8, gs, bits | FLAG)
    want = K8.dequantize_rows(ids, wq, s, b, gs, bits)
    assert mx.array_equal(got, want).item()


def test_tiny_inputs_round_alike_in_the_vector_and_portable_code():
    """A group whose max|x| is below 127 / FLT_MAX (3.7e-37) rounds to zeros (127 / max|x| is not finite),
    in both codes alike; a small but ordinary group (1e-30) still rounds to its 8-bit grid."""
    _, (w8, s8, b8) = int8_weights(30, 576, 4, 32, seed=9)
    x = mx.random.normal((4, 576), key=mx.random.key(4)) * mx.array([[1e-38], [1e-40], [1e-30], [1.0]])
    fast = K8.quantized_matmul(x, w8, s8, b8, 32, 4 | FLAG)
    assert mx.array_equal(fast, K8.qmm_int8(x, w8, s8, b8, 32, 4, reference=True)).item()
    assert (fast[:2] == 0).all().item() and (fast[2:] != 0).all().item()
    with pytest.raises(ValueError, match="group size"):
        K8.int8_lanes(64, 0)


def test_a_group_with_inf_or_nan_gives_nan():
    _, (w8, s8, b8) = int8_weights(20, 576, 4, 32, seed=8)
    x = mx.random.normal((3, 576), key=mx.random.key(1))
    x = mx.concatenate(
        [x[:1], mx.where(mx.arange(576) == 40, mx.inf, x[1:2]), mx.where(mx.arange(576) == 5, mx.nan, x[2:])]
    )
    y = K8.quantized_matmul(x, w8, s8, b8, 32, 4 | FLAG)
    assert mx.isfinite(y[0]).all().item() and mx.isnan(y[1:]).all().item()


def test_a_layout_it_does_not_take_stays_on_the_float32_kernel():
    assert not K8.int8_supports(96, 32, 4)  # 4-bit rows must hold whole 64-value pairs
    assert K8.int8_supports(96, 32, 8) and not K8.int8_supports(100, 32, 8)
    wq, s, b = mx.quantize(mx.random.normal((8, 96), key=mx.random.key(2)), group_size=32, bits=4)
    layer = nn_quantized(wq, s, b, 32, 4)
    twin = qlinear.int8_twin(qlinear.twin(layer))
    assert not twin.int8 and twin.kernel_bits == 4

    class One(nn.Module):  # a model whose only layer the int8 kernel cannot take: the quantized path, named so
        def __init__(self):
            super().__init__()
            self.proj = nn_quantized(wq, s, b, 32, 4)

    model = One()
    model.info = mlxinfer.ModelInfo.unnamed("test")
    convert.to_quantized(model, int8=True)
    assert model.info.compute_dtype == "quantized" and not model.proj.int8
    with pytest.raises(ValueError, match="int8 layout"):
        K8.quantized_matmul(mx.zeros((1, 96)), wq, s, b, 32, 4 | FLAG)


def nn_quantized(wq, s, b, gs: int, bits: int):
    layer = nn.QuantizedLinear(wq.shape[1] * 32 // bits, wq.shape[0], bias=False, group_size=gs, bits=bits)
    layer.weight, layer.scales, layer.biases = wq, s, b
    return layer


# ---------------------------------------------------------------- the embedded model


def test_the_model_runs_every_packed_layer_on_int8(embedded_int8):
    model, _ = embedded_int8
    assert model.info.compute_dtype == "int8" and "activations int8" in model.info.weights
    packed = [m for _, m in model.named_modules() if isinstance(m, qlinear._Packed)]
    assert packed and all(m.int8 for m in packed)
    with pytest.raises(mlxinfer.MlxinferError, match="int8 kernel"):
        params.dequantize_module(packed[0])
    with pytest.raises(mlxinfer.MlxinferError, match="other than int8"):
        mlxinfer.mlx_lm_twin(model)


def test_the_lessons_greedy_text_and_the_distance_to_float32(embedded_int8, embedded_fast):
    from test_qmm import greedy

    (model, tok), (f32, _) = embedded_int8, embedded_fast
    for prompt in (
        "Name one fruit. Answer with one word.",
        "Name one herb to add to tomato soup. Answer with one word.",
    ):
        ids = encode_prompt(tok, prompt, chat=True)
        assert greedy(model, ids, 12) == greedy(f32, ids, 12), prompt
    ids = tok.encode((ROOT / "quant" / "data" / "eval.txt").read_text())[:384]
    x = mx.array([ids])
    ref, got = f32(x)[0].astype(mx.float32), model(x, cache=model.make_cache())[0]  # as a prefill reads it
    lp_ref, lp = ref - mx.logsumexp(ref, axis=-1, keepdims=True), got - mx.logsumexp(got, axis=-1, keepdims=True)
    kl = (mx.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1).mean().item()
    agree = (mx.argmax(lp_ref, axis=-1) == mx.argmax(lp, axis=-1)).astype(mx.float32).mean().item()
    assert 1e-5 < kl < 1e-2 and agree >= 0.95, (kl, agree)  # measured here: 2.6e-3 and 96.9%


def test_the_model_scores_a_row_alone_as_in_a_batch(embedded_int8):
    from test_qmm import assert_rows_score_alone_as_in_a_batch

    rows = [list(range(200 + 5 * i, 221 + 5 * i)) for i in range(6)]
    assert_rows_score_alone_as_in_a_batch(embedded_int8[0], rows, (0, 5))


def test_seeded_draws_in_a_batch_equal_each_seed_alone(embedded_int8):
    model, tok = embedded_int8
    prompt, kw = "Name one fruit.", dict(settings={"temperature": 1.0}, max_tokens=6)
    together = mlxinfer.sample(model, tok, prompt, seeds=[3, 4, 5, 6], batch_size=4, **kw)
    alone = mlxinfer.sample(model, tok, prompt, seeds=[3, 4, 5, 6], batch_size=1, **kw)
    assert [c.text for c in together.completions] == [c.text for c in alone.completions]
