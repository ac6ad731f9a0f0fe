// Where qmm.cpp's AVX2 tiles run (avx2_range), and their 512-bit form for several rows: included by qmm.cpp alone.
//
// THE 512-BIT TILES (builds with AVX-512F). One 512-bit FMA takes two columns' weights (column 2q's eight in its
// low half, 2q + 1's in its high half: unpack_cols' pairs) times one row's eight x in both halves. Each
// lane then takes exactly the FMAs it takes in rows_tile, in the same order, so every output has rows_tile's bits
// (and row_tile's: a row alone has the bits it has in a batch). Zen 5 retires a 512-bit FMA at the 256-bit rate
// (measured: ~7 a ns per core, either width), twice the multiply-adds; elsewhere it is the same work in fewer
// instructions. The lane sums and the running sums both stay in registers.
#pragma once

#include "tiles.h"
#include "wide.h"

namespace mlxinfer::tiles {

#ifdef MLXINFER_QMM_AVX2

#if defined(__AVX512F__)
#define MLXINFER_QMM_WIDE 1

// R rows x 4 columns (two pairs, pair q at wf + 2 q K) with rows_tile's arithmetic for each (m, n)
template <int BITS, int GS, class S, int R>
void rows_tile_wide(const Ctx& c, int64_t m0, int64_t n0, const float* wf, const float* const* sf, const float* bt) {
  constexpr int V = 32 / BITS, BV = 8 * V, WG = GS * BITS / 32;
  constexpr int64_t BPG = WG >= 8 ? WG / 8 : 1;
  const int64_t nblk = c.K / BV;
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = c.xp + (m0 + r) * c.K;
  const float* wq[2] = {wf, wf + 2 * c.K};
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t blk = 0, step = 0; blk < nblk; blk += BPG, ++step) {
    __m512 p[R][2];
    for (int r = 0; r < R; ++r) p[r][0] = p[r][1] = _mm512_setzero_ps();
    for (int64_t bb = blk; bb < blk + BPG; ++bb) {
#pragma GCC unroll 8
      for (int f = 0; f < V; ++f) {
        const int64_t k = bb * BV + f * 8;
        const __m512 w0 = _mm512_loadu_ps(wq[0] + 2 * k), w1 = _mm512_loadu_ps(wq[1] + 2 * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512 xv = twice(xr[r] + k);
          p[r][0] = _mm512_fmadd_ps(w0, xv, p[r][0]);
          p[r][1] = _mm512_fmadd_ps(w1, xv, p[r][1]);
        }
      }
    }
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
      const __m512 sv = pair_of(step_scale<BITS, GS>(sf[2 * q], step), step_scale<BITS, GS>(sf[2 * q + 1], step));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][q] = _mm512_fmadd_ps(sv, p[r][q], acc[r][q]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < 2; ++q) {
      alignas(64) float a[16];
      _mm512_store_ps(a, acc[r][q]);
      const float* b = bt + (m0 + r) * kColTile + 2 * q;
      c.y[(m0 + r) * c.ldy + n0 + 2 * q] = hsum8(_mm256_load_ps(a)) + b[0];
      c.y[(m0 + r) * c.ldy + n0 + 2 * q + 1] = hsum8(_mm256_load_ps(a + 8)) + b[1];
    }
  }
}

// every row over columns t0 .. t1 (a multiple of 4) unpacked as pairs
template <int BITS, int GS, class S>
void wide_rows(const Ctx& c, int64_t t0, int64_t t1, const float* wf, const float* const* sf, const float* bt) {
  auto cols = [&]<int R>(int64_t m) {
    for (int64_t n = t0; n < t1; n += 4) rows_tile_wide<BITS, GS, S, R>(c, m, n, wf + (n - t0) * c.K, sf + (n - t0), bt + (n - t0));
  };
  row_tiles_of<4>(c.M, cols);
}
#endif

template <int BITS, int GS, class S>
void avx2_range(const Ctx& c, int64_t n0, int64_t n1) {
  if (c.M == 1) {
    row_tiles<BITS, GS, S, 4>(c, 0, n0, n1);
    return;
  }
  // several rows: each column tile is unpacked once, then kTileRows x kTileCols tiles run every row over it
  const int64_t Gp = (c.G + 7) / 8 * 8;
  Floats wf(kColTile * c.K), sbuf(kColTile * Gp), gt(8 * c.G), wb(8 * Gp), bt(c.M * kColTile);
  const bool wide = wide_tiles();  // false where the build has no 512-bit tiles
  const float* sf[kColTile];
  for (int64_t t0 = n0; t0 < n1; t0 += kColTile) {
    const int64_t t1 = std::min(n1, t0 + kColTile);
    const bool pairs = wide && (t1 - t0) % 4 == 0;
    unpack_cols<BITS>(c, t0, t1 - t0, wf.p, pairs);
    prefetch_cols(c.w, t1, n1, kColTile, c.Kw * 4);
    for (int64_t j = 0; j < t1 - t0; ++j) {
      sf[j] = widen_row(S{}, static_cast<const typename S::T*>(c.s) + (t0 + j) * c.G, sbuf.p + j * Gp, c.G);
    }
    tile_bias_terms<S>(c, t0, t1, gt.p, wb.p, Gp, bt.p, kColTile);
#ifdef MLXINFER_QMM_WIDE
    if (pairs) {
      wide_rows<BITS, GS, S>(c, t0, t1, wf.p, sf, bt.p);
      continue;
    }
#endif
    auto rows = [&]<int R>(int64_t m) { rows_tiles<BITS, GS, S, R, kTileCols>(c, m, t0, t1, wf.p, sf, bt.p); };
    row_tiles_of<kTileRows>(c.M, rows);
  }
}

#endif  // MLXINFER_QMM_AVX2

}  // namespace mlxinfer::tiles
