"""Seeded kernel inputs that tests/test_qmm.py computes in this process and in another build's (avx2,
portable), run as a subprocess: the float32 kernel over three layouts, the int8 path over each kind of
short segment of groups (native/qmm/int8.cpp), and the embedded model's fused layers."""

import mlx.core as mx
import numpy as np

FLOAT_LAYOUTS = ((4, 32), (8, 64), (4, 128))  # bits, group size; weights (200, 768)
# bits, group size, K: segments of 8+8+2, 8+4+2+1, 8+2+1 groups, and 8+8+1 (a one-operand segment)
INT8_CASES = ((4, 32, 576), (8, 64, 960), (4, 128, 1408), (8, 32, 544))


def float_weight(bits: int, gs: int):
    """(wq, scales, biases) of a seeded (200, 768) weight."""
    w = mx.random.normal((200, 768), key=mx.random.key(bits * gs))
    return mx.quantize(w, group_size=gs, bits=bits)


def int8_case(kernel, bits: int, gs: int, K: int):
    """(w, scales, biases) in the int8 layout, and x (23, K)."""
    wq, s, b = mx.quantize(mx.random.normal((70, K), key=mx.random.key(K)), group_size=gs, bits=bits)
    s, b = s.astype(mx.float16), b.astype(mx.float16)
    x = mx.random.normal((23, K), key=mx.random.key(K + 1))
    return kernel.repack_int8(wq, gs, bits), kernel.int8_lane_groups(s, K, gs), kernel.int8_lane_groups(b, K, gs), x


def kernel_outputs(x: mx.array) -> dict:
    """This process's build: x (M, 768) against every float layout ("bits-gs"), and every int8 case
    ("int8-bits-gs"), as numpy arrays."""
    from mlxinfer.cpu import qmm

    out = {}
    for bits, gs in FLOAT_LAYOUTS:
        out[f"{bits}-{gs}"] = np.array(qmm.quantized_matmul(x, *float_weight(bits, gs), gs, bits))
    k = qmm.kernel()
    for bits, gs, K in INT8_CASES:
        w8, s8, b8, x8 = int8_case(k, bits, gs, K)
        out[f"int8-{bits}-{gs}"] = np.array(k.quantized_matmul(x8, w8, s8, b8, gs, bits | k.int8_flag()))
    return out


def model_scores() -> dict:
    """The embedded model on the quantized path (its fused layers): two prompts' last scores
    ("prefill"), then one decode step of both rows together, each at its own offset ("step")."""
    import mlxinfer
    from mlxinfer.model import ragged
    from mlxinfer.tokenizer import encode_prompt

    model, tok = mlxinfer.load(None, compute_dtype="quantized")
    caches, last = [], []
    for text in ("Name one fruit.", "Name one herb to add to tomato soup."):
        cache = model.make_cache()
        last.append(model(mx.array([encode_prompt(tok, text)]), cache=cache)[0, -1])
        caches.append(cache)
    tokens = mx.argmax(mx.stack(last), axis=-1).astype(mx.int32)
    return {"prefill": np.array(mx.stack(last)), "step": np.array(ragged.step(model, tokens, caches))}
