// Row-wise float32 ops the quantized path runs as one primitive each, where MLX's CPU back end
// composes them from 5-8 nodes (each node costs microseconds to schedule, ~2,400 of them a decode
// step on a 30-layer model). Each output row depends only on its own input row, in a fixed order.
#pragma once

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mlxinfer {

namespace mx = mlx::core;

// An array's elements in row-major order: the array itself when row-contiguous, else a copy by strides.
template <class T>
const T* dense(const mx::array& a, std::vector<T>& buf) {
  if (a.flags().row_contiguous) return a.data<T>();
  buf.resize(a.size());
  const T* src = a.data<T>();
  const int nd = a.ndim();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    buf[i] = src[off];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < a.shape(d)) {
        off += a.strides()[d];
        break;
      }
      off -= a.strides()[d] * (a.shape(d) - 1);
      idx[d] = 0;
    }
  }
  return buf.data();
}

// ------------------------------------------------------------------ what every primitive here shares

// a in dtype t: a itself where it has it, else cast on stream s
inline mx::array cast(const mx::array& a, mx::Dtype t, const mx::Stream& s) {
  return a.dtype() == t ? a : mx::astype(a, t, s);
}
inline mx::array f32(const mx::array& a, const mx::Stream& s) {
  return cast(a, mx::float32, s);
}

// The stream an op's node goes on, which must be a CPU one (else invalid_argument(error)).
mx::Stream cpu_stream(mx::StreamOrDevice s, const char* error = "[mlxinfer] the row ops run on a CPU stream only");

// A node's inputs and output registered with the encoder that runs it; returns the inputs as its task holds them.
std::vector<mx::array> hold(mx::cpu::CommandEncoder& enc, const std::vector<mx::array>& inputs, mx::array& out);

// The extension's primitives: their ops put them on a CPU stream only (cpu_stream), so eval_gpu only throws.
class CpuPrimitive : public mx::UnaryPrimitive {
 public:
  using mx::UnaryPrimitive::UnaryPrimitive;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
};

// One row of rms_norm: y = x * rsqrt(mean(x^2) + eps) * w over n values.
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps);

// One row of swiglu: y = silu(g) * u over n values.
void swiglu_row(const float* g, const float* u, float* y, int64_t n);

// One head vector x (E values) rotated at one position, c and s its cos/sin rows (E / 2 each): rope's
// arithmetic, which attention's queries and keys share.
inline void rotate(const float* x, const float* c, const float* s, float* y, int64_t E) {
  const int64_t half = E / 2;
  for (int64_t i = 0; i < half; ++i) {
    y[i] = x[i] * c[i] - x[half + i] * s[i];
    y[half + i] = x[half + i] * c[i] + x[i] * s[i];
  }
}

enum class RowKind { rms_norm, swiglu, rope, log_softmax, softmax, top_k, top_p, typical_p };

// x * rsqrt(mean(x^2) + eps) * weight over the last axis, in float32.
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s = {});
// silu(gate) * up = gate / (1 + exp(-gate)) * up, exp by Cody-Waite reduction and a degree-7 polynomial.
mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});

// x - logsumexp(x) over the last axis (log-probabilities from scores), float32, exp as swiglu's.
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s = {});
// e**log_softmax(x) over the last axis, the same exp; exactly 0 where x is -inf.
mx::array softmax(const mx::array& x, mx::StreamOrDevice s = {});

// The top-k cut on scores x (..., V): per row, every token at least as high as the k-th highest (its ties
// too) keeps its score, the rest become -inf; a NaN stays. sampler/stages.py apply_top_k's rule, in one pass.
mx::array top_k(const mx::array& x, int k, mx::StreamOrDevice s = {});

// The nucleus cut on log-probabilities x (..., V): per row, with e = exp(x) and the tokens in descending order,
// keep each token while the mass of the tokens above it is below p * sum(e) (at least min_tokens_to_keep of
// them), and every token tied with the last kept one; the rest become -inf. sampler/stages.py apply_top_p's
// rule, from a partial sort of the top tokens (widened until they hold the mass) instead of sorting all V, the
// sums in float64.
mx::array top_p(const mx::array& x, float p, int min_tokens_to_keep, mx::StreamOrDevice s = {});

// Locally typical sampling's cut on log-probabilities x (..., V), sampler/stages.py apply_typical_p's rule: per
// row, the tokens ordered by how far their surprise -log p is from the row's entropy, nearest first; keep the
// fewest whose probabilities add up to at least p (the one that crosses p kept, at least min_tokens_to_keep),
// and every token no further than the last kept one. From a partial sort by that distance, in float64.
mx::array typical_p(const mx::array& x, float p, int min_tokens_to_keep, mx::StreamOrDevice s = {});

// Non-interleaved RoPE on x (..., L, E) for positions offset .. offset + L - 1 from cos/sin tables
// (P, E / 2): x1 * cos - x2 * sin, x2 * cos + x1 * sin, as cpu/kernels.py's RopeTable computes it.
mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin, int offset, mx::StreamOrDevice s = {});

class RowOp : public CpuPrimitive {
 public:
  RowOp(mx::Stream stream, RowKind kind, float eps, int offset = 0)
      : CpuPrimitive(stream), kind_(kind), eps_(eps), offset_(offset) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return kind_ == RowKind::rms_norm ? "MlxinferRMSNorm"
        : kind_ == RowKind::rope      ? "MlxinferRoPE"
        : kind_ == RowKind::log_softmax ? "MlxinferLogSoftmax"
        : kind_ == RowKind::softmax   ? "MlxinferSoftmax"
        : kind_ == RowKind::top_k     ? "MlxinferTopK"
        : kind_ == RowKind::top_p     ? "MlxinferTopP"
        : kind_ == RowKind::typical_p ? "MlxinferTypicalP"
                                      : "MlxinferSwiGLU";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  RowKind kind_;
  float eps_;
  int offset_;
};

} // namespace mlxinfer
