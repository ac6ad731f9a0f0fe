// The exp the row ops and attention share: Cody-Waite reduction and a degree-7 polynomial (cpu/kernels.py's
// exp), eight lanes at a time where the build has AVX2+FMA, and the same steps one value at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MLXINFER_AVX2 1
#endif

namespace mlxinfer {

constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
constexpr float kLog2e = 1.44269504088896341f;
// 1/7!, 1/6!, ..., 1/1!, 1: the Taylor coefficients of e^r, highest first
constexpr float kExp[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 1.f / 2, 1.f, 1.f};

inline float exp_scalar(float x) {
  x = std::fmin(std::fmax(x, -87.0f), 88.0f);
  const float n = std::floor(x * kLog2e + 0.5f);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = kExp[0];
  for (int i = 1; i < 8; ++i) p = p * r + kExp[i];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

#ifdef MLXINFER_AVX2
inline __m256 exp8(__m256 v) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  const __m256 r =
      _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi))), _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kExp[0]);
  for (int k = 1; k < 8; ++k) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExp[k]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// lanes i + lanes i + 4: the first step of hsum8's tree
inline __m128 fold8(__m256 v) {
  return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

inline float hsum8(__m256 v) {
  __m128 t = fold8(v);
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

// Asks for the stored columns t1 .. min(n1, t1 + cols) of a weight (colbytes apart from w) ahead of
// use (any rows of a matrix alike: attention asks for its cache's next keys and values so). The tile
// loops read the next column tile's weights after computing on this one, and they come
// from memory (measured: the load after unpacking held ~80% of its samples; with this the 32-row
// output table 5.0 -> 4.3 ms, and the int8 path's one-row step ~6.5 -> ~5 ms)
inline void prefetch_cols(const void* w, int64_t t1, int64_t n1, int64_t cols, int64_t colbytes) {
  const char* p = static_cast<const char*>(w) + t1 * colbytes;
  const int64_t n = (std::min(n1, t1 + cols) - t1) * colbytes;
  for (int64_t off = 0; off < n; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

// hsum8 of four vectors at once, in its order (p = low half + high half, then (p0 + p2) + (p1 + p3))
inline __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m128 pa = fold8(a), pb = fold8(b), pc = fold8(c), pd = fold8(d);
  const __m128 ab = _mm_add_ps(_mm_shuffle_ps(pa, pb, _MM_SHUFFLE(1, 0, 1, 0)), _mm_shuffle_ps(pa, pb, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m128 cd = _mm_add_ps(_mm_shuffle_ps(pc, pd, _MM_SHUFFLE(1, 0, 1, 0)), _mm_shuffle_ps(pc, pd, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_hadd_ps(ab, cd);  // [a0 + a2, a1 + a3, b0 + b2, b1 + b3] pairwise: a's, b's, c's, d's sums
}

// hsum8x4(a, b, c, d) and hsum8x4(e, f, g, h) as one vector, the same additions in both halves at once
inline __m256 hsum8x8(__m256 a, __m256 b, __m256 c, __m256 d, __m256 e, __m256 f, __m256 g, __m256 h) {
  auto fold = [](__m256 x, __m256 y) {  // [fold8(x) | fold8(y)]
    return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
  };
  const __m256 ae = fold(a, e), bf = fold(b, f), cg = fold(c, g), dh = fold(d, h);
  const __m256 abef = _mm256_add_ps(_mm256_shuffle_ps(ae, bf, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(ae, bf, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 cdgh = _mm256_add_ps(_mm256_shuffle_ps(cg, dh, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(cg, dh, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_hadd_ps(abef, cdgh);
}
#endif

// sum of a[i] * b[i]: eight lanes of FMAs reduced by hsum8's tree, then the rest in order (attention's scores,
// rms_norm's sum of squares)
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float t = 0.0f;
#ifdef MLXINFER_AVX2
  __m256 v = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) v = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), v);
  t = hsum8(v);
#endif
  for (; i < n; ++i) t = std::fma(a[i], b[i], t);
  return t;
}

#ifdef MLXINFER_AVX2
// One vector's float32 operations by type, for loops written once for 256 and 512 bits
template <class V>
struct vec;
template <>
struct vec<__m256> {
  static __m256 bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};
#endif

#if defined(MLXINFER_AVX2) && defined(__AVX512F__)
template <>
struct vec<__m512> {
  static __m512 bcast(const float* p) { return _mm512_set1_ps(*p); }
  static __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
};

// 512-bit helpers of the wide tiles (tiles_wide.h, int8_wide.h): two 8-lane vectors as one, and p's eight
// floats in both halves
inline __m512 pair_of(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
inline __m512 twice(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}
#endif

// fn.template operator()<R>(m) for rows m .. m + R - 1 covering 0 .. M: tiles of RMAX rows, then one smaller tile
// (RMAX - 1 rows, ..., 1) for the rest: every several-row tile loop's row order
template <int RMAX, class Fn>
inline void row_tiles_of(int64_t M, Fn&& fn) {
  int64_t m = 0;
  for (; m + RMAX <= M; m += RMAX) fn.template operator()<RMAX>(m);
  auto rest = [&]<int R>(auto& self) {
    if constexpr (R > 0) {
      if (m + R <= M) fn.template operator()<R>(m), m += R;
      self.template operator()<R - 1>(self);
    }
  };
  rest.template operator()<RMAX - 1>(rest);
}

}  // namespace mlxinfer
