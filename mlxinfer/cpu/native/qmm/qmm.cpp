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
//     with several rows a column tile is unpacked once to float32 first (tiles.h: the same exact
//     values the one-row tile computes in registers), and the rows read them back; the bias terms
//     of a column tile are computed for every row first, 8 or 16 columns a vector, each lane taking
//     the operations its output's own bias dot product takes (tiles.h, bias_dot_cols);
//   * threads split the output columns, never K, so no partial sums are combined across threads;
//   * the build uses -ffp-contract=off so the compiler cannot fuse a multiply and an add in one
//     inlined copy of the code and not in another.
// So a row computed alone has the same bits as the same row inside a batch of 64. Which code path
// runs (AVX2 or portable) is also chosen from K, the group size and the bits alone. The avx512 build
// (qmm.py, for CPUs with AVX-512VL) runs the same 256-bit AVX2 code; its 32 vector registers only let
// the several-row tiles be 4 x 4 instead of 3 x 3, so its bits are the avx2 build's (tests/test_qmm.py).
#include "qmm.h"

#include "int8.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "pool.h"
#include "tiles_wide.h"

namespace mlxinfer {

namespace {

// Fewer weights than this per call run on one thread: waking a second one costs more than it saves.
constexpr int64_t kMinWeightsPerThread = 1 << 16;

// ------------------------------------------------------------------ the arithmetic

using tiles::Ctx;

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

template <class S>
Range pick_range(const Ctx& c, bool avx2) {
#ifdef MLXINFER_QMM_AVX2
  if (avx2) {
    using tiles::avx2_range;
    // bits and group size as template arguments: every loop bound and branch of a tile is a constant
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
  if (int8_layout(bits)) return dequantize_row_i8(w, s, b, scale_type, y, K, group_size, value_bits(bits));
  auto run = [&]<class S>(S) {
    const auto* sp = static_cast<const typename S::T*>(s);
    const auto* bp = static_cast<const typename S::T*>(b);
    for (int64_t k = 0; k < K; ++k) {
      const float scaled = static_cast<float>(value_at(w, k, bits)) * widen(S{}, sp[k / group_size]);
      y[k] = scaled + widen(S{}, bp[k / group_size]);
    }
  };
  with_scale_type(scale_type, run);
}

bool compiled_with_avx2() {
#ifdef MLXINFER_QMM_AVX2
  return true;
#else
  return false;
#endif
}

std::string tile_shape() {
#ifdef MLXINFER_QMM_AVX2
  return std::to_string(tiles::kTileRows) + "x" + std::to_string(tiles::kTileCols);
#else
  return "1x1";  // the portable path: one (m, n) at a time
#endif
}

int thread_count() {
  return pool().size();
}

void qmm_f32(const float* x, const std::vector<Weight>& weights, ScaleType scale_type, float* y, int64_t M, int64_t K,
             int group_size, int bits) {
  if (int8_layout(bits)) return qmm_i8(x, weights, scale_type, y, M, K, group_size, value_bits(bits));
  int64_t ldy = 0;
  for (const Weight& wt : weights) ldy += wt.N;
  if (M == 0 || ldy == 0) return;
  const int64_t G = K / group_size;
  std::vector<float> xsum(M * G);
  for (int64_t m = 0; m < M; ++m) group_sums(x + m * K, xsum.data() + m * G, K, group_size);
  bool avx2 = false;
  std::vector<float> xp;
#ifdef MLXINFER_QMM_AVX2
  avx2 = tiles::avx2_layout(K, bits, group_size);
  if (avx2) {
    xp.resize(M * K);
    for (int64_t m = 0; m < M; ++m) tiles::lane_order(x + m * K, xp.data() + m * K, K, bits);
  }
#endif
  std::vector<Ctx> ctx(weights.size());  // one context per weight (its columns of y)
  run_columns(weights, K, [&](size_t i, int64_t col) {
    Ctx& c = ctx[i];
    c.x = x, c.w = weights[i].w, c.s = weights[i].s, c.b = weights[i].b, c.y = y + col;
    c.M = M, c.N = weights[i].N, c.K = K, c.G = G, c.Kw = K * bits / 32, c.ldy = ldy;
    c.gs = group_size, c.bits = bits, c.xsum = xsum.data(), c.xp = xp.data();
    return with_scale_type(scale_type, [&]<class S>(S) { return pick_range<S>(c, avx2); });
  });
}

void run_columns(const std::vector<Weight>& weights, int64_t K, const std::function<Range(size_t, int64_t)>& range_of) {
  int64_t ldy = 0;
  for (const Weight& wt : weights) ldy += wt.N;
  struct Chunk {
    size_t weight;
    int64_t n0, n1;
  };
  std::vector<Chunk> chunks;
  std::vector<Range> range;
  Pool& p = pool();
  const int64_t threads = std::min<int64_t>(p.size(), std::max<int64_t>(1, ldy * K / kMinWeightsPerThread));
  const int64_t per = std::max<int64_t>(32, (ldy / (4 * threads) + 31) / 32 * 32);  // whole 512-bit tiles
  int64_t col = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    range.push_back(range_of(i, col));
    col += weights[i].N;
    for (int64_t n = 0; n < weights[i].N; n += per) chunks.push_back({i, n, std::min(weights[i].N, n + per)});
  }
  auto chunk = [&](int i) { range[chunks[i].weight](chunks[i].n0, chunks[i].n1); };
  if (threads > 1 && p.try_run(chunk, static_cast<int>(chunks.size()))) return;
  // here, or the pool busy: the same results, as the split never changes an output's arithmetic
  for (size_t i = 0; i < chunks.size(); ++i) chunk(static_cast<int>(i));
}

}  // namespace mlxinfer
