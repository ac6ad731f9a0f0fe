"""Seeded int8-path inputs that tests/test_qmm.py computes in this process and in the avx2 build's: each kind
of short segment of groups (native/qmm/int8.cpp), one weight and 23 rows (4- and 3-row tiles and remainders)."""

import mlx.core as mx

# bits, group size, K: segments of 8+8+2, 8+4+2+1, 8+2+1 groups, and 8+8+1 (a one-operand segment)
INT8_CASES = ((4, 32, 576), (8, 64, 960), (4, 128, 1408), (8, 32, 544))


def int8_case(kernel, bits: int, gs: int, K: int):
    """(w, scales, biases) in the int8 layout, and x (23, K)."""
    wq, s, b = mx.quantize(mx.random.normal((70, K), key=mx.random.key(K)), group_size=gs, bits=bits)
    s, b = s.astype(mx.float16), b.astype(mx.float16)
    x = mx.random.normal((23, K), key=mx.random.key(K + 1))
    return kernel.repack_int8(wq, gs, bits), kernel.int8_lane_groups(s, K, gs), kernel.int8_lane_groups(b, K, gs), x
