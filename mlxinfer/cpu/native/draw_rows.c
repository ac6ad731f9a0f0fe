/* One seeded draw per row of scores, bit for bit what MLX's CPU back end draws for that row alone.
 *
 * MLX 0.32 samples a (1, V) row in mx.random.categorical by inverse CDF:
 *     e = exp(x - max(x)) (1 where x equals the max), c = cumsum(e), u = uniform(key),
 *     token = V - #{j : c_j > u * c_(V-1)}, at most V - 1. Each row of a batch draws with its own key, so a batch of B rows is B calls, and
 * on Linux MLX's exp runs one element at a time (~19 ns: it calls fmaf six times), ~1 ms a row
 * for a 49k vocabulary. This file does the same arithmetic, the same operations in the same order,
 * vectorised: exp below is MLX's (mlx/backend/cpu/simd/math.h, Simd<float, 1>), the cumulative
 * sum runs left to right as MLX's CPU scan does, and the count is a binary search over it (c never
 * decreases). mlxinfer/cpu/draw.py checks it against mx.random.categorical before using it, and
 * tests/test_draw_kernel.py against MLX's exp over tens of millions of inputs.
 *
 * Compile with -ffp-contract=off (no fused multiply-add the source does not ask for) and without
 * -ffast-math; -fno-trapping-math only lets the compiler vectorise the selects.
 * Built by `python -m mlxinfer.cpu.draw`.
 */
#include <math.h>
#include <stdint.h>

/* What draw.py checks before it calls anything else: the calling convention below, and whether this
 * build uses AVX2/FMA instructions the running CPU must have (these two functions use none). */
int mlxinfer_draw_abi(void) { return 1; }
int mlxinfer_draw_needs_avx2(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

static inline float exp_polynomial(float x0) {
    float x = x0 * 1.442695f; /* log2(e) */
    /* MLX: floor(x + 0.5) with 0.5 a double; the same integer as floorf(x), + 1 if the fraction
     * (exact in float) is at least a half */
    float fl = floorf(x);
    float ipart = (x - fl >= 0.5f) ? fl + 1.0f : fl;
    float fpart = x - ipart;
    x = 1.535336188319500e-4f;
    x = fmaf(x, fpart, 1.339887440266574e-3f);
    x = fmaf(x, fpart, 9.618437357674640e-3f);
    x = fmaf(x, fpart, 5.550332471162809e-2f);
    x = fmaf(x, fpart, 2.402264791363012e-1f);
    x = fmaf(x, fpart, 6.931472028550421e-1f);
    x = fmaf(x, fpart, 1.000000000000000f);
    union { int32_t i; float f; } scale; /* 2**ipart from the exponent bits */
    scale.i = ((int32_t)ipart + 127) << 23;
    return scale.f * x;
}

static inline float exp_as_mlx(float x0) {
    float x = x0 < -88.0f ? -88.0f : x0; /* keep the polynomial's integer part in range */
    x = x > 88.0f ? 88.0f : x;
    x = x0 != x0 ? 0.0f : x;
    float r = exp_polynomial(x);
    r = x0 < -88.0f ? 0.0f : r;
    r = x0 > 88.0f ? INFINITY : r;
    return x0 != x0 ? x0 : r;
}

void mlxinfer_exp(const float *restrict in, float *restrict out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = exp_as_mlx(in[i]);
}

#define GROUP 8 /* rows summed side by side, so their dependent additions overlap */

/* x: (rows, vocab) float32 scores (already divided by the temperature); u: (rows,) uniforms;
 * c: (rows, vocab) scratch; out: (rows,) tokens. */
void mlxinfer_draw_rows(const float *restrict x, int64_t rows, int64_t vocab, const float *restrict u,
                        float *restrict c, int32_t *restrict out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * vocab;
        float *cr = c + r * vocab;
        float m = -INFINITY;
        int nan = 0;
        for (int64_t j = 0; j < vocab; j++) {
            m = xr[j] > m ? xr[j] : m;
            nan |= xr[j] != xr[j];
        }
        m = nan ? NAN : m; /* MLX's max carries a NaN through */
        /* a score equal to the maximum counts 1 even where x - max is NaN (inf - inf, a row all
         * -inf: then every token weighs the same, as in MLX) */
        for (int64_t j = 0; j < vocab; j++) cr[j] = xr[j] == m ? 1.0f : exp_as_mlx(xr[j] - m);
    }
    int64_t r0 = 0;
    for (; r0 + GROUP <= rows; r0 += GROUP) {
        float acc[GROUP] = {0};
        for (int64_t j = 0; j < vocab; j++)
            for (int q = 0; q < GROUP; q++) {
                acc[q] += c[(r0 + q) * vocab + j];
                c[(r0 + q) * vocab + j] = acc[q];
            }
    }
    for (int64_t r = r0; r < rows; r++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < vocab; j++) {
            acc += c[r * vocab + j];
            c[r * vocab + j] = acc;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *cr = c + r * vocab;
        float threshold = u[r] * cr[vocab - 1];
        if (threshold != threshold) { /* a NaN row: no c_j > NaN, so MLX's count gives the last token */
            out[r] = (int32_t)(vocab - 1);
            continue;
        }
        int64_t lo = 0, hi = vocab; /* lo = #{j : c_j <= threshold} = V - #{j : c_j > threshold} */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (cr[mid] <= threshold)
                lo = mid + 1;
            else
                hi = mid;
        }
        out[r] = (int32_t)(lo < vocab - 1 ? lo : vocab - 1);
    }
}
