// The MLX primitive around qmm.cpp's kernel: the op that checks shapes and dtypes and builds the graph
// node, and its evaluation on the CPU stream.
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "int8.h"
#include "pool.h"
#include "qmm.h"
#include "rows.h"

namespace mlxinfer {

// ------------------------------------------------------------------ the primitive

namespace {

constexpr const char* kName = "[mlxinfer.quantized_matmul] ";

Prologue prologue_named(const std::string& name) {
  if (name.empty() || name == "none") return Prologue::none;
  if (name == "rms_norm") return Prologue::rms_norm;
  if (name == "swiglu_halves") return Prologue::swiglu_halves;
  throw std::invalid_argument(std::string(kName) + "a stage's prologue is '', 'rms_norm' or 'swiglu_halves', not '" +
                              name + "'");
}

}  // namespace

int64_t append_weights(
    std::vector<mx::array>& inputs,
    int64_t K,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    const mx::Stream& stream,
    const char* who) {
  const bool int8 = int8_layout(bits);  // the int8 path's layout (int8.h): the flag above the bits
  if ((bits & ~(kInt8Layout | 0xff)) || (value_bits(bits) != 4 && value_bits(bits) != 8)) {
    throw std::invalid_argument(std::string(who) + "bits must be 4 or 8, not " + std::to_string(bits));
  }
  bits = value_bits(bits);
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw std::invalid_argument(
        std::string(who) + "group_size must be 32, 64 or 128, not " + std::to_string(group_size));
  }
  if (ws.empty() || scales.size() != ws.size() || biases.size() != ws.size()) {
    throw std::invalid_argument(std::string(who) + "needs one scales and one biases array per weight");
  }
  // scales and biases share one of float32/float16/bfloat16 (the kernel widens them)
  auto sdtype = scales[0].dtype();
  if (sdtype != mx::float32 && sdtype != mx::float16 && sdtype != mx::bfloat16) sdtype = mx::float32;
  int64_t N = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto& w = ws[i];
    if (w.dtype() != mx::uint32 || w.ndim() != 2) {
      throw std::invalid_argument(std::string(who) + "w must be a 2-D uint32 array (mx.quantize's output)");
    }
    if (static_cast<int64_t>(w.shape(1)) * 32 / bits != K || K % group_size != 0) {
      throw std::invalid_argument(
          std::string(who) + "x's last dimension (" + std::to_string(K) + ") does not match w (" +
          std::to_string(w.shape(1)) + " words of " + std::to_string(bits) + "-bit values) in groups of " +
          std::to_string(group_size));
    }
    if (int8 && !int8_supports(K, group_size, bits)) {
      throw std::invalid_argument(std::string(who) + "the int8 layout takes 4-bit rows in multiples of 64 values");
    }
    const mx::Shape groups{w.shape(0), static_cast<int>(int8 ? int8_lanes(K, group_size) : K / group_size)};
    if (scales[i].shape() != groups || biases[i].shape() != groups) {
      throw std::invalid_argument(std::string(who) + "scales and biases must have shape (N, K / group_size)" +
                                  (int8 ? " as int8 lanes (int8_lane_groups)" : ""));
    }
    inputs.push_back(w);
    inputs.push_back(cast(scales[i], sdtype, stream));
    inputs.push_back(cast(biases[i], sdtype, stream));
    N += w.shape(0);
  }
  return N;
}

std::pair<std::vector<Stage>, int64_t> append_stages(std::vector<mx::array>& inputs, int64_t K,
                                                     const std::vector<StageArgs>& stage_args, const mx::Stream& stream) {
  if (stage_args.empty()) throw std::invalid_argument(std::string(kName) + "a chain needs at least one stage");
  std::vector<Stage> stages;
  for (const auto& [name, norm, eps, ws, scales, biases, group_size, bits] : stage_args) {
    const Prologue prologue = prologue_named(name);
    if (prologue == Prologue::rms_norm) {
      if (!norm || norm->ndim() != 1 || norm->shape(0) != K) {
        throw std::invalid_argument(std::string(kName) + "rms_norm needs a 1-D weight of its input's last dimension");
      }
      inputs.push_back(f32(*norm, stream));
    } else if (norm) {
      throw std::invalid_argument(std::string(kName) + "a norm weight is only for the rms_norm prologue");
    }
    if (prologue == Prologue::swiglu_halves) {
      if (K % 2) throw std::invalid_argument(std::string(kName) + "swiglu_halves needs an even last dimension");
      K /= 2;
    }
    const int64_t N = append_weights(inputs, K, ws, scales, biases, group_size, bits, stream);
    stages.push_back({prologue, eps, group_size, bits, static_cast<int>(ws.size())});
    K = N;
  }
  return {std::move(stages), K};
}

mx::array linear_chain(
    const mx::array& x,
    const std::vector<StageArgs>& stage_args,
    const std::optional<mx::array>& residual,
    mx::StreamOrDevice s) {
  auto stream = cpu_stream(s, "[mlxinfer.quantized_matmul] runs on a CPU stream only");
  if (x.ndim() < 1 || !mx::issubdtype(x.dtype(), mx::floating)) {
    throw std::invalid_argument(std::string(kName) + "x must be a floating-point array of at least 1 dim");
  }
  std::vector<mx::array> inputs{f32(x, stream)};
  auto [stages, K] = append_stages(inputs, x.shape(-1), stage_args, stream);
  auto out_shape = x.shape();
  out_shape.back() = static_cast<int>(K);
  if (residual) {
    if (residual->shape() != out_shape) {
      throw std::invalid_argument(std::string(kName) + "the residual must have the output's shape");
    }
    inputs.push_back(f32(*residual, stream));
  }
  return mx::array(
      out_shape,
      mx::float32,
      std::make_shared<QuantizedMatmulF32>(stream, std::move(stages), residual.has_value()),
      inputs);
}

void check_stage_layout(const std::vector<mx::array>& inputs, size_t at, const std::vector<Stage>& stages) {
  for (const Stage& st : stages) {
    at += st.prologue == Prologue::rms_norm;
    for (int i = 0; i < 3 * st.weights; ++i, ++at) {
      if (!inputs[at].flags().row_contiguous) {
        throw std::runtime_error("[mlxinfer.quantized_matmul] w, scales and biases must be row-contiguous");
      }
    }
  }
}

void QuantizedMatmulF32::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  check_stage_layout(inputs, 1, stages_);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.dispatch([held = hold(encoder, inputs, out), out = mx::array::unsafe_weak_copy(out), stages = stages_,
                    residual = residual_]() mutable {
    std::vector<float> copy;
    const int64_t K = held[0].shape(-1);
    const int64_t M = K ? static_cast<int64_t>(held[0].size()) / K : 0;
    const size_t at = run_stages(held, 1, stages, dense(held[0], copy), M, K, out.data<float>());
    if (residual) add_residual(held[at], out.data<float>(), out.size());
  });
}

size_t run_stages(const std::vector<mx::array>& held, size_t at, const std::vector<Stage>& stages, const float* in,
                  int64_t M, int64_t K, float* out) {
  std::vector<std::vector<float>> copies(stages.size());  // a norm weight that is not dense
  // each stage's prologue output and matmul output, uninitialised: every element is written before it
  // is read (zero-filling them was ~1% of a 64-token prefill)
  std::vector<std::unique_ptr<float[]>> scratch;
  auto buffer = [&](int64_t n) { return scratch.emplace_back(new float[n]).get(); };
  for (size_t i = 0; i < stages.size(); ++i) {
    const Stage& st = stages[i];
    if (st.prologue == Prologue::rms_norm) {
      const float* w = dense(held[at++], copies[i]);
      float* y = buffer(M * K);
      for_rows(M, K, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) rms_norm_row(in + r * K, w, y + r * K, K, st.eps);
      });
      in = y;
    } else if (st.prologue == Prologue::swiglu_halves) {
      const int64_t half = K / 2;
      float* y = buffer(M * half);
      for_rows(M, 8 * half, [&](int64_t r0, int64_t r1) {  // an exp a value: worth ~8 plain ones
        for (int64_t r = r0; r < r1; ++r) swiglu_row(in + r * K, in + r * K + half, y + r * half, half);
      });
      in = y, K = half;
    }
    std::vector<Weight> weights;
    int64_t N = 0;
    for (int j = 0; j < st.weights; ++j, at += 3) {
      weights.push_back({held[at].data<uint32_t>(), held[at + 1].data<void>(), held[at + 2].data<void>(), held[at].shape(0)});
      N += held[at].shape(0);
    }
    const ScaleType stype = scale_type(held[at - 2].dtype());
    float* y = i + 1 < stages.size() ? buffer(M * N) : out;
    qmm_f32(in, weights, stype, y, M, K, st.group_size, st.bits);
    in = y, K = N;
  }
  return at;
}

void add_residual(const mx::array& residual, float* y, size_t n) {
  std::vector<float> copy;
  const float* r = dense(residual, copy);
  for (size_t e = 0; e < n; ++e) y[e] += r[e];
}

mx::array dequantize_rows(
    const mx::array& ids,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s) {
  auto stream = cpu_stream(s, "[mlxinfer.dequantize_rows] runs on a CPU stream only");
  if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    throw std::invalid_argument("[mlxinfer.dequantize_rows] ids must be integers");
  }
  // K: the values w's rows hold; append_weights then checks w, scales and biases as a matmul's
  const int vb = value_bits(bits);
  const int64_t K = w.ndim() == 2 && (vb == 4 || vb == 8) ? static_cast<int64_t>(w.shape(1)) * 32 / vb : 0;
  std::vector<mx::array> inputs{cast(ids, mx::int32, stream)};
  append_weights(inputs, K, {w}, {scales}, {biases}, group_size, bits, stream, "[mlxinfer.dequantize_rows] ");
  auto shape = ids.shape();
  shape.push_back(static_cast<int>(K));
  return mx::array(shape, mx::float32, std::make_shared<DequantizeRows>(stream, group_size, bits), inputs);
}

void DequantizeRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i].flags().row_contiguous) {
      throw std::runtime_error("[mlxinfer.dequantize_rows] w, scales and biases must be row-contiguous");
    }
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.dispatch([in = hold(encoder, inputs, out), out = mx::array::unsafe_weak_copy(out), gs = group_size_,
                    bits = bits_]() mutable {
    const mx::array &ids = in[0], &w = in[1], &sc = in[2], &bi = in[3];
    std::vector<int32_t> copy;
    const int32_t* id = dense(ids, copy);
    const int64_t N = w.shape(0), Kw = w.shape(1), K = Kw * 32 / value_bits(bits);
    const int64_t G = int8_layout(bits) ? int8_lanes(K, gs) : K / gs;  // scales a row
    const ScaleType st = scale_type(sc.dtype());
    const size_t width = sc.dtype() == mx::float32 ? 4 : 2;
    const auto* s = static_cast<const char*>(sc.data<void>());
    const auto* b = static_cast<const char*>(bi.data<void>());
    float* y = out.data<float>();
    for (size_t r = 0; r < ids.size(); ++r) {
      const int64_t n = id[r];
      if (n < 0 || n >= N) {
        std::fill(y + r * K, y + (r + 1) * K, NAN);
        continue;
      }
      dequantize_row(w.data<uint32_t>() + n * Kw, s + n * G * width, b + n * G * width, st, y + r * K, K, gs, bits);
    }
  });
}

bool QuantizedMatmulF32::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const QuantizedMatmulF32&>(other);
  return stages_ == o.stages_ && residual_ == o.residual_;
}

std::vector<mx::Shape> QuantizedMatmulF32::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  size_t at = 1;
  int n = 0;
  for (const Stage& st : stages_) {
    at += st.prologue == Prologue::rms_norm;
    n = 0;
    for (int j = 0; j < st.weights; ++j, at += 3) n += inputs[at].shape(0);
  }
  shape.back() = n;
  return {shape};
}

}  // namespace mlxinfer
