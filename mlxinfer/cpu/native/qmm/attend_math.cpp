// The arithmetic of attention.h's nodes: the KV cache write and causal attention over it, on host
// pointers. Built with qmm.cpp into the same extension, with the same flags (-ffp-contract=off).
#include "attend_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "pool.h"
#include "rows.h"
#include "simd.h"

namespace mlxinfer {

namespace {

// Work (multiply-adds) below which a call runs on one thread.
constexpr int64_t kMinWorkPerThread = 1 << 14;

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

// y += w * x over n values
inline void axpy(float w, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef MLXINFER_AVX2
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

// s[t] = dot(q, k_t) for t < T. Four keys share one lane reduction, which gives every key the same
// tree, ((0+4)+(1+5)) + ((2+6)+(3+7)): a key's score depends on neither its neighbours nor T.
void scores(const float* q, const float* k, int64_t T, int64_t E, float* s) {
#ifdef MLXINFER_AVX2
  if (E % 8 == 0) {
    for (int64_t t = 0; t < T; t += 4) {
      // the four keys' FMA chains interleaved (each key's still in e order): four chains in flight
      // instead of one waiting on the last FMA's latency
      const float* kt[4];
      for (int i = 0; i < 4; ++i) kt[i] = k + std::min(t + i, T - 1) * E;  // a missing key repeats the last, dropped
      __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t e = 0; e < E; e += 8) {
        const __m256 qv = _mm256_loadu_ps(q + e);
        for (int i = 0; i < 4; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt[i] + e), a[i]);
      }
      __m128 h[4];
      for (int i = 0; i < 4; ++i) h[i] = _mm_add_ps(_mm256_castps256_ps128(a[i]), _mm256_extractf128_ps(a[i], 1));
      alignas(16) float r[4];
      _mm_store_ps(r, _mm_hadd_ps(_mm_hadd_ps(h[0], h[1]), _mm_hadd_ps(h[2], h[3])));
      for (int i = 0; i < 4 && t + i < T; ++i) s[t + i] = r[i];
    }
    return;
  }
#endif
  for (int64_t t = 0; t < T; ++t) s[t] = dot(q, k + t * E, E);
}

// y = sum_t p[t] * v_t, each element's FMAs in t order, 64 elements of y held in registers at a time
void weighted_sum(const float* p, const float* v, int64_t T, int64_t E, float* y) {
  int64_t e0 = 0;
#ifdef MLXINFER_AVX2
  for (; e0 + 64 <= E; e0 += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t t = 0; t < T; ++t) {
      const __m256 w = _mm256_broadcast_ss(p + t);
      const float* vt = v + t * E + e0;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(y + e0 + 8 * i, acc[i]);
  }
#endif
  std::fill(y + e0, y + E, 0.0f);
  for (int64_t t = 0; t < T; ++t) axpy(p[t], v + t * E + e0, y + e0, E - e0);
}

// rope_rows' arithmetic (rows.cpp) for one head vector at one position
inline void rotate(const float* x, const float* c, const float* s, float* y, int64_t E) {
  const int64_t half = E / 2;
  for (int64_t i = 0; i < half; ++i) {
    y[i] = x[i] * c[i] - x[half + i] * s[i];
    y[half + i] = x[half + i] * c[i] + x[i] * s[i];
  }
}

}  // namespace

// the new positions' keys (rotated) and values into the cache kv (B, 2, Hk, cap, E)
void write(const Shapes& d, const float* qkv, const float* cos, const float* sin, const float* norm, float eps,
           float* kv) {
  const int64_t width = (d.H + 2 * d.Hk) * d.E, half = d.E / 2;
  std::vector<float> normed(norm ? d.E : 0);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t l = 0; l < d.L; ++l) {
      const float* row = qkv + (b * d.L + l) * width;
      const int64_t pos = d.offset + l;
      for (int64_t kh = 0; kh < d.Hk; ++kh) {
        const float* k = row + (d.H + kh) * d.E;
        if (norm) k = (rms_norm_row(k, norm, normed.data(), d.E, eps), normed.data());  // Qwen3's k_norm
        rotate(k, cos + pos * half, sin + pos * half, kv + (((b * 2) * d.Hk + kh) * d.cap + pos) * d.E, d.E);
        std::memcpy(kv + (((b * 2 + 1) * d.Hk + kh) * d.cap + pos) * d.E, row + (d.H + d.Hk + kh) * d.E,
                    d.E * sizeof(float));
      }
    }
  }
}

// each (row, head, new position) alone over the written cache
void attend_all(const Shapes& d, float scale, const float* qkv, const float* cos, const float* sin, const float* kv,
                const float* norm, float eps, float* out) {
  const int64_t width = (d.H + 2 * d.Hk) * d.E, half = d.E / 2;
  // per unit: the query rotated, its scores, their softmax, the weighted sum of values
  const int64_t units = d.B * d.H * d.L, group = d.H / d.Hk;
  auto unit = [&](int64_t u, std::vector<float>& q, std::vector<float>& p, std::vector<float>& normed) {
    const int64_t l = u % d.L, h = (u / d.L) % d.H, b = u / (d.L * d.H);
    const int64_t pos = d.offset + l, T = pos + 1, kh = h / group;
    const float* qh = qkv + (b * d.L + l) * width + h * d.E;
    if (norm) qh = (rms_norm_row(qh, norm, normed.data(), d.E, eps), normed.data());  // Qwen3's q_norm
    rotate(qh, cos + pos * half, sin + pos * half, q.data(), d.E);
    const float* k = kv + ((b * 2) * d.Hk + kh) * d.cap * d.E;
    const float* v = kv + ((b * 2 + 1) * d.Hk + kh) * d.cap * d.E;
    scores(q.data(), k, T, d.E, p.data());
    float top = -INFINITY;
    for (int64_t t = 0; t < T; ++t) {
      p[t] *= scale;
      top = std::max(top, p[t]);
    }
    int64_t t = 0;
#ifdef MLXINFER_AVX2
    const __m256 topv = _mm256_set1_ps(top);
    for (; t + 8 <= T; t += 8) _mm256_storeu_ps(p.data() + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(p.data() + t), topv)));
#endif
    for (; t < T; ++t) p[t] = exp_scalar(p[t] - top);
    float total = 0.0f;
    for (t = 0; t < T; ++t) total += p[t];
    float* y = out + (b * d.L + l) * d.H * d.E + h * d.E;
    weighted_sum(p.data(), v, T, d.E, y);
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < d.E; ++i) y[i] *= inv;
  };
  auto span = [&](int64_t u0, int64_t u1) {
    std::vector<float> q(d.E), p(d.offset + d.L), normed(d.E);
    for (int64_t u = u0; u < u1; ++u) unit(u, q, p, normed);
  };
  Pool& pl = pool();
  const int64_t work = units * (d.offset + d.L) * d.E;
  const int64_t threads = std::min<int64_t>(pl.size(), std::max<int64_t>(1, work / kMinWorkPerThread));
  std::unique_lock<std::mutex> lock(pl.busy(), std::try_to_lock);
  if (threads <= 1 || !lock.owns_lock()) {
    span(0, units);  // which thread computes a unit never changes its arithmetic
    return;
  }
  const int64_t chunks = std::min<int64_t>(units, 4 * threads), per = (units + chunks - 1) / chunks;
  pl.run([&](int i) { span(std::min(units, i * per), std::min(units, (i + 1) * per)); }, static_cast<int>(chunks));
}

}  // namespace mlxinfer
