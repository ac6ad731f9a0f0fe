// The exp the row ops and attention share: Cody-Waite reduction and a degree-7 polynomial (cpu/kernels.py's
// exp), eight lanes at a time where the build has AVX2+FMA, and the same steps one value at a time.
#pragma once

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

inline float hsum8(__m256 v) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}
#endif

}  // namespace mlxinfer
