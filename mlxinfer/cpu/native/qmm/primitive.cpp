// The MLX primitive around qmm.cpp's kernel: the op that checks shapes and dtypes and builds the graph
// node, and its evaluation on the CPU stream.
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "qmm.h"
#include "rows.h"

namespace mlxinfer {

// ------------------------------------------------------------------ the primitive

mx::array quantized_matmul_cat(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device.type != mx::Device::cpu) {
    throw std::invalid_argument("[mlxinfer.quantized_matmul] runs on a CPU stream only");
  }
  if (bits != 4 && bits != 8) {
    throw std::invalid_argument("[mlxinfer.quantized_matmul] bits must be 4 or 8, not " + std::to_string(bits));
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw std::invalid_argument(
        "[mlxinfer.quantized_matmul] group_size must be 32, 64 or 128, not " + std::to_string(group_size));
  }
  if (x.ndim() < 1 || !mx::issubdtype(x.dtype(), mx::floating)) {
    throw std::invalid_argument("[mlxinfer.quantized_matmul] x must be a floating-point array of at least 1 dim");
  }
  if (ws.empty() || scales.size() != ws.size() || biases.size() != ws.size()) {
    throw std::invalid_argument("[mlxinfer.quantized_matmul] needs one scales and one biases array per weight");
  }
  const int64_t K = x.shape(-1);
  auto sdtype = scales[0].dtype();  // scales and biases share one of float32/float16/bfloat16 (the kernel widens them)
  if (sdtype != mx::float32 && sdtype != mx::float16 && sdtype != mx::bfloat16) sdtype = mx::float32;
  auto cast = [&](const mx::array& a, mx::Dtype t) { return a.dtype() == t ? a : mx::astype(a, t, stream); };
  std::vector<mx::array> inputs{cast(x, mx::float32)};
  int64_t N = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto& w = ws[i];
    if (w.dtype() != mx::uint32 || w.ndim() != 2) {
      throw std::invalid_argument("[mlxinfer.quantized_matmul] w must be a 2-D uint32 array (mx.quantize's output)");
    }
    if (static_cast<int64_t>(w.shape(1)) * 32 / bits != K || K % group_size != 0) {
      throw std::invalid_argument(
          "[mlxinfer.quantized_matmul] x's last dimension (" + std::to_string(K) + ") does not match w (" +
          std::to_string(w.shape(1)) + " words of " + std::to_string(bits) + "-bit values) in groups of " +
          std::to_string(group_size));
    }
    const mx::Shape groups{w.shape(0), static_cast<int>(K / group_size)};
    if (scales[i].shape() != groups || biases[i].shape() != groups) {
      throw std::invalid_argument("[mlxinfer.quantized_matmul] scales and biases must have shape (N, K / group_size)");
    }
    inputs.push_back(w);
    inputs.push_back(cast(scales[i], sdtype));
    inputs.push_back(cast(biases[i], sdtype));
    N += w.shape(0);
  }
  auto out_shape = x.shape();
  out_shape.back() = static_cast<int>(N);
  return mx::array(out_shape, mx::float32, std::make_shared<QuantizedMatmulF32>(stream, group_size, bits), inputs);
}

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s) {
  return quantized_matmul_cat(x, {w}, {scales}, {biases}, group_size, bits, s);
}

void QuantizedMatmulF32::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i].flags().row_contiguous) {
      throw std::runtime_error("[mlxinfer.quantized_matmul] w, scales and biases must be row-contiguous");
    }
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> held;
  for (auto& a : inputs) {
    encoder.set_input_array(a);
    held.push_back(mx::array::unsafe_weak_copy(a));
  }
  encoder.set_output_array(out);
  const int gs = group_size_, bits = bits_;
  const auto sd = inputs[2].dtype();
  const ScaleType st = sd == mx::float16 ? ScaleType::f16 : sd == mx::bfloat16 ? ScaleType::bf16 : ScaleType::f32;
  encoder.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), gs, bits, st]() mutable {
    const mx::array& x = held[0];
    const int64_t K = x.shape(-1);
    const int64_t M = K ? static_cast<int64_t>(x.size()) / K : 0;
    std::vector<Weight> weights;
    for (size_t i = 1; i + 2 < held.size(); i += 3) {
      weights.push_back({held[i].data<uint32_t>(), held[i + 1].data<void>(), held[i + 2].data<void>(), held[i].shape(0)});
    }
    std::vector<float> copy;
    const float* xd = dense_rows(x, copy);
    qmm_f32(xd, weights, st, out.data<float>(), M, K, gs, bits);
  });
}

void QuantizedMatmulF32::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlxinfer.quantized_matmul] has no GPU implementation; use mx.quantized_matmul");
}

bool QuantizedMatmulF32::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const QuantizedMatmulF32&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_;
}

std::vector<mx::Shape> QuantizedMatmulF32::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  int n = 0;
  for (size_t i = 1; i < inputs.size(); i += 3) n += inputs[i].shape(0);
  shape.back() = n;
  return {shape};
}

}  // namespace mlxinfer
