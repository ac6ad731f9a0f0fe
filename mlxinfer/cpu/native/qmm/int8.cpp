// The int8 path (int8.h): x is rounded to 8 bits per group, xq = round(x * 127 / max|x|) with d = max|x| / 127,
// and y[m, n] = sum_k (s q + b)[n, k] * (d xq)[m, k]: the dequantized weights times the dequantized activations,
// llama.cpp's arithmetic (not the float32 of qmm.cpp). The products q * xq are summed as exact integers; one
// AVX-512 VNNI instruction does 32 of those multiply-adds, against 8 for a float32 FMA.
//
// WHAT STAYS FIXED. Integer sums are exact, so how they are split (tiles, instructions, VNNI or AVX2's
// maddubs) cannot change them. Every float operation is fixed by K and the group size alone. The groups go
// by segments (eight groups, then four, two and one for the rest); in a segment each of eight lanes sums the
// products of one group's values (for a short segment, a part of one group's). Per output and segment, each
// lane l with its group's s, b and d, its integer sum I and its bytes' sum X of xq (both exact) takes
//     f[l] = fma(d, fma(s, float(I), b * float(X)), f[l])
// and y = ((f0 + f4) + (f2 + f6)) + ((f1 + f5) + (f3 + f7)). The same steps run for one row or many, in any
// tile, on any thread, in the vector code or the portable code (`reference`, which the tests hold the vector
// code to, bit for bit). So a row alone has the same bits as inside any batch, on every build of the extension.
//
// THE LAYOUT (repack_int8). A column's codes are stored as K / 32 operands of 32 bytes, segment by segment:
// in a segment of ts groups, operand j's byte 4 l + t holds value ((j P + l % P) 4 + t) of group g0 + l / P,
// P = 8 / ts, so that lane l of an integer dot product (4 bytes a lane) only ever sums within one group.
// 8-bit codes are those bytes; 4-bit codes pack operands 2i and 2i + 1 as one 32-byte vector's low and high
// nibbles. Scales and biases keep MLX's layout.
#include "int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>

#include "pool.h"
#include "tiles.h"

namespace mlxinfer {

namespace {

constexpr int64_t kMinWeightsPerThread = 1 << 16;  // as qmm.cpp
constexpr int64_t kColTile = 16;  // columns unpacked to bytes at a time for several rows (16 K bytes)

struct Seg {
  int64_t g0;  // first group
  int ts;  // groups: 8, 4, 2 or 1
  int64_t op0;  // first operand
  int ops;  // operands: ts * gs / 32
};

std::vector<Seg> segments(int64_t G, int gs) {
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

inline uint32_t mlx_value(const uint32_t* row, int64_t k, int bits) {
  const int64_t bit = k * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

// code of (operand o, byte i) in a stored row
inline int code_at(const uint8_t* row, int64_t o, int i, int bits) {
  return bits == 8 ? row[o * 32 + i] : (row[(o / 2) * 32 + i] >> (4 * (o % 2))) & 15;
}

// Row m's side of the arithmetic: xq (K bytes, operand order) and, per segment and lane, d and float(X).
// A group holding inf or NaN gets d = NaN (its outputs are NaN, as the float32 path's would be).
void quantize_row(const float* x, int8_t* xq, float* dl, float* xl, float* d, float* inv, int64_t K, int gs,
                  const std::vector<Seg>& segs) {
  const int64_t G = K / gs;
  for (int64_t g = 0; g < G; ++g) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < gs; ++i) {
      const float v = x[g * gs + i];
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    d[g] = finite ? amax / 127.0f : NAN;
    inv[g] = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
  }
  std::fill(xl, xl + 8 * segs.size(), 0.0f);
  int32_t lane_sum[8];
  size_t at = 0;
  for (const Seg& sg : segs) {
    const int P = 8 / sg.ts;
    std::fill(lane_sum, lane_sum + 8, 0);
    for (int j = 0; j < sg.ops; ++j) {
      const int64_t o = sg.op0 + j;
      for (int l = 0; l < 8; ++l) {
        const int64_t g = sg.g0 + l / P, base = g * gs + (j * P + l % P) * 4;
        for (int t = 0; t < 4; ++t) {
          const float r = std::nearbyint(x[base + t] * inv[g]);  // |r| <= 127; 0 where inv is 0
          const int8_t q = static_cast<int8_t>(std::isfinite(r) ? std::clamp(r, -127.0f, 127.0f) : 0.0f);
          xq[o * 32 + 4 * l + t] = q;
          lane_sum[l] += q;
        }
      }
    }
    for (int l = 0; l < 8; ++l) {
      dl[at * 8 + l] = d[sg.g0 + l / P];
      xl[at * 8 + l] = static_cast<float>(lane_sum[l]);
    }
    ++at;
  }
}

#ifdef MLXINFER_QMM_AVX2
// quantize_row's values, eight at a time: the same multiply and the same rounding (cvtps: to nearest even, as
// nearbyint), each 4-byte chunk of a group then put where the layout wants it.
void quantize_row_avx2(const float* x, int8_t* xq, float* dl, float* xl, int gs, const std::vector<Seg>& segs) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  alignas(32) int8_t q[128];
  size_t at = 0;
  for (const Seg& sg : segs) {
    const int P = 8 / sg.ts;
    int32_t lane_sum[8] = {};
    for (int gi = 0; gi < sg.ts; ++gi) {
      const float* xg = x + (sg.g0 + gi) * gs;
      __m256 top = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (int i = 0; i < gs; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg + i), absmask);
        top = _mm256_max_ps(top, a);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
      }
      __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      t = _mm_max_ps(t, _mm_movehl_ps(t, t));
      const float amax = _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
      const bool finite = _mm256_movemask_ps(bad) == 0;
      const float d = finite ? amax / 127.0f : NAN, inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m256 iv = _mm256_set1_ps(inv);
      for (int i = 0; i < gs; i += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; ++u) v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8 * u), iv));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        const __m256i in_order = finite ? _mm256_permutevar8x32_epi32(p, order) : _mm256_setzero_si256();
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + i), in_order);
      }
      for (int c = 0; c < gs / 4; ++c) {  // chunk c of the group: operand op0 + c / P, lane gi P + c % P
        const int lane = gi * P + c % P;
        std::memcpy(xq + (sg.op0 + c / P) * 32 + 4 * lane, q + 4 * c, 4);
        lane_sum[lane] += q[4 * c] + q[4 * c + 1] + q[4 * c + 2] + q[4 * c + 3];
      }
      for (int p = 0; p < P; ++p) dl[at * 8 + gi * P + p] = d;
    }
    for (int l = 0; l < 8; ++l) xl[at * 8 + l] = static_cast<float>(lane_sum[l]);
    ++at;
  }
}
#endif

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

// The portable code: every (m, n) alone, the steps the opening comment lists, one value at a time.
template <class S>
void reference_range(const Ctx8& c, int64_t n0, int64_t n1) {
  using T = typename S::T;
  for (int64_t n = n0; n < n1; ++n) {
    const T* sl = static_cast<const T*>(c.s) + n * c.L;
    const T* bl = static_cast<const T*>(c.b) + n * c.L;
    const uint8_t* wr = c.w + n * c.rowbytes;
    for (int64_t m = 0; m < c.M; ++m) {
      const int8_t* xr = c.xq + m * c.K;
      const float *dl = c.dl + m * c.L, *xl = c.xl + m * c.L;
      float f[8] = {};
      size_t at = 0;
      for (const Seg& sg : *c.segs) {
        int32_t I[8] = {};
        for (int j = 0; j < sg.ops; ++j) {
          const int64_t o = sg.op0 + j;
          for (int i = 0; i < 32; ++i) I[i / 4] += code_at(wr, o, i, c.bits) * xr[o * 32 + i];
        }
        for (int l = 0; l < 8; ++l) {
          const size_t e = at * 8 + l;
          f[l] = std::fma(dl[e], std::fma(widen(S{}, sl[e]), static_cast<float>(I[l]), widen(S{}, bl[e]) * xl[e]), f[l]);
        }
        ++at;
      }
      c.y[m * c.ldy + n] = tree8(f);
    }
  }
}

#ifdef MLXINFER_QMM_AVX2

// acc + the four-byte dot products of w (unsigned codes, < 16 where FOUR_BIT) and x (signed), per 32-bit lane
template <bool FOUR_BIT>
inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, w, x);
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
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NC; ++j) c.y[(m0 + r) * c.ldy + n0 + j] = hsum8(_mm256_load_ps(f[r][j]));  // tree8's order
  }
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

template <class S>
void avx2_range(const Ctx8& c, int64_t n0, int64_t n1) {
  const uint8_t* cols[kColTile];
  // several rows share one unpacking of each column (8-bit: one copy, read in order, which the prefetcher follows)
  const bool unpack = c.M > 1;
  std::vector<uint8_t> bytes(unpack ? kColTile * c.K : 0);
  for (int64_t t0 = n0; t0 < n1; t0 += kColTile) {
    const int64_t t1 = std::min(n1, t0 + kColTile);
    for (int64_t j = 0; j < t1 - t0; ++j) {
      const uint8_t* stored = c.w + (t0 + j) * c.rowbytes;
      cols[j] = stored;
      if (unpack && c.bits == 8) {
        cols[j] = static_cast<const uint8_t*>(std::memcpy(bytes.data() + j * c.K, stored, c.K));
      } else if (unpack) {
        uint8_t* out = bytes.data() + j * c.K;
        const __m256i nib = _mm256_set1_epi8(15);
        for (int64_t p = 0; p < c.K / 64; ++p) {
          const __m256i v = load32(stored + p * 32);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p * 64), _mm256_and_si256(v, nib));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p * 64 + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        }
        cols[j] = out;
      }
    }
    if (c.M == 1) {
      if (c.bits == 4) {
        tile_cols<true, true, S, 1>(c, 0, t0, t1, cols);
      } else {
        tile_cols<false, false, S, 1>(c, 0, t0, t1, cols);
      }
      continue;
    }
    auto rows = [&]<bool FOUR_BIT>() {  // full tiles, then the rest in tiles of 3, 2 and 1 rows (kRows = 4)
      int64_t m = 0;
      for (; m + kRows <= c.M; m += kRows) tile_cols<FOUR_BIT, false, S, kRows>(c, m, t0, t1, cols);
      if constexpr (kRows > 3) {
        if (m + 3 <= c.M) tile_cols<FOUR_BIT, false, S, 3>(c, m, t0, t1, cols), m += 3;
      }
      if (m + 2 <= c.M) tile_cols<FOUR_BIT, false, S, 2>(c, m, t0, t1, cols), m += 2;
      if (m < c.M) tile_cols<FOUR_BIT, false, S, 1>(c, m, t0, t1, cols);
    };
    if (c.bits == 4) {
      rows.template operator()<true>();
    } else {
      rows.template operator()<false>();
    }
  }
}

#endif  // MLXINFER_QMM_AVX2

template <class S>
std::function<void(int64_t, int64_t)> pick(const Ctx8& c, bool reference) {
#ifdef MLXINFER_QMM_AVX2
  if (!reference) return [&c](int64_t n0, int64_t n1) { avx2_range<S>(c, n0, n1); };
#endif
  (void)reference;
  return [&c](int64_t n0, int64_t n1) { reference_range<S>(c, n0, n1); };
}

}  // namespace

bool int8_supports(int64_t K, int group_size, int bits) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) && K > 0 &&
      K % group_size == 0 && (bits == 8 || K % 64 == 0);
}

int64_t int8_lanes(int64_t K, int group_size) {
  return 8 * static_cast<int64_t>(segments(K / group_size, group_size).size());
}

void repack_int8(const uint32_t* w, uint32_t* out, int64_t N, int64_t K, int group_size, int bits) {
  const auto segs = segments(K / group_size, group_size);
  const int64_t words = K * bits / 32;
  std::memset(out, 0, N * words * sizeof(uint32_t));
  for (int64_t n = 0; n < N; ++n) {
    const uint32_t* row = w + n * words;
    uint8_t* o8 = reinterpret_cast<uint8_t*>(out + n * words);
    each_byte(segs, group_size, [&](int64_t o, int i, int64_t k, int64_t) {
      const uint32_t q = mlx_value(row, k, bits);
      if (bits == 8) {
        o8[o * 32 + i] = static_cast<uint8_t>(q);
      } else {
        o8[(o / 2) * 32 + i] |= static_cast<uint8_t>(q << (4 * (o % 2)));
      }
    });
  }
}

void dequantize_row_i8(const uint32_t* w, const void* s, const void* b, ScaleType scale_type, float* y, int64_t K,
                       int group_size, int bits) {
  const auto segs = segments(K / group_size, group_size);
  const uint8_t* row = reinterpret_cast<const uint8_t*>(w);
  auto run = [&]<class S>(S) {
    const auto* sp = static_cast<const typename S::T*>(s);
    const auto* bp = static_cast<const typename S::T*>(b);
    each_byte(segs, group_size, [&](int64_t o, int i, int64_t k, int64_t e) {
      const float scaled = static_cast<float>(code_at(row, o, i, bits)) * widen(S{}, sp[e]);
      y[k] = scaled + widen(S{}, bp[e]);
    });
  };
  if (scale_type == ScaleType::f16) {
    run(F16{});
  } else if (scale_type == ScaleType::bf16) {
    run(BF16{});
  } else {
    run(F32{});
  }
}

void qmm_i8(const float* x, const std::vector<Weight>& weights, ScaleType scale_type, float* y, int64_t M, int64_t K,
            int group_size, int bits, bool reference) {
  int64_t ldy = 0;
  for (const Weight& wt : weights) ldy += wt.N;
  if (M == 0 || ldy == 0) return;
  const int64_t G = K / group_size;
  const auto segs = segments(G, group_size);
  const int64_t L = 8 * static_cast<int64_t>(segs.size());
  std::vector<int8_t> xq(M * K);
  std::vector<float> dl(M * L), xl(M * L), d(G), inv(G);
  for (int64_t m = 0; m < M; ++m) {
#ifdef MLXINFER_QMM_AVX2
    if (!reference) {
      quantize_row_avx2(x + m * K, xq.data() + m * K, dl.data() + m * L, xl.data() + m * L, group_size, segs);
      continue;
    }
#endif
    quantize_row(x + m * K, xq.data() + m * K, dl.data() + m * L, xl.data() + m * L, d.data(), inv.data(), K,
                 group_size, segs);
  }
  std::vector<Ctx8> ctx(weights.size());
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
    Ctx8& c = ctx[i];
    c = {xq.data(), dl.data(), xl.data(), reinterpret_cast<const uint8_t*>(weights[i].w), weights[i].s, weights[i].b,
         y + col, M, weights[i].N, K, G, ldy, K * bits / 8, L, group_size, bits, &segs};
    range[i] = scale_type == ScaleType::f16 ? pick<F16>(c, reference)
        : scale_type == ScaleType::bf16     ? pick<BF16>(c, reference)
                                            : pick<F32>(c, reference);
    for (int64_t n = 0; n < c.N; n += per) chunks.push_back({i, n, std::min(c.N, n + per)});
    col += c.N;
  }
  std::unique_lock<std::mutex> lock(p.busy(), std::try_to_lock);
  if (threads <= 1 || !lock.owns_lock()) {
    for (const Chunk& ch : chunks) range[ch.weight](ch.n0, ch.n1);
    return;
  }
  p.run([&](int i) { range[chunks[i].weight](chunks[i].n0, chunks[i].n1); }, static_cast<int>(chunks.size()));
}

namespace {

mx::array host_copy(const mx::array& a, mx::Dtype dtype) {
  mx::array c = mx::contiguous(mx::astype(a, dtype, mx::Device::cpu), false, mx::Device::cpu);
  c.eval();
  return c;
}

void check_layout(const mx::array& w, int64_t K, int group_size, int bits, const char* what) {
  if (w.ndim() != 2 || w.dtype() != mx::uint32 || !int8_supports(K, group_size, bits)) {
    throw std::invalid_argument(std::string("[mlxinfer.") + what +
                                "] takes (N, K * bits / 32) uint32 codes, 4 or 8 bits, groups of 32, 64 or 128 "
                                "(4 bits: K a multiple of 64)");
  }
}

}  // namespace

mx::array repack_int8_array(const mx::array& w, int group_size, int bits) {
  const int64_t K = bits == 4 || bits == 8 ? static_cast<int64_t>(w.ndim() == 2 ? w.shape(1) : 0) * 32 / bits : 0;
  check_layout(w, K, group_size, bits, "repack_int8");
  const mx::array src = host_copy(w, mx::uint32);
  std::vector<uint32_t> out(src.size());
  repack_int8(src.data<uint32_t>(), out.data(), w.shape(0), K, group_size, bits);
  return mx::array(out.data(), w.shape(), mx::uint32);
}

mx::array lane_groups_array(const mx::array& scales, int64_t K, int group_size) {
  const int64_t G = K / group_size;
  if (scales.ndim() != 2 || scales.shape(1) != G || K % group_size) {
    throw std::invalid_argument("[mlxinfer.int8_lane_groups] scales must be (N, K / group_size)");
  }
  const auto segs = segments(G, group_size);
  const int64_t L = 8 * static_cast<int64_t>(segs.size());
  std::vector<int32_t> index;  // lane -> group
  for (const Seg& sg : segs) {
    for (int l = 0; l < 8; ++l) index.push_back(static_cast<int32_t>(sg.g0 + l / (8 / sg.ts)));
  }
  mx::array out = mx::contiguous(
      mx::take(scales, mx::array(index.data(), {static_cast<int>(L)}, mx::int32), 1, mx::Device::cpu), false,
      mx::Device::cpu);
  out.eval();
  return out;
}

mx::array qmm_i8_array(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                       int group_size, int bits, bool reference) {
  const int64_t K = x.ndim() == 2 ? x.shape(1) : 0;
  check_layout(w, K, group_size, bits, "qmm_i8");
  if (w.shape(1) * 32 / bits != K || scales.shape() != biases.shape() || scales.ndim() != 2 ||
      scales.shape(0) != w.shape(0) || scales.shape(1) != int8_lanes(K, group_size)) {
    throw std::invalid_argument("[mlxinfer.qmm_i8] x (M, K), w (N, K * bits / 32), scales and biases (N, lanes)");
  }
  const mx::array xc = host_copy(x, mx::float32), wc = host_copy(w, mx::uint32);
  const mx::array sc = host_copy(scales, mx::float32), bc = host_copy(biases, mx::float32);
  std::vector<float> y(x.shape(0) * w.shape(0));
  qmm_i8(xc.data<float>(), {{wc.data<uint32_t>(), sc.data<float>(), bc.data<float>(), w.shape(0)}}, ScaleType::f32,
         y.data(), x.shape(0), K, group_size, bits, reference);
  return mx::array(y.data(), {x.shape(0), w.shape(0)}, mx::float32);
}

}  // namespace mlxinfer
