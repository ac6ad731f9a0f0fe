// See attention.h. Built with qmm.cpp into the same extension, with the same flags (-ffp-contract=off).
#include "attention.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mlx/allocator.h"
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

// checks the shapes attention.h describes for a cache of qkv's rows first .. first + C - 1 (and a head norm's
// weight); returns L
int check(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const mx::array& kv, int offset, int H,
          int Hk, int first, const std::optional<mx::array>& norm, int base = 0) {
  auto bad = [](const std::string& what) { return std::invalid_argument("[mlxinfer.attend] " + what); };
  if (H <= 0 || Hk <= 0 || H % Hk) throw bad("n_heads must be a multiple of n_kv_heads");
  if (kv.ndim() != 5 || kv.shape(1) != 2 || kv.shape(2) != Hk || kv.shape(4) % 2) {
    throw bad("the cache must be (C, 2, n_kv_heads, capacity, E): keys, then values, with an even E");
  }
  const int E = kv.shape(4);
  if (qkv.ndim() != 3 || qkv.shape(2) != (H + 2 * Hk) * E) throw bad("qkv must be (B, L, (n_heads + 2 n_kv_heads) E)");
  if (first < 0 || first + kv.shape(0) > qkv.shape(0)) throw bad("the cache holds rows that qkv does not have");
  const int L = qkv.shape(1);
  if (base < 0 || offset < base || offset - base + L > kv.shape(3)) {
    throw bad("the cache has no room for positions offset .. offset + L - 1 (from slot offset - base)");
  }
  if (cos.ndim() != 2 || cos.shape() != sin.shape() || cos.shape(1) * 2 != E || offset + L > cos.shape(0)) {
    throw bad("cos and sin must be (>= offset + L, E / 2)");
  }
  if (norm && (norm->ndim() != 1 || norm->shape(0) != E)) throw bad("a head norm's weight must be (E,)");
  return L;
}

// attend's output projection and residual among the inputs: the output's last
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

mx::array write_cache(const mx::array& kv, const mx::array& qkv, const mx::array& cos, const mx::array& sin, int offset,
                      int n_heads, int n_kv_heads, int first, const std::optional<mx::array>& norm, float eps,
                      int base, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s, "[mlxinfer.attend] runs on a CPU stream only");
  check(qkv, cos, sin, kv, offset, n_heads, n_kv_heads, first, norm, base);
  std::vector<mx::array> inputs{f32(kv, stream), f32(qkv, stream), f32(cos, stream), f32(sin, stream)};
  if (norm) inputs.push_back(f32(*norm, stream));
  return mx::array(kv.shape(), mx::float32,
                   std::make_shared<WriteCache>(stream, offset, n_heads, n_kv_heads, first, eps, norm.has_value(), base),
                   inputs);
}

void WriteCache::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto& kv = inputs[0];
  const Shapes d{kv.shape(0), inputs[1].shape(1), n_heads_, n_kv_heads_, kv.shape(4), kv.shape(3), offset_, base_};
  const bool in_place = kv.is_donatable() && kv.flags().row_contiguous;
  if (in_place) {
    out.copy_shared_buffer(kv);  // what MLX's slice update does: the cache is written where it lies
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  // held: kv, qkv, cos, sin, then the head norm's weight where there is one
  enc.dispatch([held = hold(enc, inputs, out), out = mx::array::unsafe_weak_copy(out), d, in_place, eps = eps_,
                first = first_ * d.L * (d.H + 2 * d.Hk) * d.E, norm = norm_]() mutable {
    std::vector<float> cc, cq, ccos, csin, cn;
    if (!in_place) std::memcpy(out.data<float>(), dense(held[0], cc), out.nbytes());
    write(d, dense(held[1], cq) + first, dense(held[2], ccos), dense(held[3], csin),
          norm ? dense(held[4], cn) : nullptr, eps, out.data<float>());
  });
}

bool WriteCache::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const WriteCache&>(other);
  return base_ == o.base_ && offset_ == o.offset_ && n_heads_ == o.n_heads_ && n_kv_heads_ == o.n_kv_heads_ &&
      first_ == o.first_ && eps_ == o.eps_ && norm_ == o.norm_;
}

mx::array attend(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const std::vector<mx::array>& kvs,
                 const std::vector<int>& offsets, int n_heads, int n_kv_heads, float scale,
                 const std::optional<mx::array>& norm, float eps, const std::optional<OutProj>& out_proj,
                 const std::optional<mx::array>& residual, const std::vector<StageArgs>& then, bool write_in_place,
                 const std::optional<mx::array>& prefix, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s, "[mlxinfer.attend] runs on a CPU stream only");
  if (write_in_place && norm) {
    throw std::invalid_argument("[mlxinfer.attend] write_in_place writes keys without a head norm: write_cache them");
  }
  if (kvs.empty() || offsets.size() != kvs.size() || qkv.ndim() != 3) {
    throw std::invalid_argument("[mlxinfer.attend] attend needs one offset per cache, and caches of qkv's rows");
  }
  std::vector<mx::array> inputs{f32(qkv, stream), f32(cos, stream), f32(sin, stream)};
  if (norm) inputs.push_back(f32(*norm, stream));
  const int base = prefix ? prefix->shape(3) : 0;
  if (prefix && (prefix->ndim() != 5 || prefix->shape(0) != 1 || prefix->shape(1) != 2 ||
                 prefix->shape(2) != kvs[0].shape(2) || prefix->shape(4) != kvs[0].shape(4))) {
    throw std::invalid_argument("[mlxinfer.attend] a prefix must be (1, 2, n_kv_heads, base, E)");
  }
  int L = 0, first = 0;
  for (size_t g = 0; g < kvs.size(); first += kvs[g].shape(0), ++g) {
    L = check(qkv, cos, sin, kvs[g], offsets[g], n_heads, n_kv_heads, first, norm, base);
    if (write_in_place && kvs[g].dtype() != mx::float32) {
      throw std::invalid_argument("[mlxinfer.attend] write_in_place needs float32 caches (a copy would be written)");
    }
  }
  if (first != qkv.shape(0)) {
    throw std::invalid_argument("[mlxinfer.attend] attend needs one offset per cache, and caches of qkv's rows");
  }
  for (const auto& kv : kvs) inputs.push_back(f32(kv, stream));
  if (prefix) inputs.push_back(f32(*prefix, stream));
  mx::Shape shape{qkv.shape(0), L, n_heads * kvs[0].shape(4)};
  std::vector<Stage> stages;
  const auto [group_size, bits] = append_projection(inputs, shape, out_proj, residual, then, stages, stream);
  return mx::array(shape, mx::float32,
                   std::make_shared<Attend>(stream, offsets, n_heads, n_kv_heads, scale, eps, norm.has_value(),
                                            group_size, bits, residual.has_value(), std::move(stages), write_in_place,
                                            prefix.has_value()),
                   inputs);
}

void Attend::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const size_t first_kv = 3 + norm_, G = offsets_.size(), after = first_kv + G + prefix_;  // the projection's
  if (!then_.empty()) check_stage_layout(inputs, after + 3 + residual_, then_);
  if (write_) {
    for (size_t g = 0; g < G; ++g) {
      const auto& kv = inputs[first_kv + g];
      if (!kv.flags().row_contiguous || kv.data_size() != kv.size()) {
        throw std::runtime_error("[mlxinfer.attend] write_in_place needs each cache in a buffer of its own");
      }
    }
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.dispatch([held = hold(enc, inputs, out), out = mx::array::unsafe_weak_copy(out), in_place = write_,
                offsets = offsets_, H = n_heads_, Hk = n_kv_heads_, scale = scale_, eps = eps_, first_kv, after,
                prefixed = prefix_, gs = out_group_size_, bits = out_bits_, residual = residual_, then = then_]() mutable {
    const int64_t G = offsets.size(), B = held[0].shape(0), L = held[0].shape(1), width = held[0].shape(2);
    const int64_t E = held[first_kv].shape(4);
    std::vector<float> cq, cc, cs, cn, cp, attended;
    const float* qkv = dense(held[0], cq);
    const float* prefix = prefixed ? dense(held[after - 1], cp) : nullptr;
    const int64_t base = prefixed ? held[after - 1].shape(3) : 0;
    const float* cos = dense(held[1], cc);
    const float* sin = dense(held[2], cs);
    const float* nw = first_kv > 3 ? dense(held[3], cn) : nullptr;
    float* y = out.data<float>();
    if (bits) attended.resize(B * L * H * E);
    float* att = bits ? attended.data() : y;
    std::vector<int64_t> firsts(G, 0);  // each cache's first row of qkv
    for (int64_t g = 1; g < G; ++g) firsts[g] = firsts[g - 1] + held[first_kv + g - 1].shape(0);
    auto group = [&](int64_t g) {
      std::vector<float> ckv;
      const mx::array& kv = held[first_kv + g];
      const Shapes d{kv.shape(0), L, H, Hk, E, kv.shape(3), offsets[g], base};
      const float* rows = qkv + firsts[g] * L * width;
      if (in_place) {  // the buffer is this cache's alone (checked above, promised by the caller): written where it lies
        write(d, rows, cos, sin, nullptr, 0.0f, const_cast<float*>(kv.data<float>()));
      }
      attend_all(d, scale, rows, cos, sin, dense(kv, ckv), nw, eps, att + firsts[g] * L * H * E, prefix);
    };
    // caches side by side on the pool's threads, each cache on one of them; else (one cache, or the pool busy)
    // one after another, each one's heads sharing the pool where it is free (attend_all)
    if (G < 2 || !pool().try_run([&](int g) { group(g); }, static_cast<int>(G))) {
      for (int64_t g = 0; g < G; ++g) group(g);
    }
    if (bits) project(held, after, attended.data(), B * L, H * E, gs, bits, residual, then, out);
  });
}

bool Attend::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const Attend&>(other);
  return write_ == o.write_ && prefix_ == o.prefix_ && offsets_ == o.offsets_ && n_heads_ == o.n_heads_ && n_kv_heads_ == o.n_kv_heads_ &&
      scale_ == o.scale_ && eps_ == o.eps_ && norm_ == o.norm_ && out_group_size_ == o.out_group_size_ &&
      out_bits_ == o.out_bits_ && residual_ == o.residual_ && then_ == o.then_;
}

std::vector<mx::Shape> Attend::output_shapes(const std::vector<mx::array>& inputs) {
  const size_t first_kv = 3 + norm_;
  const int width =
      out_bits_ ? inputs[first_kv + offsets_.size() + prefix_].shape(0) : n_heads_ * inputs[first_kv].shape(4);
  return {mx::Shape{inputs[0].shape(0), inputs[0].shape(1), width}};
}

}  // namespace mlxinfer
