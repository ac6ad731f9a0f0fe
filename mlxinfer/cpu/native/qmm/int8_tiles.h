// The int8 path's layout (int8.cpp's opening comment) and its AVX2 tiles: included by int8.cpp alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tiles.h"

namespace mlxinfer::int8_tiles {

constexpr int64_t kColTile = 16;  // columns unpacked to bytes at a time for several rows (16 K bytes)


struct Seg {
  int64_t g0;  // first group
  int ts;  // groups: 8, 4, 2 or 1
  int64_t op0;  // first operand
  int ops;  // operands: ts * gs / 32
};

inline std::vector<Seg> segments(int64_t G, int gs) {
  std::vector<Seg> out;
  int64_t g = 0, op = 0;
  auto add = [&](int ts) {
    out.push_back({g, ts, op, ts * gs / 32});
    g += ts;
    op += ts * gs / 32;
  };
  while (g + 8 <= G) add(8);
  for (int ts : {4, 2, 1}) {
    if (G - g >= ts) add(ts);
  }
  return out;
}

// every (operand, byte, k, lane e of the lane scales) of a row, in storage order
template <class Fn>
void each_byte(const std::vector<Seg>& segs, int gs, Fn&& fn) {
  int64_t e0 = 0;
  for (const Seg& s : segs) {
    const int P = 8 / s.ts;
    for (int j = 0; j < s.ops; ++j) {
      for (int l = 0; l < 8; ++l) {
        const int64_t base = (s.g0 + l / P) * gs + (j * P + l % P) * 4;
        for (int t = 0; t < 4; ++t) fn(s.op0 + j, 4 * l + t, base + t, e0 + l);
      }
    }
    e0 += 8;
  }
}

// code of (operand o, byte i) in a stored row
inline int code_at(const uint8_t* row, int64_t o, int i, int bits) {
  return bits == 8 ? row[o * 32 + i] : (row[(o / 2) * 32 + i] >> (4 * (o % 2))) & 15;
}

struct Ctx8 {
  const int8_t* xq;  // (M, K) operand order
  const float* dl;  // (M, 8 * segments): each lane's d
  const float* xl;  // (M, 8 * segments): each lane's float(X)
  const uint8_t* w;  // (N, rowbytes) stored codes
  const void* s;  // (N, L): lane scales (int8_lane_groups), in the dtype the tag names
  const void* b;  // (N, L): lane biases
  float* y;  // (M, ldy)
  int64_t M, N, K, G, ldy, rowbytes, L;  // L: 8 * segments
  int gs, bits;
  const std::vector<Seg>* segs;
};

inline float tree8(const float* f) {
  return ((f[0] + f[4]) + (f[2] + f[6])) + ((f[1] + f[5]) + (f[3] + f[7]));
}

#ifdef MLXINFER_QMM_AVX2

// acc + the four-byte dot products of w (unsigned codes, < 16 where FOUR_BIT) and x (signed), per 32-bit lane
template <bool FOUR_BIT>
inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  // as asm: GCC 12 gives _mm256_dpbusd_epi32 the low 16 registers only, and a 4x4 tile's 16 sums plus
  // its operands then cost a register move per dot product (measured: ~1.5x slower)
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
  return acc;
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (FOUR_BIT) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));  // |pair| <= 2 * 15 * 127
  } else {  // maddubs would saturate on 8-bit codes: their two nibbles apart, then 16 * high + low
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(w, nib), x), ones);
    const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), nib), x), ones);
    return _mm256_add_epi32(acc, _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 4)));
  }
#endif
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Where a tile reads and writes: row r's codes, lane d and lane X (at this segment's lanes), column j's codes
// and lane scales and biases, and the (m, n) float sums f (in memory, touched once a segment).
template <class T, int R, int NC>
struct Tile {
  const int8_t* x[R];
  const float* dl[R];
  const float* xl[R];
  const uint8_t* w[NC];
  const T* sl[NC];
  const T* bl[NC];
  float (*f)[NC][8];
};

// One segment for R rows x NC columns: the integer sums over its OPS operands (a constant: the loop unrolls
// and the sums stay in registers), then the float steps (the opening comment) into t.f. Column j's codes:
// bytes (t.w[j] + o * 32 for operand o), or, with PACKED, 4-bit pairs as stored (unpacked here, for one
// row, where there is no other row to share the unpacking).
template <bool FOUR_BIT, bool PACKED, class S, int R, int NC, int OPS>
inline void segment(const Tile<typename S::T, R, NC>& t, int64_t op0, int64_t e) {
  __m256i I[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NC; ++j) I[r][j] = _mm256_setzero_si256();
  }
  if constexpr (PACKED) {
    static_assert(OPS % 2 == 0, "4-bit segments hold whole pairs (int8_supports)");
    const __m256i nib = _mm256_set1_epi8(15);
#pragma GCC unroll 1  // unrolled, GCC spilled the sums (measured slower)
    for (int u = 0; u < OPS; u += 2) {
      const int64_t o = op0 + u;
      __m256i x0[R], x1[R];
      for (int r = 0; r < R; ++r) x0[r] = load32(t.x[r] + o * 32), x1[r] = load32(t.x[r] + o * 32 + 32);
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        const __m256i v = load32(t.w[j] + o * 16);
        const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        for (int r = 0; r < R; ++r) I[r][j] = dot4<true>(dot4<true>(I[r][j], lo, x0[r]), hi, x1[r]);
      }
    }
  } else {
#pragma GCC unroll 1  // as above
    for (int u = 0; u < OPS; ++u) {
      const int64_t o = op0 + u;
      __m256i xv[R];
      for (int r = 0; r < R; ++r) xv[r] = load32(t.x[r] + o * 32);
#pragma GCC unroll 4
      for (int j = 0; j < NC; ++j) {
        const __m256i wv = load32(t.w[j] + o * 32);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) I[r][j] = dot4<FOUR_BIT>(I[r][j], wv, xv[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NC; ++j) {
    const __m256 sv = tiles::widen8(S{}, t.sl[j] + e), bv = tiles::widen8(S{}, t.bl[j] + e);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 v = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(I[r][j]), _mm256_mul_ps(bv, _mm256_loadu_ps(t.xl[r] + e)));
      _mm256_store_ps(t.f[r][j], _mm256_fmadd_ps(_mm256_loadu_ps(t.dl[r] + e), v, _mm256_load_ps(t.f[r][j])));
    }
  }
}

// y[m0 + r, n0 + j] from the (r, j) float sums f: tree8's order
template <int R, int NC>
inline void write_sums(const Ctx8& c, int64_t m0, int64_t n0, const float (*f)[NC][8]) {
  int r = 0;
  if constexpr (NC == 4) {  // two rows at once (hsum8x8: the same additions as hsum8x4)
    for (; r + 1 < R; r += 2) {
      const __m256 y = hsum8x8(_mm256_load_ps(f[r][0]), _mm256_load_ps(f[r][1]), _mm256_load_ps(f[r][2]), _mm256_load_ps(f[r][3]),
                               _mm256_load_ps(f[r + 1][0]), _mm256_load_ps(f[r + 1][1]), _mm256_load_ps(f[r + 1][2]), _mm256_load_ps(f[r + 1][3]));
      _mm_storeu_ps(c.y + (m0 + r) * c.ldy + n0, _mm256_castps256_ps128(y));
      _mm_storeu_ps(c.y + (m0 + r + 1) * c.ldy + n0, _mm256_extractf128_ps(y, 1));
    }
  }
  for (; r < R; ++r) {  // tree8's order
    if constexpr (NC == 4) {
      const __m128 y = hsum8x4(_mm256_load_ps(f[r][0]), _mm256_load_ps(f[r][1]), _mm256_load_ps(f[r][2]), _mm256_load_ps(f[r][3]));
      _mm_storeu_ps(c.y + (m0 + r) * c.ldy + n0, y);
    } else {
      for (int j = 0; j < NC; ++j) c.y[(m0 + r) * c.ldy + n0 + j] = hsum8(_mm256_load_ps(f[r][j]));
    }
  }
}

template <bool FOUR_BIT, bool PACKED, class S, int R, int NC>
void tile(const Ctx8& c, int64_t m0, int64_t n0, const uint8_t* const* cols) {
  using T = typename S::T;
  alignas(32) float f[R][NC][8];
  Tile<T, R, NC> t;
  t.f = f;
  for (int j = 0; j < NC; ++j) {
    t.w[j] = cols[j];
    t.sl[j] = static_cast<const T*>(c.s) + (n0 + j) * c.L;
    t.bl[j] = static_cast<const T*>(c.b) + (n0 + j) * c.L;
  }
  for (int r = 0; r < R; ++r) {
    t.x[r] = c.xq + (m0 + r) * c.K;
    t.dl[r] = c.dl + (m0 + r) * c.L;
    t.xl[r] = c.xl + (m0 + r) * c.L;
    for (int j = 0; j < NC; ++j) _mm256_store_ps(f[r][j], _mm256_setzero_ps());
  }
  int64_t e = 0;
  for (const Seg& sg : *c.segs) {
    switch (sg.ops) {
      case 1:
        if constexpr (!PACKED) segment<FOUR_BIT, PACKED, S, R, NC, 1>(t, sg.op0, e);
        break;
      case 2: segment<FOUR_BIT, PACKED, S, R, NC, 2>(t, sg.op0, e); break;
      case 4: segment<FOUR_BIT, PACKED, S, R, NC, 4>(t, sg.op0, e); break;
      case 8: segment<FOUR_BIT, PACKED, S, R, NC, 8>(t, sg.op0, e); break;
      case 16: segment<FOUR_BIT, PACKED, S, R, NC, 16>(t, sg.op0, e); break;
      default: segment<FOUR_BIT, PACKED, S, R, NC, 32>(t, sg.op0, e); break;
    }
    e += 8;
  }
  write_sums<R, NC>(c, m0, n0, f);
}

#if defined(__AVX512VL__)
constexpr int kRows = 4, kCols = 4;  // 16 integer sums, 4 rows of x, a column: 21 of 32 registers
#else
constexpr int kRows = 3, kCols = 3;  // 9 + 3 + 1 of 16 (and maddubs' temporaries)
#endif

template <bool FOUR_BIT, bool PACKED, class S, int R>
void tile_cols(const Ctx8& c, int64_t m0, int64_t t0, int64_t t1, const uint8_t* const* cols) {
  int64_t n = t0;
  for (; n + kCols <= t1; n += kCols) tile<FOUR_BIT, PACKED, S, R, kCols>(c, m0, n, cols + (n - t0));
  for (; n < t1; ++n) tile<FOUR_BIT, PACKED, S, R, 1>(c, m0, n, cols + (n - t0));
}

#endif  // MLXINFER_QMM_AVX2

}  // namespace mlxinfer::int8_tiles
