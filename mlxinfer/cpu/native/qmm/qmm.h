// A batch-invariant CPU kernel for MLX's affine-quantized matmul with float32 activations, reached
// from MLX's graph as a custom primitive (mlxinfer/cpu/qmm.py builds and loads it).
#pragma once

#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mlxinfer {

namespace mx = mlx::core;

// Bumped whenever the kernel's arithmetic or interface changes (qmm.py checks it).
constexpr int QMM_ABI = 2;

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

// The raw kernel on host pointers: x (M, K) row-major, w (N, K * bits / 32), s and b (N, K / group_size)
// in the dtype scale_type names, y (M, N).
void qmm_f32(
    const float* x,
    const uint32_t* w,
    const void* s,
    const void* b,
    ScaleType scale_type,
    float* y,
    int64_t M,
    int64_t N,
    int64_t K,
    int group_size,
    int bits);

bool compiled_with_avx2();
int thread_count();

} // namespace mlxinfer
