// y = x @ dequantize(w).T for MLX's affine layout (4 or 8 bits, groups of 32, 64 or 128) with
// float32 activations, as an MLX primitive on the CPU stream.
//
// BATCH INVARIANCE, BY DESIGN. Every output y[m, n] is computed by one fixed sequence of float32
// operations that depends only on K, the group size and the bits, never on M (the number of rows),
// on which other rows or columns share its tile, on the tile shape or on the thread split:
//   * per row, the group sums of x (for the biases) are added in k order, and x is reordered into
//     the kernel's lane order, each row on its own;
//   * per (m, n), eight lane accumulators p take q * x for the group's values in a fixed order (block
//     by block, sub-vector j = 0..V-1 within a block, one FMA each), then acc += scale * p per group;
//     the lanes of acc are reduced by one fixed tree (hsum8, simd.h), then the bias term sum_g b[g] * xsum[g]
//     (again fixed lanes, fixed tree, then a scalar tail in g order) is added last;
//   * tiles of R rows x NC columns only share the unpacking of the weights: each (m, n) keeps its own
//     accumulators, and every tile shape runs the same intrinsics in the same order for each of them;
//   * threads split the output columns, never K, so no partial sums are combined across threads;
//   * the build uses -ffp-contract=off so the compiler cannot fuse a multiply and an add in one
//     inlined copy of the code and not in another.
// So a row computed alone has the same bits as the same row inside a batch of 64. Which code path
// runs (AVX2 or portable) is also chosen from K, the group size and the bits alone.
#include "qmm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "pool.h"

#include "scales.h"
#include "simd.h"
#ifdef MLXINFER_AVX2
#define MLXINFER_QMM_AVX2 1
#endif

namespace mlxinfer {

namespace {

// Fewer weights than this per call run on one thread: waking a second one costs more than it saves.
constexpr int64_t kMinWeightsPerThread = 1 << 16;

// ------------------------------------------------------------------ the arithmetic

struct Ctx {
  const float* x;  // (M, K) row-major
  const float* xp;  // (M, K) in lane order (AVX2 path only)
  const float* xsum;  // (M, G) group sums of x
  const uint32_t* w;  // (N, Kw)
  const void* s;  // (N, G) scales, in the dtype the tag names
  const void* b;  // (N, G) biases
  float* y;  // (M, ldy): this weight's N columns start here
  int64_t M, N, K, G, Kw, ldy;
  int gs, bits;
};

void group_sums(const float* x, float* xsum, int64_t K, int gs) {
  for (int64_t g = 0; g < K / gs; ++g) {
    float t = 0.0f;
    for (int i = 0; i < gs; ++i) t += x[g * gs + i];
    xsum[g] = t;
  }
}

inline uint32_t value_at(const uint32_t* row, int64_t k, int bits) {
  const int64_t bit = k * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

// The portable path: one (m, n) at a time, the same order for every M.
template <class S>
void portable_range(const Ctx& c, int64_t n0, int64_t n1) {
  using T = typename S::T;
  for (int64_t m = 0; m < c.M; ++m) {
    const float* x = c.x + m * c.K;
    const float* xs = c.xsum + m * c.G;
    for (int64_t n = n0; n < n1; ++n) {
      const uint32_t* wr = c.w + n * c.Kw;
      const T* s = static_cast<const T*>(c.s) + n * c.G;
      const T* b = static_cast<const T*>(c.b) + n * c.G;
      float acc = 0.0f;
      for (int64_t g = 0; g < c.G; ++g) {
        float d = 0.0f;
        for (int i = 0; i < c.gs; ++i) {
          const int64_t k = g * c.gs + i;
          d += static_cast<float>(value_at(wr, k, c.bits)) * x[k];
        }
        acc += widen(S{}, s[g]) * d;
      }
      float bt = 0.0f;
      for (int64_t g = 0; g < c.G; ++g) bt += widen(S{}, b[g]) * xs[g];
      c.y[m * c.ldy + n] = acc + bt;
    }
  }
}

#ifdef MLXINFER_QMM_AVX2

inline __m256 widen8(F32, const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 widen8(F16, const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 widen8(BF16, const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <class S>
inline float bias_dot(const typename S::T* b, const float* xs, int64_t G) {
  __m256 v = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) v = _mm256_fmadd_ps(widen8(S{}, b + g), _mm256_loadu_ps(xs + g), v);
  float t = hsum8(v);
  for (; g < G; ++g) t = std::fma(widen(S{}, b[g]), xs[g], t);
  return t;
}

// x reordered so that lane l of sub-vector j of a block (8 words, 8 * V values) holds the value
// the j-th field of word l multiplies: k = block * 8V + l * V + j. Field j < V - 1 is read from the
// word by a mask alone, not shifted down, so it arrives as q * 2^(j * bits); its x is stored times
// 2^-(j * bits) to match. Both scalings are exact powers of two, so each product q * x, and so every
// sum, has the same bits as with a shift (one instruction fewer per 8 weights).
void lane_order(const float* x, float* xp, int64_t K, int bits) {
  const int V = 32 / bits, BV = 8 * V;
  float scale[8];
  for (int j = 0; j < V; ++j) scale[j] = j == V - 1 ? 1.0f : std::ldexp(1.0f, -j * bits);
  for (int64_t blk = 0; blk < K / BV; ++blk) {
    for (int j = 0; j < V; ++j) {
      for (int l = 0; l < 8; ++l) xp[blk * BV + j * 8 + l] = x[blk * BV + l * V + j] * scale[j];
    }
  }
}

// Scale groups a tile widens up front (K / group_size); avx2_layout sends longer rows to the portable path.
constexpr int64_t kMaxTileGroups = 1024;

inline const float* widen_row(F32, const float* s, float*, int64_t) {
  return s;
}
template <class S>
inline const float* widen_row(S, const typename S::T* s, float* buf, int64_t G) {
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) _mm256_store_ps(buf + g, widen8(S{}, s + g));
  for (; g < G; ++g) buf[g] = widen(S{}, s[g]);
  return buf;
}

template <int BITS, int GS, class S, int R, int NC>
void tile(const Ctx& c, int64_t m0, int64_t n0) {
  using T = typename S::T;
  constexpr int V = 32 / BITS;
  constexpr int BV = 8 * V;
  constexpr int WG = GS * BITS / 32;  // words per group
  constexpr int64_t BPG = WG >= 8 ? WG / 8 : 1;  // blocks per scaling step
  const int64_t nblk = c.K / BV;
  __m256i masks[V];  // field f's bits, in place
#pragma GCC unroll 4
  for (int f = 0; f < V; ++f) masks[f] = _mm256_set1_epi32(((1 << BITS) - 1) << (f * BITS));
  const uint32_t* wp[NC];
  const T* sp[NC];
  // each column's scales widened to float32 once per tile (exact), read back as broadcasts
  alignas(32) float sbuf[NC][kMaxTileGroups];
  const float* sf[NC];
  const float* xp[R];
  __m256 acc[R][NC];
#pragma GCC unroll 4
  for (int j = 0; j < NC; ++j) {
    wp[j] = c.w + (n0 + j) * c.Kw;
    sp[j] = static_cast<const T*>(c.s) + (n0 + j) * c.G;
    sf[j] = widen_row(S{}, sp[j], sbuf[j], c.G);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    xp[r] = c.xp + (m0 + r) * c.K;
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t blk = 0, step = 0; blk < nblk; blk += BPG, ++step) {  // step: the group (two for 4-bit/32)
    __m256 p[R][NC];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) p[r][j] = _mm256_setzero_ps();
    }
    for (int64_t bb = blk; bb < blk + BPG; ++bb) {
      __m256i v[NC];
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        // the same bytes two tiles ahead: a tile reads NC short runs (a row is K * bits / 8
        // bytes), too short for the hardware prefetcher to ramp up on before each ends
        _mm_prefetch(reinterpret_cast<const char*>(wp[j] + 2 * NC * c.Kw + bb * 8), _MM_HINT_T0);
        v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[j] + bb * 8));
      }
      // field by field: each row's x is loaded once and serves every column of the tile
#pragma GCC unroll 8
      for (int f = 0; f < V; ++f) {
        __m256 xv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(xp[r] + bb * BV + f * 8);
#pragma GCC unroll 4
        for (int j = 0; j < NC; ++j) {
          // q * 2^(f * BITS) (lane_order scaled x to match); the top field is shifted down, as its
          // bit 31 would read as a sign
          const __m256i q = f == V - 1 ? _mm256_srli_epi32(v[j], f * BITS) : _mm256_and_si256(v[j], masks[f]);
          const __m256 qf = _mm256_cvtepi32_ps(q);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) p[r][j] = _mm256_fmadd_ps(qf, xv[r], p[r][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(sp[j] + NC * c.G + 2 * step), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(static_cast<const T*>(c.b) + (n0 + j + NC) * c.G + 2 * step), _MM_HINT_T0);
      __m256 sv;
      if constexpr (WG >= 8) {
        sv = _mm256_broadcast_ss(sf[j] + step);
      } else {  // 4-bit groups of 32: a block holds two groups, four lanes each
        sv = _mm256_set_m128(_mm_broadcast_ss(sf[j] + 2 * step + 1), _mm_broadcast_ss(sf[j] + 2 * step));
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(sv, p[r][j], acc[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) {
      const int64_t n = n0 + j;
      const float bt = bias_dot<S>(static_cast<const T*>(c.b) + n * c.G, c.xsum + (m0 + r) * c.G, c.G);
      c.y[(m0 + r) * c.ldy + n] = hsum8(acc[r][j]) + bt;
    }
  }
}

template <int BITS, int GS, class S, int R, int NCMAX>
void tiles(const Ctx& c, int64_t m0, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NCMAX <= n1; n += NCMAX) tile<BITS, GS, S, R, NCMAX>(c, m0, n);
  if constexpr (NCMAX > 1) tiles<BITS, GS, S, R, NCMAX / 2>(c, m0, n, n1);  // the last < NCMAX columns
}

constexpr int64_t kRowBlock = 64;  // rows that share one pass over the weights
constexpr int64_t kColTile = 16;  // columns whose packed weights stay in L1 while the rows pass

template <int BITS, int GS, class S>
void avx2_range(const Ctx& c, int64_t n0, int64_t n1) {
  for (int64_t mb = 0; mb < c.M; mb += kRowBlock) {
    const int64_t me = std::min(c.M, mb + kRowBlock);
    for (int64_t t0 = n0; t0 < n1; t0 += kColTile) {
      const int64_t t1 = std::min(n1, t0 + kColTile);
      if (me - mb == 1) {
        tiles<BITS, GS, S, 1, 4>(c, mb, t0, t1);
        continue;
      }
      // four rows share each column's unpacking (the unpacking, not the FMAs, bounds a tile)
      int64_t m = mb;
      for (; m + 4 <= me; m += 4) tiles<BITS, GS, S, 4, 2>(c, m, t0, t1);
      if (m + 2 <= me) tiles<BITS, GS, S, 2, 2>(c, m, t0, t1), m += 2;
      if (m < me) tiles<BITS, GS, S, 1, 2>(c, m, t0, t1);
    }
  }
}

bool avx2_layout(int64_t K, int bits, int group_size) {
  return K % (8 * (32 / bits)) == 0 && K / group_size <= kMaxTileGroups;  // whole blocks of 8 packed words
}

#endif  // MLXINFER_QMM_AVX2

template <class S>
std::function<void(int64_t, int64_t)> pick_range(const Ctx& c, bool avx2) {
#ifdef MLXINFER_QMM_AVX2
  if (avx2) {
    // bits and group size as template arguments: every loop bound and branch of a tile is a constant
    using Range = std::function<void(int64_t, int64_t)>;
    auto with = [&c]<int BITS>() -> Range {
      if (c.gs == 32) return [&c](int64_t n0, int64_t n1) { avx2_range<BITS, 32, S>(c, n0, n1); };
      if (c.gs == 64) return [&c](int64_t n0, int64_t n1) { avx2_range<BITS, 64, S>(c, n0, n1); };
      return [&c](int64_t n0, int64_t n1) { avx2_range<BITS, 128, S>(c, n0, n1); };
    };
    return c.bits == 4 ? with.template operator()<4>() : with.template operator()<8>();
  }
#endif
  (void)avx2;
  return [&c](int64_t n0, int64_t n1) { portable_range<S>(c, n0, n1); };
}

}  // namespace

void dequantize_row(const uint32_t* w, const void* s, const void* b, ScaleType scale_type, float* y, int64_t K,
                    int group_size, int bits) {
  auto run = [&]<class S>(S) {
    const auto* sp = static_cast<const typename S::T*>(s);
    const auto* bp = static_cast<const typename S::T*>(b);
    for (int64_t k = 0; k < K; ++k) {
      const float scaled = static_cast<float>(value_at(w, k, bits)) * widen(S{}, sp[k / group_size]);
      y[k] = scaled + widen(S{}, bp[k / group_size]);
    }
  };
  if (scale_type == ScaleType::f16) {
    run(F16{});
  } else if (scale_type == ScaleType::bf16) {
    run(BF16{});
  } else {
    run(F32{});
  }
}

bool compiled_with_avx2() {
#ifdef MLXINFER_QMM_AVX2
  return true;
#else
  return false;
#endif
}

int thread_count() {
  return pool().size();
}

void qmm_f32(const float* x, const std::vector<Weight>& weights, ScaleType scale_type, float* y, int64_t M, int64_t K,
             int group_size, int bits) {
  int64_t ldy = 0;
  for (const Weight& wt : weights) ldy += wt.N;
  if (M == 0 || ldy == 0) return;
  const int64_t G = K / group_size;
  std::vector<float> xsum(M * G);
  for (int64_t m = 0; m < M; ++m) group_sums(x + m * K, xsum.data() + m * G, K, group_size);
  bool avx2 = false;
  std::vector<float> xp;
#ifdef MLXINFER_QMM_AVX2
  avx2 = avx2_layout(K, bits, group_size);
  if (avx2) {
    xp.resize(M * K);
    for (int64_t m = 0; m < M; ++m) lane_order(x + m * K, xp.data() + m * K, K, bits);
  }
#endif
  // one context per weight (its columns of y), and a fixed split of all their columns into chunks
  // (multiples of 4, so that full tiles stay full; a chunk never spans two weights)
  std::vector<Ctx> ctx(weights.size());
  std::vector<std::function<void(int64_t, int64_t)>> range(weights.size());
  struct Chunk {
    size_t weight;
    int64_t n0, n1;
  };
  std::vector<Chunk> chunks;
  Pool& p = pool();
  const int64_t threads = std::min<int64_t>(p.size(), std::max<int64_t>(1, ldy * K / kMinWeightsPerThread));
  const int64_t per = std::max<int64_t>(4, (ldy / (4 * threads) + 3) / 4 * 4);
  int64_t col = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    Ctx& c = ctx[i];
    c.x = x, c.w = weights[i].w, c.s = weights[i].s, c.b = weights[i].b, c.y = y + col;
    c.M = M, c.N = weights[i].N, c.K = K, c.G = G, c.Kw = K * bits / 32, c.ldy = ldy;
    c.gs = group_size, c.bits = bits, c.xsum = xsum.data(), c.xp = xp.data();
    range[i] = scale_type == ScaleType::f16 ? pick_range<F16>(c, avx2)
        : scale_type == ScaleType::bf16     ? pick_range<BF16>(c, avx2)
                                            : pick_range<F32>(c, avx2);
    for (int64_t n = 0; n < c.N; n += per) chunks.push_back({i, n, std::min(c.N, n + per)});
    col += c.N;
  }
  std::unique_lock<std::mutex> lock(p.busy(), std::try_to_lock);
  if (threads <= 1 || !lock.owns_lock()) {  // same results: the split never changes an output's arithmetic
    for (const Chunk& ch : chunks) range[ch.weight](ch.n0, ch.n1);
    return;
  }
  p.run([&](int i) { range[chunks[i].weight](chunks[i].n0, chunks[i].n1); }, static_cast<int>(chunks.size()));
}

}  // namespace mlxinfer
