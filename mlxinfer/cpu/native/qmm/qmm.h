// A batch-invariant CPU kernel for MLX's affine-quantized matmul with float32 activations, reached
// from MLX's graph as a custom primitive (mlxinfer/cpu/qmm.py builds and loads it).
#pragma once

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "rows.h"
#include "scales.h"

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace mlxinfer {

namespace mx = mlx::core;

// Bumped whenever the kernel's arithmetic or interface changes (qmm.py checks it).
constexpr int QMM_ABI = 15;

// What a stage of a chain does to its input before its matmul.
enum class Prologue { none, rms_norm, swiglu_halves };

// One matmul of a chain: its input's prologue (rms_norm: eps, and a weight among the inputs), then its
// weights side by side (`weights` of them, one bits / group size).
struct Stage {
  Prologue prologue;
  float eps;
  int group_size;
  int bits;
  int weights;
  bool operator==(const Stage&) const = default;
};

// A chain of matmuls as one node: stage i's output is stage i + 1's input; the last one's output, plus
// `residual` when given (one add per element), is the node's. A stage's weights run side by side (q, k and v;
// gate and up), each output column's bits as in a quantized_matmul of its own; the prologues have the bits of
// the separate ops (rms_norm; swiglu on the input's halves, gate then up): they run the same row functions. A decoder
// layer's "norm, then q/k/v" and "norm, gate/up, SwiGLU, down, + h" are one node each (model/native_block.py).
// A stage: (prologue "" | "rms_norm" | "swiglu_halves", the norm's weight or None, eps, ws, scales,
// biases, group_size, bits).
using StageArgs = std::tuple<
    std::string,
    std::optional<mx::array>,
    float,
    std::vector<mx::array>,
    std::vector<mx::array>,
    std::vector<mx::array>,
    int,
    int>;
mx::array linear_chain(
    const mx::array& x,
    const std::vector<StageArgs>& stages,
    const std::optional<mx::array>& residual,
    mx::StreamOrDevice s = {});

// The checks a stage makes of its weights (inputs K wide), and their arrays as the kernel reads them
// (w, then scales and biases in one float dtype) appended to `inputs`; returns their total N. `who`: the op
// its errors name (dequantize_rows makes the same checks of its table).
int64_t append_weights(
    std::vector<mx::array>& inputs,
    int64_t K,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    const mx::Stream& stream,
    const char* who = "[mlxinfer.quantized_matmul] ");

// linear_chain's checks of `stage_args` on an input K wide, their arrays appended to `inputs`; returns
// the stages and the last one's output width.
std::pair<std::vector<Stage>, int64_t> append_stages(std::vector<mx::array>& inputs, int64_t K,
                                                     const std::vector<StageArgs>& stage_args, const mx::Stream& stream);

// The stages on M rows of `in` (K wide), the last one's output into y, their arrays read from held[at ..];
// returns the index after them. linear_chain's evaluation, and attend's when a chain follows it.
size_t run_stages(const std::vector<mx::array>& held, size_t at, const std::vector<Stage>& stages, const float* in,
                  int64_t M, int64_t K, float* y);

// Throws unless the stages' w, scales and biases (from inputs[at]) are row-contiguous, as the kernel reads them.
void check_stage_layout(const std::vector<mx::array>& inputs, size_t at, const std::vector<Stage>& stages);

class QuantizedMatmulF32 : public CpuPrimitive {
 public:
  QuantizedMatmulF32(mx::Stream stream, std::vector<Stage> stages, bool residual)
      : CpuPrimitive(stream), stages_(std::move(stages)), residual_(residual) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return stages_.size() == 1 && stages_[0].prologue == Prologue::none && !residual_ ? "MlxinferQuantizedMatmulF32"
                                                                                       : "MlxinferLinearChain";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  std::vector<Stage> stages_;
  bool residual_;
};

enum class ScaleType { f32, f16, bf16 };

// The tag of the dtype a call's scales and biases are stored in (append_weights casts any other to float32).
inline ScaleType scale_type(mx::Dtype d) {
  return d == mx::float16 ? ScaleType::f16 : d == mx::bfloat16 ? ScaleType::bf16 : ScaleType::f32;
}

// fn(F16{}), fn(BF16{}) or fn(F32{}): a template over the scales' stored type, for the one st names
template <class Fn>
decltype(auto) with_scale_type(ScaleType st, Fn&& fn) {
  if (st == ScaleType::f16) return fn(F16{});
  if (st == ScaleType::bf16) return fn(BF16{});
  return fn(F32{});
}

// y (n floats) += residual, element by element: the add MLX's h + out would do (a chain's or attention's
// last step).
void add_residual(const mx::array& residual, float* y, size_t n);

// One weight of a call: w (N, K * bits / 32), s and b (N, K / group_size).
struct Weight {
  const uint32_t* w;
  const void* s;
  const void* b;
  int64_t N;
};

// The raw kernel on host pointers: x (M, K) row-major, y (M, sum of the weights' N): the weights'
// outputs side by side, as if their rows were one matrix (each column's arithmetic is its own, so
// the bits are those of separate calls). Scales and biases in the dtype scale_type names.
void qmm_f32(const float* x, const std::vector<Weight>& weights, ScaleType scale_type, float* y, int64_t M, int64_t K,
             int group_size, int bits);

// range_of(i, col) gives the function (n0, n1) that computes weight i's output columns n0 .. n1 - 1 (its first
// column of y: col). The columns of all the weights, split into chunks (multiples of 4, so that full tiles stay
// full; a chunk never spans two weights), run on the pool's threads, or on this one where the work is small or
// the pool busy: which thread runs a chunk never changes an output's arithmetic. qmm_f32's and qmm_i8's split.
using Range = std::function<void(int64_t, int64_t)>;
void run_columns(const std::vector<Weight>& weights, int64_t K, const std::function<Range(size_t, int64_t)>& range_of);

// Row `w` of a quantized table dequantized in float32 (K values): q * scale + bias, two roundings, as
// mx.dequantize computes it.
void dequantize_row(const uint32_t* w, const void* s, const void* b, ScaleType scale_type, float* y, int64_t K,
                    int group_size, int bits);

// An embedding lookup in one node: the rows `ids` (..., integer) of a quantized table (N, K * bits / 32)
// dequantized, (..., K) float32, the bits of mx.dequantize(w[ids], scales[ids], biases[ids]) (MLX's CPU
// back end composes that from ~28 nodes). An id outside 0 .. N - 1 gives a row of NaN, never a read
// outside the table.
mx::array dequantize_rows(
    const mx::array& ids,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s = {});

class DequantizeRows : public CpuPrimitive {
 public:
  DequantizeRows(mx::Stream stream, int group_size, int bits)
      : CpuPrimitive(stream), group_size_(group_size), bits_(bits) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "MlxinferDequantizeRows";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const DequantizeRows&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.push_back(static_cast<int>(static_cast<int64_t>(inputs[1].shape(1)) * 32 / (bits_ & 0xff)));
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
};

bool compiled_with_avx2();
// The several-row tiles' shape, rows x columns: "3x3" (AVX2), "4x4" (AVX-512VL's registers), "1x1" (portable).
std::string tile_shape();
int thread_count();

} // namespace mlxinfer
