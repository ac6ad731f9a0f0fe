// The AVX2 arithmetic of qmm.cpp (included there alone): x in lane order, and the tiles that compute
// y[m, n] for a few rows and columns at a time. qmm.cpp's opening comment says what stays fixed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <type_traits>

#include "scales.h"
#include "simd.h"
#ifdef MLXINFER_AVX2
#define MLXINFER_QMM_AVX2 1
#endif

namespace mlxinfer::tiles {

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
inline void lane_order(const float* x, float* xp, int64_t K, int bits) {
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
  for (; g + 8 <= G; g += 8) _mm256_storeu_ps(buf + g, widen8(S{}, s + g));
  for (; g < G; ++g) buf[g] = widen(S{}, s[g]);
  return buf;
}

// The fields' masks, read from memory: built with set1, the compiler made each from general registers
// inside the one-row loop, where AVX2's 16 vector registers could not hold all eight.
template <int BITS>
struct FieldMasks {
  alignas(32) uint32_t m[32 / BITS][8] = {};
  constexpr FieldMasks() {
    for (int f = 0; f < 32 / BITS; ++f) std::fill(m[f], m[f] + 8, ((1u << BITS) - 1u) << (f * BITS));
  }
};
template <int BITS>
inline FieldMasks<BITS> kFieldMasks{};  // not const: a constant's loads would be folded back into set1's

// Field f of the words v as q * 2^(f * BITS) in float32 (exact; lane_order scaled x to match). The top
// field is shifted down, as its bit 31 would read as a sign.
template <int BITS, int f>
inline __m256 field(__m256i v) {
  constexpr int V = 32 / BITS;
  if constexpr (f == V - 1) return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, f * BITS));
  const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(kFieldMasks<BITS>.m[f]));
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
}

// The scale of each lane at one step (a group; for 4-bit groups of 32 a block holds two, four lanes each).
template <int BITS, int GS>
inline __m256 step_scale(const float* sf, int64_t step) {
  if constexpr (GS * BITS / 32 >= 8) return _mm256_broadcast_ss(sf + step);
  return _mm256_set_m128(_mm_broadcast_ss(sf + 2 * step + 1), _mm_broadcast_ss(sf + 2 * step));
}

template <class S>
inline void finish(const Ctx& c, int64_t m, int64_t n, __m256 acc) {
  const float bt = bias_dot<S>(static_cast<const typename S::T*>(c.b) + n * c.G, c.xsum + m * c.G, c.G);
  c.y[m * c.ldy + n] = hsum8(acc) + bt;
}

// finish for four columns at once: each column's bias_dot lanes as there, the horizontal sums by hsum8x4
// (hsum8's order), the tail and the last add with the columns in the lanes. The same bits, a fraction of
// the instructions and of the dependent latency (the one-row tiles of decode).
template <class S>
inline void finish4(const Ctx& c, int64_t m, int64_t n, const __m256* acc) {
  using T = typename S::T;
  const T* b[4];
  __m256 v[4];
  const float* xs = c.xsum + m * c.G;
  for (int j = 0; j < 4; ++j) b[j] = static_cast<const T*>(c.b) + (n + j) * c.G, v[j] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= c.G; g += 8) {
    const __m256 x = _mm256_loadu_ps(xs + g);
    for (int j = 0; j < 4; ++j) v[j] = _mm256_fmadd_ps(widen8(S{}, b[j] + g), x, v[j]);
  }
  __m128 t = hsum8x4(v[0], v[1], v[2], v[3]);
  for (; g < c.G; ++g) {
    const __m128 bg = _mm_set_ps(widen(S{}, b[3][g]), widen(S{}, b[2][g]), widen(S{}, b[1][g]), widen(S{}, b[0][g]));
    t = _mm_fmadd_ps(bg, _mm_set1_ps(xs[g]), t);
  }
  _mm_storeu_ps(c.y + m * c.ldy + n, _mm_add_ps(hsum8x4(acc[0], acc[1], acc[2], acc[3]), t));
}

constexpr int64_t kColTile = 16;  // columns unpacked at a time (~36-100 KB of float32: L1/L2)

// The bias terms of W columns (8 or 16: one AVX2 or AVX-512 vector) for one row (lane j: column j), bias_dot's
// arithmetic in every lane: accumulator l here is lane l of bias_dot's sums, taking the same FMAs in the same order,
// then hsum8's tree and the tail. The same bits as bias_dot, without a horizontal sum and a scalar tail per output.
// bt: the columns' biases in float32, group-major (bt[g * W + j] is column j's bias of group g).
template <class V>
inline V bias_dot_cols(const float* bt, const float* xs, int64_t G) {
  constexpr int W = sizeof(V) / 4;
  V v[8] = {};
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) v[l] = vec<V>::fma(*reinterpret_cast<const V*>(bt + (g + l) * W), vec<V>::bcast(xs + g + l), v[l]);
  }
  V t = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));  // hsum8: fold8, then (0 + 2) + (1 + 3)
  for (; g < G; ++g) t = vec<V>::fma(*reinterpret_cast<const V*>(bt + g * W), vec<V>::bcast(xs + g), t);
  return t;
}

// A column tile's bias terms for every row: bt[m * stride + j] = bias_dot of row m and column t0 + j, W columns a
// vector. gt: W * G floats, W columns' biases in float32 group-major; wb: W * Gp floats, the same by column.
template <class S, class V = __m256>
void tile_bias_terms(const Ctx& c, int64_t t0, int64_t t1, float* gt, float* wb, int64_t Gp, float* bt, int64_t stride) {
  using T = typename S::T;
  constexpr int W = sizeof(V) / 4;
  for (int64_t h = t0; h < t1; h += W) {
    for (int64_t j = 0; j < W; ++j) {  // widened a column at a time (vector conversions), then transposed
      const float* b = h + j < t1 ? widen_row(S{}, static_cast<const T*>(c.b) + (h + j) * c.G, wb + j * Gp, c.G) : nullptr;
      for (int64_t g = 0; g < c.G; ++g) gt[g * W + j] = b ? b[g] : 0.0f;
    }
    for (int64_t m = 0; m < c.M; ++m) vec<V>::store(bt + m * stride + (h - t0), bias_dot_cols<V>(gt, c.xsum + m * c.G, c.G));
  }
}

template <int F, int V, class Fn>
inline void each_field(Fn&& fn) {
  if constexpr (F < V) {
    fn(std::integral_constant<int, F>{});
    each_field<F + 1, V>(fn);
  }
}

// One row (decode) against NC columns, unpacking the packed words as it goes. Per (m, n): eight lane
// sums p take q * x field by field, block by block (one FMA each); acc += scale * p each group.
template <int BITS, int GS, class S, int NC>
void row_tile(const Ctx& c, int64_t m, int64_t n0) {
  using T = typename S::T;
  constexpr int V = 32 / BITS, BV = 8 * V, WG = GS * BITS / 32;  // WG: words per group
  constexpr int64_t BPG = WG >= 8 ? WG / 8 : 1, GPS = WG >= 8 ? 1 : 2;  // blocks per step, groups per step
  constexpr int64_t kLine = 64;
  const int64_t nblk = c.K / BV;
  const uint32_t* wp[NC];
  const T* sp[NC];
  alignas(32) float sbuf[NC][kMaxTileGroups];  // each column's scales widened once (exact)
  const float* sf[NC];
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) {
    wp[j] = c.w + (n0 + j) * c.Kw;
    sp[j] = static_cast<const T*>(c.s) + (n0 + j) * c.G;
    sf[j] = widen_row(S{}, sp[j], sbuf[j], c.G);
    acc[j] = _mm256_setzero_ps();
  }
  const float* xp = c.xp + m * c.K;
  for (int64_t blk = 0, step = 0; blk < nblk; blk += BPG, ++step) {
    __m256 p[NC];
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) p[j] = _mm256_setzero_ps();
    for (int64_t bb = blk; bb < blk + BPG; ++bb) {
      __m256i v[NC];
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        // the next tile's bytes, one prefetch a cache line (two blocks): a tile reads NC short runs
        // (a row is K * bits / 8 bytes), too short for the hardware prefetcher to ramp up on
        if ((bb & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(wp[j] + 2 * NC * c.Kw + bb * 8), _MM_HINT_T0);
        v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[j] + bb * 8));
      }
      each_field<0, V>([&](auto f) {
        const __m256 xv = _mm256_loadu_ps(xp + bb * BV + f * 8);
#pragma GCC unroll 4
        for (int j = 0; j < NC; ++j) p[j] = _mm256_fmadd_ps(field<BITS, decltype(f)::value>(v[j]), xv, p[j]);
      });
    }
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) {
      if (step % (kLine / static_cast<int64_t>(GPS * sizeof(T))) == 0) {  // the next tile's scales and biases
        _mm_prefetch(reinterpret_cast<const char*>(sp[j] + NC * c.G + GPS * step), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(static_cast<const T*>(c.b) + (n0 + j + NC) * c.G + GPS * step), _MM_HINT_T0);
      }
      acc[j] = _mm256_fmadd_ps(step_scale<BITS, GS>(sf[j], step), p[j], acc[j]);
    }
  }
  if constexpr (NC == 4) {
    finish4<S>(c, m, n0, acc);
  } else {
    for (int j = 0; j < NC; ++j) finish<S>(c, m, n0 + j, acc[j]);
  }
}

// A column tile's weights unpacked once, in lane order, to the values row_tile's fields give
// (wf: column j's at j * K): every row of a batch then reads them instead of unpacking again.
template <int BITS>
void unpack_cols(const Ctx& c, int64_t n0, int64_t ncols, float* wf) {
  constexpr int V = 32 / BITS, BV = 8 * V;
  for (int64_t j = 0; j < ncols; ++j) {
    const uint32_t* wp = c.w + (n0 + j) * c.Kw;
    float* dst = wf + j * c.K;
    for (int64_t bb = 0; bb < c.K / BV; ++bb) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + bb * 8));
      each_field<0, V>([&](auto f) { _mm256_store_ps(dst + bb * BV + f * 8, field<BITS, decltype(f)::value>(v)); });
    }
  }
}

// R rows x NC columns on unpacked weights, with row_tile's arithmetic for each (m, n): the same
// values in the same order, so a row's bits do not depend on the batch. The running sums acc live in
// memory (touched once a group), which leaves the registers to the R * NC lane sums p.
// bt: the tile's bias terms (tile_bias_terms), row m's at bt + m * kColTile.
template <int BITS, int GS, class S, int R, int NC>
void rows_tile(const Ctx& c, int64_t m0, int64_t n0, const float* wf, const float* const* sf, const float* bt) {
  constexpr int V = 32 / BITS, BV = 8 * V, WG = GS * BITS / 32;
  constexpr int64_t BPG = WG >= 8 ? WG / 8 : 1;
  const int64_t nblk = c.K / BV;
  const float* xr[R];
  const float* wc[NC];
  for (int r = 0; r < R; ++r) xr[r] = c.xp + (m0 + r) * c.K;
  for (int j = 0; j < NC; ++j) wc[j] = wf + j * c.K;
  alignas(32) float acc[R][NC][8];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) _mm256_store_ps(acc[r][j], _mm256_setzero_ps());
  }
  for (int64_t blk = 0, step = 0; blk < nblk; blk += BPG, ++step) {
    __m256 p[R][NC];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) p[r][j] = _mm256_setzero_ps();
    }
    for (int64_t bb = blk; bb < blk + BPG; ++bb) {
#pragma GCC unroll 8
      for (int f = 0; f < V; ++f) {
        const int64_t k = bb * BV + f * 8;
        __m256 xv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(xr[r] + k);
#pragma GCC unroll 4
        for (int j = 0; j < NC; ++j) {
          const __m256 q = _mm256_load_ps(wc[j] + k);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) p[r][j] = _mm256_fmadd_ps(q, xv[r], p[r][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NC; ++j) {
      const __m256 sv = step_scale<BITS, GS>(sf[j], step);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) _mm256_store_ps(acc[r][j], _mm256_fmadd_ps(sv, p[r][j], _mm256_load_ps(acc[r][j])));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float* b = bt + (m0 + r) * kColTile;
    float* y = c.y + (m0 + r) * c.ldy + n0;
    if constexpr (NC == 4) {  // hsum8 of four columns at once, in its order
      const __m128 h = hsum8x4(_mm256_load_ps(acc[r][0]), _mm256_load_ps(acc[r][1]), _mm256_load_ps(acc[r][2]), _mm256_load_ps(acc[r][3]));
      _mm_storeu_ps(y, _mm_add_ps(h, _mm_loadu_ps(b)));
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) y[j] = hsum8(_mm256_load_ps(acc[r][j])) + b[j];
    }
  }
}

template <int BITS, int GS, class S, int NCMAX>
void row_tiles(const Ctx& c, int64_t m, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NCMAX <= n1; n += NCMAX) row_tile<BITS, GS, S, NCMAX>(c, m, n);
  if constexpr (NCMAX > 1) row_tiles<BITS, GS, S, NCMAX / 2>(c, m, n, n1);  // the last < NCMAX columns
}

// columns t0 .. t1 of rows m0 .. m0 + R - 1, tiles of NCMAX columns then the rest one at a time
template <int BITS, int GS, class S, int R, int NCMAX>
void rows_tiles(const Ctx& c, int64_t m0, int64_t t0, int64_t t1, const float* wf, const float* const* sf, const float* bt) {
  int64_t n = t0;
  for (; n + NCMAX <= t1; n += NCMAX) rows_tile<BITS, GS, S, R, NCMAX>(c, m0, n, wf + (n - t0) * c.K, sf + (n - t0), bt + (n - t0));
  for (; n < t1; ++n) rows_tile<BITS, GS, S, R, 1>(c, m0, n, wf + (n - t0) * c.K, sf + (n - t0), bt + (n - t0));
}

// Uninitialised 64-byte aligned floats (aligned AVX and AVX-512 loads; every element is written before it is read)
struct Floats {
  float* p;
  explicit Floats(size_t n) : p(static_cast<float*>(::operator new(n * sizeof(float), std::align_val_t(64)))) {}
  ~Floats() {
    ::operator delete(p, std::align_val_t(64));
  }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
};

// The rows x columns of a tile: as many lane sums as the registers hold beside their operands (R x NC
// sums, R rows of x, one column of weights). AVX-512VL's 32 vector registers take 4 x 4, AVX2's 16
// take 3 x 3; every (m, n) has the same arithmetic in either, so the shape never changes a bit.
#ifdef __AVX512VL__
constexpr int kTileRows = 4, kTileCols = 4;
#else
constexpr int kTileRows = 3, kTileCols = 3;
#endif

inline bool avx2_layout(int64_t K, int bits, int group_size) {
  return K % (8 * (32 / bits)) == 0 && K / group_size <= kMaxTileGroups;  // whole blocks of 8 packed words
}

#endif  // MLXINFER_QMM_AVX2

}  // namespace mlxinfer::tiles
