// The int8 path (int8.h): x is rounded to 8 bits per group, xq = round(x * 127 / max|x|) with d = max|x| / 127,
// and y[m, n] = sum_k (s q + b)[n, k] * (d xq)[m, k]: the dequantized weights times the dequantized activations,
// llama.cpp's arithmetic (not the float32 of qmm.cpp). The products q * xq are summed as exact integers; one
// AVX-512 VNNI instruction does 32 of those multiply-adds (64 at 512 bits: int8_wide.h), against 8 for a float32 FMA.
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
// nibbles. Scales and biases are stored one per lane of each segment (int8_lane_groups: (N, int8_lanes)).
#include "int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "int8_wide.h"
#include "pool.h"

namespace mlxinfer {

namespace {

using namespace int8_tiles;

// A group's d and 1 / step from its largest |x|. A group holding inf or NaN gets d = NaN (its outputs are NaN,
// as the float32 path's would be); a group too small for 127 / max|x| to be finite (max|x| < 3.7e-37) rounds
// to zeros, as an all-zero group does.
struct GroupScale {
  float d, inv;
};
inline GroupScale group_scale(float amax, bool finite) {
  const float scale = amax > 0.0f ? 127.0f / amax : 0.0f;
  const bool tiny = !std::isfinite(scale);
  return {!finite ? NAN : tiny ? 0.0f : amax / 127.0f, finite && !tiny ? scale : 0.0f};
}

// Row m's side of the arithmetic: xq (K bytes, operand order) and, per segment and lane, d and float(X).
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
    const GroupScale gsc = group_scale(amax, finite);
    d[g] = gsc.d, inv[g] = gsc.inv;
  }
  std::fill(xl, xl + 8 * segs.size(), 0.0f);
  each_byte(segs, gs, [&](int64_t o, int i, int64_t k, int64_t e) {
    const float r = std::nearbyint(x[k] * inv[k / gs]);  // |r| <= 127; 0 where inv is 0
    const int8_t q = static_cast<int8_t>(std::isfinite(r) ? std::clamp(r, -127.0f, 127.0f) : 0.0f);
    xq[o * 32 + i] = q;
    xl[e] += q;  // X: every partial sum an integer under 2^24 in magnitude, so exact in float32
    dl[e] = d[k / gs];
  });
}

#ifdef MLXINFER_QMM_AVX2
// One group's 32-value blocks rounded (quantize_row's multiply and rounding: cvtps rounds to nearest even, as
// nearbyint), in value order; its d.
inline float group_avx2(const float* xg, int gs, __m256i* blocks) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
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
  const auto [d, inv] = group_scale(amax, finite);
  const __m256 iv = _mm256_set1_ps(inv);
  for (int i = 0; i < gs; i += 32) {
    __m256i v[4];
    for (int u = 0; u < 4; ++u) v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8 * u), iv));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    blocks[i / 32] = finite ? _mm256_permutevar8x32_epi32(p, order) : _mm256_setzero_si256();
  }
  return d;
}

// The 4-byte chunks of r[0..7] transposed: out[c] holds chunk c of each of them
inline void transpose_chunks(const __m256i* r, __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x20);
    out[c + 4] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x31);
  }
}

// A segment of eight groups (lane g: group g, operands op0 + c its chunks c): xq, each lane's d and float(X)
inline void eight_groups_avx2(const float* x, int8_t* xq, float* dl, float* xl, int gs) {
  __m256i blocks[8][4];  // group g's 32-byte blocks (gs / 32 of them)
  for (int g = 0; g < 8; ++g) dl[g] = group_avx2(x + g * gs, gs, blocks[g]);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i sums = _mm256_setzero_si256();
  for (int b = 0; b < gs / 32; ++b) {
    __m256i r[8], ops[8];
    for (int g = 0; g < 8; ++g) r[g] = blocks[g][b];
    transpose_chunks(r, ops);
    for (int c = 0; c < 8; ++c) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + (b * 8 + c) * 32), ops[c]);
      sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, ops[c]), ones16));  // exact
    }
  }
  _mm256_storeu_ps(xl, _mm256_cvtepi32_ps(sums));
}

// quantize_row with group_avx2's rounding; each 4-byte chunk of a group then put where the layout wants it.
void quantize_row_avx2(const float* x, int8_t* xq, float* dl, float* xl, int gs, const std::vector<Seg>& segs) {
  size_t at = 0;
  for (const Seg& sg : segs) {
    const int P = 8 / sg.ts;
    if (P == 1) {  // eight whole groups: operand c is chunk c of each group, an 8 x 8 transpose of 4-byte chunks
      eight_groups_avx2(x + sg.g0 * gs, xq + sg.op0 * 32, dl + at * 8, xl + at * 8, gs);
      ++at;
      continue;
    }
    int32_t lane_sum[8] = {};
    for (int gi = 0; gi < sg.ts; ++gi) {
      alignas(32) int8_t q[128];
      const float d = group_avx2(x + (sg.g0 + gi) * gs, gs, reinterpret_cast<__m256i*>(q));
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


template <class S>
Range pick(const Ctx8& c, bool reference) {
#ifdef MLXINFER_QMM_AVX2
  if (!reference) return [&c](int64_t n0, int64_t n1) { avx2_range<S>(c, n0, n1); };
#endif
  (void)reference;
  return [&c](int64_t n0, int64_t n1) { reference_range<S>(c, n0, n1); };
}

}  // namespace

const char* int8_isa() {
#if defined(MLXINFER_QMM_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "AVX-512 VNNI";
#elif defined(MLXINFER_QMM_AVX2)
  return "AVX2 maddubs";
#else
  return "portable C++";
#endif
}

bool int8_supports(int64_t K, int group_size, int bits) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) && K > 0 &&
      K % group_size == 0 && (bits == 8 || K % 64 == 0);
}

int64_t int8_lanes(int64_t K, int group_size) {
  if ((group_size != 32 && group_size != 64 && group_size != 128) || K <= 0 || K % group_size) {
    throw std::invalid_argument("[mlxinfer.int8_lanes] K must be a positive multiple of a group size of 32, 64 or 128");
  }
  return 8 * static_cast<int64_t>(segments(K / group_size, group_size).size());
}

void repack_int8(const uint32_t* w, uint32_t* out, int64_t N, int64_t K, int group_size, int bits) {
  const auto segs = segments(K / group_size, group_size);
  const int64_t words = K * bits / 32;
  std::memset(out, 0, N * words * sizeof(uint32_t));
  // a lane's 4 bytes are 4 consecutive values (each_byte's t = 0..3): in MLX's layout one word (8 bits) or
  // half of one (4 bits, k a multiple of 4), moved as a whole
  std::vector<std::pair<int64_t, int64_t>> moves;  // (operand * 32 + 4 l, k) for each lane of each operand
  each_byte(segs, group_size, [&](int64_t o, int i, int64_t k, int64_t) {
    if (i % 4 == 0) moves.emplace_back(o * 32 + i, k);
  });
  for (int64_t n = 0; n < N; ++n) {
    const uint32_t* row = w + n * words;
    uint8_t* o8 = reinterpret_cast<uint8_t*>(out + n * words);
    if (bits == 8) {
      for (const auto& [at, k] : moves) std::memcpy(o8 + at, row + k / 4, 4);
      continue;
    }
    for (const auto& [at, k] : moves) {
      const uint32_t half = (row[k / 8] >> (4 * (k % 8))) & 0xffffu;  // values k .. k + 3, a nibble each
      const int64_t o = at / 32, i = at % 32, shift = 4 * (o % 2);
      uint8_t* dst = o8 + (o / 2) * 32 + i;
      for (int t = 0; t < 4; ++t) dst[t] |= static_cast<uint8_t>(((half >> (4 * t)) & 15u) << shift);
    }
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
  with_scale_type(scale_type, run);
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
  std::vector<float> dl(M * L), xl(M * L);
  for_rows(M, 4 * K, [&](int64_t m0, int64_t m1) {  // a value's max, scale, round and place: ~4 plain ones
    std::vector<float> d(G), inv(G);
    for (int64_t m = m0; m < m1; ++m) {
#ifdef MLXINFER_QMM_AVX2
      if (!reference) {
        quantize_row_avx2(x + m * K, xq.data() + m * K, dl.data() + m * L, xl.data() + m * L, group_size, segs);
        continue;
      }
#endif
      quantize_row(x + m * K, xq.data() + m * K, dl.data() + m * L, xl.data() + m * L, d.data(), inv.data(), K,
                   group_size, segs);
    }
  });
  std::vector<Ctx8> ctx(weights.size());
  run_columns(weights, K, [&](size_t i, int64_t col) {
    Ctx8& c = ctx[i];
    c = {xq.data(), dl.data(), xl.data(), reinterpret_cast<const uint8_t*>(weights[i].w), weights[i].s, weights[i].b,
         y + col, M, weights[i].N, K, G, ldy, K * bits / 8, L, group_size, bits, &segs};
    return with_scale_type(scale_type, [&]<class S>(S) { return pick<S>(c, reference); });
  });
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
  int8_lanes(K, group_size);  // throws unless K is a whole number of groups of 32, 64 or 128
  const int64_t G = K / group_size;
  if (scales.ndim() != 2 || scales.shape(1) != G) {
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
