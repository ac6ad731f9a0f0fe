// See attention.h. Built with qmm.cpp into the same extension, with the same flags (-ffp-contract=off).
#include "attention.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "attend_math.h"
#include "pool.h"
#include "qmm.h"
#include "rows.h"

namespace mlxinfer {

namespace {

// h = attended (M, K) @ the projection held[at .. at + 2] (+ held[at + 3]: linear_chain's stage and add);
// out = h, or with `then` h + the chain on h (its arrays after the residual): linear_chain's bits
void project(const std::vector<mx::array>& held, size_t at, const float* attended, int64_t M, int64_t K, int gs, int bits,
             bool residual, const std::vector<Stage>& then, mx::array& out) {
  const mx::array &w = held[at], &sc = held[at + 1], &bi = held[at + 2];
  const int64_t N = w.shape(0);
  std::vector<float> h(then.empty() ? 0 : M * N);
  float* y = then.empty() ? out.data<float>() : h.data();
  qmm_f32(attended, {{w.data<uint32_t>(), sc.data<void>(), bi.data<void>(), N}}, scale_type(sc.dtype()), y, M, K, gs,
          bits);
  if (residual) add_residual(held[at + 3], y, M * N);
  if (then.empty()) return;
  float* o = out.data<float>();
  run_stages(held, at + 3 + residual, then, h.data(), M, N, o);
  for (int64_t e = 0; e < M * N; ++e) o[e] += h[e];  // the chain's residual: its own input
}

mx::Stream cpu_only(mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device.type != mx::Device::cpu) {
    throw std::invalid_argument("[mlxinfer.attend] runs on a CPU stream only");
  }
  return stream;
}

// checks the shapes attention.h describes; returns L
int check(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const mx::array& kv, int offset, int H,
          int Hk, int row) {
  auto bad = [](const std::string& what) { return std::invalid_argument("[mlxinfer.attend] " + what); };
  if (H <= 0 || Hk <= 0 || H % Hk) throw bad("n_heads must be a multiple of n_kv_heads");
  if (kv.ndim() != 5 || kv.shape(1) != 2 || kv.shape(2) != Hk || kv.shape(4) % 2) {
    throw bad("the cache must be (B, 2, n_kv_heads, capacity, E): keys, then values, with an even E");
  }
  const int B = kv.shape(0), E = kv.shape(4);
  if (qkv.ndim() != 3 || qkv.shape(2) != (H + 2 * Hk) * E) throw bad("qkv must be (B, L, (n_heads + 2 n_kv_heads) E)");
  if (row < 0 ? qkv.shape(0) != B : (B != 1 || row >= qkv.shape(0))) {
    throw bad("qkv's rows must be the cache's (or, given a row of qkv, the cache must hold one row)");
  }
  const int L = qkv.shape(1);
  if (offset < 0 || offset + L > kv.shape(3)) throw bad("the cache has no room for positions offset .. offset + L - 1");
  if (cos.ndim() != 2 || cos.shape() != sin.shape() || cos.shape(1) * 2 != E || offset + L > cos.shape(0)) {
    throw bad("cos and sin must be (>= offset + L, E / 2)");
  }
  return L;
}

mx::array f32(const mx::array& a, const mx::Stream& s) {
  return a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, s);
}

// attend's and attend_rows' output projection and residual among the inputs: the output's last
// dimension becomes the projection's; returns (group_size, bits), (0, 0) without one.
std::pair<int, int> append_projection(std::vector<mx::array>& inputs, mx::Shape& shape,
                                      const std::optional<OutProj>& out_proj, const std::optional<mx::array>& residual,
                                      const std::vector<StageArgs>& then, std::vector<Stage>& then_stages,
                                      const mx::Stream& stream) {
  std::pair<int, int> layout{0, 0};
  if (out_proj) {
    const auto& [w, scales, biases, gs, b] = *out_proj;
    shape.back() = static_cast<int>(append_weights(inputs, shape.back(), {w}, {scales}, {biases}, gs, b, stream));
    layout = {gs, b};
  }
  if (residual) {
    if (!out_proj || residual->shape() != shape) {
      throw std::invalid_argument("[mlxinfer.attend] a residual needs out_proj and the output's shape");
    }
    inputs.push_back(f32(*residual, stream));
  }
  if (!then.empty()) {
    if (!residual) throw std::invalid_argument("[mlxinfer.attend] a chain after attention needs out_proj and a residual");
    int64_t width = 0;
    std::tie(then_stages, width) = append_stages(inputs, shape.back(), then, stream);
    if (width != shape.back()) {
      throw std::invalid_argument("[mlxinfer.attend] the chain after attention must keep the output's width");
    }
  }
  return layout;
}

}  // namespace

void check_norm(const std::optional<mx::array>& norm, const mx::array& kv) {
  if (norm && (norm->ndim() != 1 || norm->shape(0) != kv.shape(4))) {
    throw std::invalid_argument("[mlxinfer.attend] a head norm's weight must be (E,)");
  }
}

mx::array write_cache(const mx::array& kv, const mx::array& qkv, const mx::array& cos, const mx::array& sin, int offset,
                      int n_heads, int n_kv_heads, int row, const std::optional<mx::array>& norm, float eps,
                      mx::StreamOrDevice s) {
  auto stream = cpu_only(s);
  check(qkv, cos, sin, kv, offset, n_heads, n_kv_heads, row);
  check_norm(norm, kv);
  std::vector<mx::array> inputs{f32(kv, stream), f32(qkv, stream), f32(cos, stream), f32(sin, stream)};
  if (norm) inputs.push_back(f32(*norm, stream));
  return mx::array(
      kv.shape(),
      mx::float32,
      std::make_shared<Attend>(stream, AttendKind::write, offset, n_heads, n_kv_heads, 0.0f, row, eps, norm.has_value()),
      inputs);
}

mx::array attend(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const mx::array& kv, int offset,
                 int n_heads, int n_kv_heads, float scale, int row, const std::optional<mx::array>& norm, float eps,
                 const std::optional<OutProj>& out_proj, const std::optional<mx::array>& residual,
                 const std::vector<StageArgs>& then, mx::StreamOrDevice s) {
  auto stream = cpu_only(s);
  const int L = check(qkv, cos, sin, kv, offset, n_heads, n_kv_heads, row);
  check_norm(norm, kv);
  std::vector<mx::array> inputs{f32(qkv, stream), f32(cos, stream), f32(sin, stream), f32(kv, stream)};
  if (norm) inputs.push_back(f32(*norm, stream));
  mx::Shape shape{kv.shape(0), L, n_heads * kv.shape(4)};
  std::vector<Stage> stages;
  const auto [group_size, bits] = append_projection(inputs, shape, out_proj, residual, then, stages, stream);
  return mx::array(
      shape,
      mx::float32,
      std::make_shared<Attend>(stream, AttendKind::attend, offset, n_heads, n_kv_heads, scale, row, eps, norm.has_value(),
                               group_size, bits, residual.has_value(), std::move(stages)),
      inputs);
}

void Attend::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  if (kind_ == AttendKind::write) {
    const auto& kv = inputs[0];
    const Shapes d{kv.shape(0), inputs[1].shape(1), n_heads_, n_kv_heads_, kv.shape(4), kv.shape(3), offset_};
    const bool in_place = kv.is_donatable() && kv.flags().row_contiguous;
    if (in_place) {
      out.copy_shared_buffer(kv);  // what MLX's slice update does: the cache is written where it lies
    } else {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    enc.dispatch([kv = mx::array::unsafe_weak_copy(kv),
                  qkv = mx::array::unsafe_weak_copy(inputs[1]),
                  cos = mx::array::unsafe_weak_copy(inputs[2]),
                  sin = mx::array::unsafe_weak_copy(inputs[3]),
                  out = mx::array::unsafe_weak_copy(out),
                  d,
                  in_place,
                  norm = norm_ ? std::optional(mx::array::unsafe_weak_copy(inputs[4])) : std::nullopt,
                  eps = eps_,
                  first = std::max(row_, 0) * d.L * (d.H + 2 * d.Hk) * d.E]() mutable {
      std::vector<float> cc, cq, ccos, csin, cn;
      if (!in_place) std::memcpy(out.data<float>(), dense_rows(kv, cc), out.nbytes());
      write(d, dense_rows(qkv, cq) + first, dense_rows(cos, ccos), dense_rows(sin, csin),
            norm ? dense_rows(*norm, cn) : nullptr, eps, out.data<float>());
    });
    return;
  }
  if (!then_.empty()) check_stage_layout(inputs, 4 + norm_ + 3 + residual_, then_);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const auto& kv = inputs[3];
  const Shapes d{kv.shape(0), inputs[0].shape(1), n_heads_, n_kv_heads_, kv.shape(4), kv.shape(3), offset_};
  std::vector<mx::array> held;
  for (const auto& a : inputs) held.push_back(mx::array::unsafe_weak_copy(a));
  enc.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), d, norm = norm_, eps = eps_,
                first = std::max(row_, 0) * d.L * (d.H + 2 * d.Hk) * d.E, scale = scale_, gs = out_group_size_,
                bits = out_bits_, residual = residual_, then = then_]() mutable {
    std::vector<float> cq, cc, cs, ckv, cn, attended;
    float* y = out.data<float>();
    if (bits) attended.resize(d.B * d.L * d.H * d.E);
    attend_all(d, scale, dense_rows(held[0], cq) + first, dense_rows(held[1], cc), dense_rows(held[2], cs),
               dense_rows(held[3], ckv), norm ? dense_rows(held[4], cn) : nullptr, eps, bits ? attended.data() : y);
    if (bits) project(held, 4 + norm, attended.data(), d.B * d.L, d.H * d.E, gs, bits, residual, then, out);
  });
}

mx::array attend_rows(const mx::array& qkv, const mx::array& cos, const mx::array& sin,
                      const std::vector<mx::array>& kvs, const std::vector<int>& offsets, int n_heads,
                      int n_kv_heads, float scale, const std::optional<mx::array>& norm, float eps,
                      const std::optional<OutProj>& out_proj, const std::optional<mx::array>& residual,
                      const std::vector<StageArgs>& then, bool write_in_place, mx::StreamOrDevice s) {
  auto stream = cpu_only(s);
  const size_t A = kvs.size();
  if (write_in_place && norm) {
    throw std::invalid_argument("[mlxinfer.attend] write_in_place writes keys without a head norm: write_cache them");
  }
  if (A == 0 || offsets.size() != A || qkv.ndim() != 3 || qkv.shape(0) != static_cast<int>(A)) {
    throw std::invalid_argument("[mlxinfer.attend] attend_rows needs one cache and offset per row of qkv");
  }
  std::vector<mx::array> inputs{f32(qkv, stream), f32(cos, stream), f32(sin, stream)};
  if (norm) inputs.push_back(f32(*norm, stream));
  int L = 0;
  for (size_t r = 0; r < A; ++r) {
    L = check(qkv, cos, sin, kvs[r], offsets[r], n_heads, n_kv_heads, static_cast<int>(r));
    check_norm(norm, kvs[r]);
    if (write_in_place && kvs[r].dtype() != mx::float32) {
      throw std::invalid_argument("[mlxinfer.attend] write_in_place needs float32 caches (a copy would be written)");
    }
  }
  for (const auto& kv : kvs) inputs.push_back(f32(kv, stream));
  mx::Shape shape{static_cast<int>(A), L, n_heads * kvs[0].shape(4)};
  std::vector<Stage> stages;
  const auto [group_size, bits] = append_projection(inputs, shape, out_proj, residual, then, stages, stream);
  return mx::array(
      shape,
      mx::float32,
      std::make_shared<AttendRows>(stream, offsets, n_heads, n_kv_heads, scale, eps, norm.has_value(), group_size, bits,
                                   residual.has_value(), std::move(stages), write_in_place),
      inputs);
}

void AttendRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  if (!then_.empty()) check_stage_layout(inputs, 3 + norm_ + offsets_.size() + 3 + residual_, then_);
  if (write_) {
    for (size_t r = 0; r < offsets_.size(); ++r) {
      const auto& kv = inputs[3 + norm_ + r];
      if (!kv.flags().row_contiguous || kv.data_size() != kv.size()) {
        throw std::runtime_error("[mlxinfer.attend] write_in_place needs each cache in a buffer of its own");
      }
    }
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  std::vector<mx::array> held;
  for (const auto& a : inputs) held.push_back(mx::array::unsafe_weak_copy(a));
  enc.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), in_place = write_, offsets = offsets_, H = n_heads_,
                Hk = n_kv_heads_, scale = scale_, eps = eps_, norm = norm_, gs = out_group_size_, bits = out_bits_,
                residual = residual_, then = then_]() mutable {
    const int64_t A = offsets.size(), L = held[0].shape(1), width = held[0].shape(2);
    const size_t first_kv = 3 + norm;
    const int64_t E = held[first_kv].shape(4);
    std::vector<float> cq, cc, cs, cn, attended;
    const float* qkv = dense_rows(held[0], cq);
    const float* cos = dense_rows(held[1], cc);
    const float* sin = dense_rows(held[2], cs);
    const float* nw = norm ? dense_rows(held[3], cn) : nullptr;
    float* y = out.data<float>();
    if (bits) attended.resize(A * L * H * E);
    float* att = bits ? attended.data() : y;
    auto row = [&](int64_t r) {  // attend(..., row = r)'s call, its bits
      std::vector<float> ckv;
      const mx::array& kv = held[first_kv + r];
      const Shapes d{1, L, H, Hk, E, kv.shape(3), offsets[r]};
      if (in_place) {  // the buffer is this row's alone (checked above, promised by the caller): written where it lies
        write(d, qkv + r * L * width, cos, sin, nullptr, 0.0f, const_cast<float*>(kv.data<float>()));
      }
      attend_all(d, scale, qkv + r * L * width, cos, sin, dense_rows(kv, ckv), nw, eps, att + r * L * H * E);
    };
    {
      Pool& pl = pool();
      std::unique_lock<std::mutex> lock(pl.busy(), std::try_to_lock);
      if (A > 1 && lock.owns_lock()) {  // rows side by side on the pool's threads, each row on one of them
        pl.run([&](int r) { row(r); }, static_cast<int>(A));
      } else {
        if (lock.owns_lock()) lock.unlock();  // one row: its heads may share the pool (attend_all)
        for (int64_t r = 0; r < A; ++r) row(r);
      }
    }
    if (bits) project(held, first_kv + A, attended.data(), A * L, H * E, gs, bits, residual, then, out);
  });
}

void AttendRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlxinfer.attend] has no GPU implementation");
}

bool AttendRows::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AttendRows&>(other);
  return write_ == o.write_ && offsets_ == o.offsets_ && n_heads_ == o.n_heads_ && n_kv_heads_ == o.n_kv_heads_ && scale_ == o.scale_ &&
      eps_ == o.eps_ && norm_ == o.norm_ && out_group_size_ == o.out_group_size_ && out_bits_ == o.out_bits_ &&
      residual_ == o.residual_ && then_ == o.then_;
}

std::vector<mx::Shape> AttendRows::output_shapes(const std::vector<mx::array>& inputs) {
  const int A = static_cast<int>(offsets_.size());
  const int width = out_bits_ ? inputs[3 + norm_ + A].shape(0) : n_heads_ * inputs[3 + norm_].shape(4);
  return {mx::Shape{A, inputs[0].shape(1), width}};
}

void Attend::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("[mlxinfer.attend] has no GPU implementation");
}

bool Attend::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const Attend&>(other);
  return kind_ == o.kind_ && offset_ == o.offset_ && row_ == o.row_ && eps_ == o.eps_ && n_heads_ == o.n_heads_ &&
      n_kv_heads_ == o.n_kv_heads_ && scale_ == o.scale_ && norm_ == o.norm_ && out_group_size_ == o.out_group_size_ &&
      out_bits_ == o.out_bits_ && residual_ == o.residual_ && then_ == o.then_;
}

std::vector<mx::Shape> Attend::output_shapes(const std::vector<mx::array>& inputs) {
  if (kind_ == AttendKind::write) return {inputs[0].shape()};
  const auto& kv = inputs[3];
  const int width = out_bits_ ? inputs[4 + norm_].shape(0) : n_heads_ * kv.shape(4);
  return {mx::Shape{kv.shape(0), inputs[0].shape(1), width}};
}

}  // namespace mlxinfer
