// Where qmm.cpp's AVX2 tiles run (avx2_range), and their 512-bit form for several rows: included by qmm.cpp alone.
//
// THE 512-BIT TILES (builds with AVX-512F). A vector holds sixteen columns' lane l (one of rows_tile's eight lane
// sums), so an FMA takes sixteen columns' weights times one x broadcast from memory: per lane, exactly the FMAs
// rows_tile takes, in its order. The eight lanes' sums are then added in hsum8's tree, vector by vector, and the
// bias term last, so every output has rows_tile's bits (and row_tile's: a row alone has the bits it has in a
// batch). Against two columns' eight lanes in a vector (x broadcast as eight values, a horizontal sum per
// output), the loop loses its shuffles and runs 6 rows x 32 columns: ~1.6x the multiply-adds a cycle on a Xeon.
#pragma once

#include "tiles.h"
#include "wide.h"

namespace mlxinfer::tiles {

#ifdef MLXINFER_QMM_AVX2

constexpr int64_t kLaneCols = 32;  // columns of a 512-bit tile: two vectors

#if defined(__AVX512F__)
#define MLXINFER_QMM_WIDE 1

// A column tile's weights as the lanes tiles read them: wl[((blk * 8 + l) * V + f) * 32 + j] is field f of word l
// of block blk of column t0 + j, the value unpack_cols gives (word l of sixteen columns in one gather).
template <int BITS>
void unpack_lanes(const Ctx& c, int64_t t0, float* wl) {
  constexpr int V = 32 / BITS;
  const __m512i cols = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(static_cast<int>(c.Kw)));
  for (int64_t h = 0; h < kLaneCols; h += 16) {
    const uint32_t* w = c.w + (t0 + h) * c.Kw;
    for (int64_t word = 0; word < c.K / V; ++word) {  // word = blk * 8 + l
      const __m512i v = _mm512_i32gather_epi32(cols, w + word, 4);
      each_field<0, V>([&](auto f) {
        constexpr int F = decltype(f)::value;
        const __m512i q = F == V - 1 ? _mm512_srli_epi32(v, F * BITS) : _mm512_and_si512(v, _mm512_set1_epi32(((1u << BITS) - 1u) << (F * BITS)));
        _mm512_store_ps(wl + (word * V + F) * kLaneCols + h, _mm512_cvtepi32_ps(q));
      });
    }
  }
}

// R rows x 32 columns (t0 ...): lane l of every column for all of K, then the next lane. sg: the columns' scales,
// group-major (sg[g * 32 + j]); bt: the bias terms (tile_bias_terms), row m's at bt + m * 32.
template <int BITS, int GS, int R>
void lanes_tile(const Ctx& c, int64_t m0, int64_t t0, const float* wl, const float* sg, const float* bt) {
  constexpr int V = 32 / BITS, BV = 8 * V, WG = GS * BITS / 32;
  constexpr int64_t BPG = WG >= 8 ? WG / 8 : 1;
  const int64_t nblk = c.K / BV;
  alignas(64) float lanes[8][R][kLaneCols];
  for (int l = 0; l < 8; ++l) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t blk = 0, step = 0; blk < nblk; blk += BPG, ++step) {
      __m512 p[R][2];
      for (int r = 0; r < R; ++r) p[r][0] = p[r][1] = _mm512_setzero_ps();
      for (int64_t bb = blk; bb < blk + BPG; ++bb) {
        const float* wb = wl + (bb * 8 + l) * V * kLaneCols;
        const float* xb = c.xp + m0 * c.K + bb * BV + l;
#pragma GCC unroll 8
        for (int f = 0; f < V; ++f) {
          const __m512 w0 = _mm512_load_ps(wb + f * kLaneCols), w1 = _mm512_load_ps(wb + f * kLaneCols + 16);
#pragma GCC unroll 6
          for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_set1_ps(xb[r * c.K + f * 8]);
            p[r][0] = _mm512_fmadd_ps(w0, xv, p[r][0]);
            p[r][1] = _mm512_fmadd_ps(w1, xv, p[r][1]);
          }
        }
      }
      const float* s = sg + (WG >= 8 ? step : 2 * step + l / 4) * kLaneCols;  // step_scale's group for lane l
      const __m512 s0 = _mm512_load_ps(s), s1 = _mm512_load_ps(s + 16);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) acc[r][0] = _mm512_fmadd_ps(s0, p[r][0], acc[r][0]), acc[r][1] = _mm512_fmadd_ps(s1, p[r][1], acc[r][1]);
    }
    for (int r = 0; r < R; ++r) _mm512_store_ps(lanes[l][r], acc[r][0]), _mm512_store_ps(lanes[l][r] + 16, acc[r][1]);
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < kLaneCols; h += 16) {
      auto L = [&](int l) { return _mm512_load_ps(lanes[l][r] + h); };
      const __m512 a = _mm512_add_ps(L(0), L(4)), b = _mm512_add_ps(L(1), L(5)), d = _mm512_add_ps(L(2), L(6)), e = _mm512_add_ps(L(3), L(7));
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(a, d), _mm512_add_ps(b, e));  // hsum8: (0 + 2) + (1 + 3)
      _mm512_storeu_ps(c.y + (m0 + r) * c.ldy + t0 + h, _mm512_add_ps(sum, _mm512_loadu_ps(bt + (m0 + r) * kLaneCols + h)));
    }
  }
}

// every row over columns t0 .. t0 + 32 (of a range ending at n1); wl, sg: buffers of 32 K and 32 G floats; gt, wb,
// bt: tile_bias_terms'
template <int BITS, int GS, class S>
void lanes_rows(const Ctx& c, int64_t t0, int64_t n1, float* wl, float* sg, float* gt, float* wb, int64_t Gp, float* bt) {
  unpack_lanes<BITS>(c, t0, wl);
  prefetch_cols(c.w, t0 + kLaneCols, n1, kLaneCols, c.Kw * 4);
  for (int64_t j = 0; j < kLaneCols; ++j) {
    const float* s = widen_row(S{}, static_cast<const typename S::T*>(c.s) + (t0 + j) * c.G, wb, c.G);
    for (int64_t g = 0; g < c.G; ++g) sg[g * kLaneCols + j] = s[g];
  }
  tile_bias_terms<S, __m512>(c, t0, t0 + kLaneCols, gt, wb, Gp, bt, kLaneCols);
  row_tiles_of<6>(c.M, [&]<int R>(int64_t m) { lanes_tile<BITS, GS, R>(c, m, t0, wl, sg, bt); });
}
#endif

template <int BITS, int GS, class S>
void avx2_range(const Ctx& c, int64_t n0, int64_t n1) {
  if (c.M == 1) {
    row_tiles<BITS, GS, S, 4>(c, 0, n0, n1);
    return;
  }
  // several rows: each column tile is unpacked once, then tiles run every row over it
  const int64_t Gp = (c.G + 7) / 8 * 8;
  Floats wf(kLaneCols * c.K), sbuf(kLaneCols * Gp), gt(16 * c.G), wb(16 * Gp), bt(c.M * kLaneCols);
  int64_t t0 = n0;
#ifdef MLXINFER_QMM_WIDE
  for (; c.M >= 6 && wide_tiles() && t0 + kLaneCols <= n1; t0 += kLaneCols) lanes_rows<BITS, GS, S>(c, t0, n1, wf.p, sbuf.p, gt.p, wb.p, Gp, bt.p);
#endif
  const float* sf[kColTile];
  for (; t0 < n1; t0 += kColTile) {
    const int64_t t1 = std::min(n1, t0 + kColTile);
    unpack_cols<BITS>(c, t0, t1 - t0, wf.p);
    prefetch_cols(c.w, t1, n1, kColTile, c.Kw * 4);
    for (int64_t j = 0; j < t1 - t0; ++j) sf[j] = widen_row(S{}, static_cast<const typename S::T*>(c.s) + (t0 + j) * c.G, sbuf.p + j * Gp, c.G);
    tile_bias_terms<S>(c, t0, t1, gt.p, wb.p, Gp, bt.p, kColTile);
    row_tiles_of<kTileRows>(c.M, [&]<int R>(int64_t m) { rows_tiles<BITS, GS, S, R, kTileCols>(c, m, t0, t1, wf.p, sf, bt.p); });
  }
}

#endif  // MLXINFER_QMM_AVX2

}  // namespace mlxinfer::tiles
