// The arithmetic of attention.h's nodes: the KV cache write and causal attention over it, on host
// pointers. Built with qmm.cpp into the same extension, with the same flags (-ffp-contract=off).
#include "attend_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pool.h"
#include "rows.h"
#include "simd.h"

namespace mlxinfer {

namespace {

// Work (multiply-adds) below which a call runs on one thread.
constexpr int64_t kMinWorkPerThread = 1 << 14;

// y += w * x over n values
inline void axpy(float w, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef MLXINFER_AVX2
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

// Query heads that share a key/value head are computed together, up to kHeads at a time: each key and
// value vector is loaded once for all of them, and their independent chains fill the FMA pipeline. Every
// head's arithmetic is the one it has alone (each chain in the same order), so its bits are too.
#if defined(__AVX512VL__)
constexpr int kHeads = 4;  // 4 heads x 4 keys: 16 sums and 4 keys of 32 registers
#else
constexpr int kHeads = 2;  // 8 sums and 4 keys of 16
#endif

// s[g][t] = dot(q[g], k_t) for t < T, g < G. Four keys share one lane reduction, which gives every key the
// same tree, ((0+4)+(1+5)) + ((2+6)+(3+7)): a key's score depends on neither its neighbours nor T nor G.
// then: the values, asked for (simd.h's prefetch_cols) at the positions these keys are read, so that
// they are in cache when weighted_sum reads them (the caches are too large to stay in any cache).
template <int G>
void scores(const float* const* q, const float* k, int64_t T, int64_t E, float* const* s, const float* then) {
#ifdef MLXINFER_AVX2
  if (E % 8 == 0) {
    for (int64_t t = 0; t < T; t += 4) {
      prefetch_cols(then, t, T, 4, E * sizeof(float));
      const float* kt[4];
      for (int i = 0; i < 4; ++i) kt[i] = k + std::min(t + i, T - 1) * E;  // a missing key repeats the last, dropped
      __m256 a[G][4];
      for (int g = 0; g < G; ++g) {
        for (int i = 0; i < 4; ++i) a[g][i] = _mm256_setzero_ps();
      }
      for (int64_t e = 0; e < E; e += 8) {
        __m256 kv[4];
        for (int i = 0; i < 4; ++i) kv[i] = _mm256_loadu_ps(kt[i] + e);
        for (int g = 0; g < G; ++g) {
          const __m256 qv = _mm256_loadu_ps(q[g] + e);
          for (int i = 0; i < 4; ++i) a[g][i] = _mm256_fmadd_ps(qv, kv[i], a[g][i]);
        }
      }
      for (int g = 0; g < G; ++g) {
        __m128 h[4];
        for (int i = 0; i < 4; ++i) h[i] = _mm_add_ps(_mm256_castps256_ps128(a[g][i]), _mm256_extractf128_ps(a[g][i], 1));
        alignas(16) float r[4];
        _mm_store_ps(r, _mm_hadd_ps(_mm_hadd_ps(h[0], h[1]), _mm_hadd_ps(h[2], h[3])));
        for (int i = 0; i < 4 && t + i < T; ++i) s[g][t + i] = r[i];
      }
    }
    return;
  }
#endif
  for (int g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t) s[g][t] = dot(q[g], k + t * E, E);
  }
}

// y[g] = sum_t p[g][t] * v_t, each element's FMAs in t order from 0 (the tail's axpy is the same chain),
// 32 elements of every y[g] held in registers at a time; add: the chain goes on from y (the same bits as
// one call over both spans). then: the next KV head's keys to ask for meanwhile (none after a row's last).
template <int G>
void weighted_sum(const float* const* p, const float* v, int64_t T, int64_t E, float* const* y, const float* then,
                  bool add = false) {
  int64_t e0 = 0;
#ifdef MLXINFER_AVX2
  for (; e0 + 32 <= E; e0 += 32) {
    if (e0 == 0 && then) prefetch_cols(then, 0, T, T, E * sizeof(float));
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < 4; ++i) acc[g][i] = add ? _mm256_loadu_ps(y[g] + e0 + 8 * i) : _mm256_setzero_ps();
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* vt = v + t * E + e0;
      __m256 vv[4];
      for (int i = 0; i < 4; ++i) vv[i] = _mm256_loadu_ps(vt + 8 * i);
      for (int g = 0; g < G; ++g) {
        const __m256 w = _mm256_broadcast_ss(p[g] + t);
        for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_fmadd_ps(w, vv[i], acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y[g] + e0 + 8 * i, acc[g][i]);
    }
  }
#endif
  for (int g = 0; g < G; ++g) {
    if (!add) std::fill(y[g] + e0, y[g] + E, 0.0f);
    for (int64_t t = 0; t < T; ++t) axpy(p[g][t], v + t * E + e0, y[g] + e0, E - e0);
  }
}

// G heads' softmax of scores p[g][0 .. T) in place (times scale, less the top, exp); their totals. The
// heads' running maxima and sums interleaved: G chains in flight, each in t order.
template <int G>
void softmax(float* const* p, int64_t T, float scale, float* total) {
  float top[G];
  for (int g = 0; g < G; ++g) top[g] = -INFINITY;
  for (int64_t t = 0; t < T; ++t) {
    for (int g = 0; g < G; ++g) {
      p[g][t] *= scale;
      top[g] = std::max(top[g], p[g][t]);
    }
  }
  for (int g = 0; g < G; ++g) {
    int64_t t = 0;
#ifdef MLXINFER_AVX2
    const __m256 topv = _mm256_set1_ps(top[g]);
    for (; t + 8 <= T; t += 8) _mm256_storeu_ps(p[g] + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(p[g] + t), topv)));
#endif
    for (; t < T; ++t) p[g][t] = exp_scalar(p[g][t] - top[g]);
  }
  float sum[G] = {};  // in registers: total may alias p for all the compiler knows
  for (int64_t t = 0; t < T; ++t) {
    for (int g = 0; g < G; ++g) sum[g] += p[g][t];
  }
  for (int g = 0; g < G; ++g) total[g] = sum[g];
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
      const int64_t pos = d.offset + l, slot = pos - d.base;
      for (int64_t kh = 0; kh < d.Hk; ++kh) {
        const float* k = row + (d.H + kh) * d.E;
        if (norm) k = (rms_norm_row(k, norm, normed.data(), d.E, eps), normed.data());  // Qwen3's k_norm
        rotate(k, cos + pos * half, sin + pos * half, kv + (((b * 2) * d.Hk + kh) * d.cap + slot) * d.E, d.E);
        std::memcpy(kv + (((b * 2 + 1) * d.Hk + kh) * d.cap + slot) * d.E, row + (d.H + d.Hk + kh) * d.E,
                    d.E * sizeof(float));
      }
    }
  }
}

// each (row, head, new position) alone over the written cache
void attend_all(const Shapes& d, float scale, const float* qkv, const float* cos, const float* sin, const float* kv,
                const float* norm, float eps, float* out, const float* prefix) {
  const int64_t width = (d.H + 2 * d.Hk) * d.E, half = d.E / 2;
  // per unit (row, key/value head, new position): its query heads rotated, their scores, their softmax,
  // their weighted sums of values, kHeads heads at a time (`scores`)
  const int64_t units = d.B * d.Hk * d.L, group = d.H / d.Hk;
  struct Scratch {
    std::vector<float> q, p, normed;
  };
  // k, v: the row's own positions (from base); kp, vp: the shared prefix's (base of them)
  auto heads = [&]<int G>(int64_t b, int64_t l, int64_t h0, const float* k, const float* v, const float* kp,
                          const float* vp, const float* next, Scratch& w) {
    const int64_t pos = d.offset + l, T = pos + 1;
    float* own[G];  // the own positions' scores, after the prefix's
    const float* q[G];
    float* p[G];
    float* y[G];
    for (int g = 0; g < G; ++g) {
      const float* qh = qkv + (b * d.L + l) * width + (h0 + g) * d.E;
      if (norm) qh = (rms_norm_row(qh, norm, w.normed.data(), d.E, eps), w.normed.data());  // Qwen3's q_norm
      rotate(qh, cos + pos * half, sin + pos * half, w.q.data() + g * d.E, d.E);
      q[g] = w.q.data() + g * d.E;
      p[g] = w.p.data() + g * (d.offset + d.L);
      own[g] = p[g] + d.base;
      y[g] = out + (b * d.L + l) * d.H * d.E + (h0 + g) * d.E;
    }
    if (d.base) scores<G>(q, kp, d.base, d.E, p, vp);  // a key's score depends on no other key: the same bits
    scores<G>(q, k, T - d.base, d.E, own, v);
    float total[G];
    softmax<G>(p, T, scale, total);
    if (d.base) weighted_sum<G>(p, vp, d.base, d.E, y, nullptr);
    weighted_sum<G>(own, v, T - d.base, d.E, y, next, d.base > 0);  // the chain goes on in t order
    for (int g = 0; g < G; ++g) {
      const float inv = 1.0f / total[g];
      for (int64_t i = 0; i < d.E; ++i) y[g][i] *= inv;
    }
  };
  auto unit = [&](int64_t u, Scratch& w) {
    const int64_t l = u % d.L, kh = (u / d.L) % d.Hk, b = u / (d.L * d.Hk);
    const float* k = kv + ((b * 2) * d.Hk + kh) * d.cap * d.E;
    const float* v = kv + ((b * 2 + 1) * d.Hk + kh) * d.cap * d.E;
    const float* kp = prefix ? prefix + kh * d.base * d.E : nullptr;
    const float* vp = prefix ? prefix + (d.Hk + kh) * d.base * d.E : nullptr;
    for (int64_t h0 = kh * group, h1 = h0 + group; h0 < h1;) {
      const int64_t G = std::min<int64_t>(kHeads, h1 - h0);
      // the next kv head's keys, while this one's values are summed (within the row)
      const float* next = h0 + G < h1 ? k : kh + 1 < d.Hk ? kv + ((b * 2) * d.Hk + kh + 1) * d.cap * d.E : nullptr;
      if (G == 4) heads.template operator()<4>(b, l, h0, k, v, kp, vp, next, w);
      if (G == 3) heads.template operator()<3>(b, l, h0, k, v, kp, vp, next, w);
      if (G == 2) heads.template operator()<2>(b, l, h0, k, v, kp, vp, next, w);
      if (G == 1) heads.template operator()<1>(b, l, h0, k, v, kp, vp, next, w);
      h0 += G;
    }
  };
  auto span = [&](int64_t u0, int64_t u1) {
    Scratch w{std::vector<float>(kHeads * d.E), std::vector<float>(kHeads * (d.offset + d.L)), std::vector<float>(d.E)};
    for (int64_t u = u0; u < u1; ++u) unit(u, w);
  };
  Pool& pl = pool();
  const int64_t work = units * group * (d.offset + d.L) * d.E;
  const int64_t threads = std::min<int64_t>(pl.size(), std::max<int64_t>(1, work / kMinWorkPerThread));
  if (threads > 1) {
    const int64_t chunks = std::min<int64_t>(units, 4 * threads), per = (units + chunks - 1) / chunks;
    auto chunk = [&](int i) { span(std::min(units, i * per), std::min(units, (i + 1) * per)); };
    if (pl.try_run(chunk, static_cast<int>(chunks))) return;
  }
  span(0, units);  // one thread, or the pool busy: which thread computes a unit never changes its arithmetic
}

}  // namespace mlxinfer
