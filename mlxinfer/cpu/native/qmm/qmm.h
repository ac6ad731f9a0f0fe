// A batch-invariant CPU kernel for MLX's affine-quantized matmul with float32 activations, reached
// from MLX's graph as a custom primitive (mlxinfer/cpu/qmm.py builds and loads it).
#pragma once

#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mlxinfer {

namespace mx = mlx::core;

// Bumped whenever the kernel's arithmetic or interface changes (qmm.py checks it).
constexpr int QMM_ABI = 3;

// y = x @ dequantize(w, scales, biases).T, as mx.quantized_matmul(..., transpose=True) computes it,
// for x (..., K) in float32 (other float dtypes are cast), w (N, K * bits / 32) uint32, scales and
// biases (N, K / group_size) in float32, float16 or bfloat16 (read as stored, widened exactly; other
// dtypes are cast to float32). CPU streams only.
mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s = {});

// The same for several weights that take the same x (q, k and v; gate and up), in one node: their
// outputs side by side along the last axis, each column's bits as in a call of its own. Every weight
// has the same bits, group size and scale dtype.
mx::array quantized_matmul_cat(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s = {});

class QuantizedMatmulF32 : public mx::UnaryPrimitive {
 public:
  QuantizedMatmulF32(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "MlxinferQuantizedMatmulF32";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
};

enum class ScaleType { f32, f16, bf16 };

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

bool compiled_with_avx2();
int thread_count();

} // namespace mlxinfer
