// Where the int8 path's tiles run (avx2_range), and its 512-bit tiles for several rows: included by int8.cpp alone.
//
// THE 512-BIT TILES (AVX-512 VNNI builds). A 512-bit VNNI instruction holds one operand of two columns: column
// 2q's 32 bytes in its low half, column 2q + 1's in its high half (unpack_bytes' pairs), times one row's
// operand in both halves. Its sixteen lanes are then exactly the two columns' eight lane sums, as int8_tiles'
// 256-bit tiles have them, and the float steps (int8.cpp's opening comment) run on sixteen lanes at once: each
// lane the same fma, mul and fma, so each output has the same bits as there. On Zen 5 one 512-bit VNNI
// instruction retires at the 256-bit rate (measured: ~7.1 a ns per core, either width), twice the multiply-adds;
// on CPUs that split 512-bit instructions it is the same work in fewer instructions.
#pragma once

#include "int8_tiles.h"
#include "wide.h"

namespace mlxinfer::int8_tiles {

#ifdef MLXINFER_QMM_AVX2

// Columns t0 .. t1 of c.w as bytes (4-bit codes unpacked, 8-bit ones copied), operand o of column j at
// out + j K + 32 o; with pairs (the 512-bit tiles), pair by pair: column t0 + 2q's operand o, then column
// t0 + 2q + 1's, at out + 2 q K + 64 o.
inline void unpack_bytes(const Ctx8& c, int64_t t0, int64_t t1, uint8_t* out, bool pairs) {
  const int64_t ops = c.K / 32, stride = pairs ? 64 : 32;
  const __m256i nib = _mm256_set1_epi8(15);
  for (int64_t j = 0; j < t1 - t0; ++j) {
    const uint8_t* stored = c.w + (t0 + j) * c.rowbytes;
    uint8_t* dst = pairs ? out + (j / 2) * 2 * c.K + (j % 2) * 32 : out + j * c.K;
    if (c.bits == 8 && !pairs) {
      std::memcpy(dst, stored, c.K);  // one copy, read in order, which the prefetcher follows
    } else if (c.bits == 8) {
      for (int64_t o = 0; o < ops; ++o) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + o * stride), load32(stored + o * 32));
    } else {
      for (int64_t p = 0; p < ops / 2; ++p) {  // operands 2p and 2p + 1: one vector's low and high nibbles
        const __m256i v = load32(stored + p * 32);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * p * stride), _mm256_and_si256(v, nib));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (2 * p + 1) * stride), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
      }
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kWide = true;  // this build has the 512-bit tiles

inline __m512i dot4_wide(__m512i acc, __m512i w, __m512i x) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));  // as dot4: any of the 32 registers
  return acc;
}

// R rows x 4 columns (two pairs) from unpack_bytes' pairs: pairs[q] holds pair q's operands, 64 bytes each.
// The integer sums (R x 2) and the float sums (R x 2) stay in registers: 4 R of the 32, and the pairs' operands.
template <class S, int R>
void tile_wide(const Ctx8& c, int64_t m0, int64_t n0, const uint8_t* const* pairs) {
  using T = typename S::T;
  const T* sl[4];
  const T* bl[4];
  for (int j = 0; j < 4; ++j) {
    sl[j] = static_cast<const T*>(c.s) + (n0 + j) * c.L;
    bl[j] = static_cast<const T*>(c.b) + (n0 + j) * c.L;
  }
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = c.xq + (m0 + r) * c.K;
  __m512 F[R][2];
  for (int r = 0; r < R; ++r) F[r][0] = F[r][1] = _mm512_setzero_ps();
  int64_t e = 0;
  for (const Seg& sg : *c.segs) {
    __m512i I[R][2];
    for (int r = 0; r < R; ++r) I[r][0] = I[r][1] = _mm512_setzero_si512();
    const int64_t o1 = sg.op0 + sg.ops;
#pragma GCC unroll 2
    for (int64_t o = sg.op0; o < o1; ++o) {
      const __m512i w0 = _mm512_loadu_si512(pairs[0] + o * 64), w1 = _mm512_loadu_si512(pairs[1] + o * 64);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_broadcast_i64x4(load32(x[r] + o * 32));
        I[r][0] = dot4_wide(I[r][0], w0, xv);
        I[r][1] = dot4_wide(I[r][1], w1, xv);
      }
    }
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
      const __m512 sv = pair_of(tiles::widen8(S{}, sl[2 * q] + e), tiles::widen8(S{}, sl[2 * q + 1] + e));
      const __m512 bv = pair_of(tiles::widen8(S{}, bl[2 * q] + e), tiles::widen8(S{}, bl[2 * q + 1] + e));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float* at = c.xl + (m0 + r) * c.L + e;
        const __m512 v = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(I[r][q]), _mm512_mul_ps(bv, twice(at)));
        F[r][q] = _mm512_fmadd_ps(twice(c.dl + (m0 + r) * c.L + e), v, F[r][q]);
      }
    }
    e += 8;
  }
  alignas(64) float f[R][4][8];
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(f[r][0], F[r][0]);
    _mm512_store_ps(f[r][2], F[r][1]);
  }
  write_sums<R, 4>(c, m0, n0, f);
}

template <class S>
void wide_rows(const Ctx8& c, int64_t t0, int64_t t1, const uint8_t* bytes) {
  const int64_t pair_bytes = c.K * 2;
  auto cols = [&]<int R>(int64_t m) {
    for (int64_t n = t0; n < t1; n += 4) {
      const uint8_t* pairs[2] = {bytes + ((n - t0) / 2) * pair_bytes, bytes + ((n - t0) / 2 + 1) * pair_bytes};
      tile_wide<S, R>(c, m, n, pairs);
    }
  };
  row_tiles_of<4>(c.M, cols);
}
#else
constexpr bool kWide = false;
#endif

template <class S>
void avx2_range(const Ctx8& c, int64_t n0, int64_t n1) {
  const uint8_t* cols[kColTile];
  // several rows share one unpacking of each column (unpack_bytes)
  const bool unpack = c.M > 1;
  const bool wide = kWide && wide_tiles();
  std::vector<uint8_t> bytes(unpack ? kColTile * c.K : 0);
  for (int64_t t0 = n0; t0 < n1; t0 += kColTile) {
    const int64_t t1 = std::min(n1, t0 + kColTile);
    const bool pairs = wide && unpack && (t1 - t0) % 4 == 0;
    if (unpack) unpack_bytes(c, t0, t1, bytes.data(), pairs);
    for (int64_t j = 0; j < t1 - t0; ++j) cols[j] = unpack ? bytes.data() + j * c.K : c.w + (t0 + j) * c.rowbytes;
    prefetch_cols(c.w, t1, n1, kColTile, c.rowbytes);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    if (pairs) {
      wide_rows<S>(c, t0, t1, bytes.data());
      continue;
    }
#endif
    if (c.M == 1) {
      if (c.bits == 4) {
        tile_cols<true, true, S, 1>(c, 0, t0, t1, cols);
      } else {
        tile_cols<false, false, S, 1>(c, 0, t0, t1, cols);
      }
      continue;
    }
    auto four_bit = [&]<int R>(int64_t m) { tile_cols<true, false, S, R>(c, m, t0, t1, cols); };
    auto eight_bit = [&]<int R>(int64_t m) { tile_cols<false, false, S, R>(c, m, t0, t1, cols); };
    if (c.bits == 4) {
      row_tiles_of<kRows>(c.M, four_bit);
    } else {
      row_tiles_of<kRows>(c.M, eight_bit);
    }
  }
}

#endif  // MLXINFER_QMM_AVX2

}  // namespace mlxinfer::int8_tiles
