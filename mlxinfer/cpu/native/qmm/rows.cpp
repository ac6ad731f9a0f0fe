// See rows.h. Built with qmm.cpp into the same extension, with the same flags (-ffp-contract=off).
#include "rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "pool.h"
#include "simd.h"


namespace mlxinfer {

void swiglu_row(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
#ifdef MLXINFER_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) y[i] = g[i] / (1.0f + exp_scalar(-g[i])) * u[i];
}

namespace {

// y = x - log(sum(e^x)) over one row: the max, then e^(x - max) summed in order, eight lanes at a time
void log_softmax_row(const float* x, float* y, int64_t n) {
  float top = -INFINITY;  // the max ignoring NaN, as fmax (which the compiler left a libm call per value)
  int64_t j = 0;
#ifdef MLXINFER_AVX2
  __m256 lanes_max = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= n; j += 8) lanes_max = _mm256_max_ps(_mm256_loadu_ps(x + j), lanes_max);  // NaN: keeps the lane
  alignas(32) float m8[8];
  _mm256_store_ps(m8, lanes_max);
  for (float m : m8) top = m > top ? m : top;
#endif
  for (; j < n; ++j) top = x[j] > top ? x[j] : top;
  if (top == -INFINITY) {  // nothing is possible: every score stays -inf
    for (int64_t i = 0; i < n; ++i) y[i] = -INFINITY;
    return;
  }
  // summed in float64 (49k terms in float32 lanes drifted by ~1e-5 in the log)
  int64_t i = 0;
  double total = 0.0;
#ifdef MLXINFER_AVX2
  const __m256 tv = _mm256_set1_ps(top);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    // a -inf score (a masked token) adds exactly nothing, not the clamped exp's e^-87
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(v, tv)), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) total += x[i] == -INFINITY ? 0.0 : static_cast<double>(exp_scalar(x[i] - top));
  const float lse = static_cast<float>(static_cast<double>(top) + std::log(total));
  for (i = 0; i < n; ++i) y[i] = x[i] - lse;
}


// The cut both sampler nodes make: tokens taken in order of `key` (smallest first, ties by index), each while
// the mass taken before it is below `target`, at least `least` of them; returns the largest key taken, so a
// token stays when its key is at most that (every tie of the last one too). It sorts only the first m
// tokens by key, m = 64 widened 4x at a time until the taken ones end inside them.
double cut_key(const std::vector<double>& key, const std::vector<double>& mass, double target, int64_t least) {
  const int64_t n = static_cast<int64_t>(key.size());
  std::vector<int64_t> order(n);
  // a NaN key (NaN scores: the engine reports them after the draw) sorts last, so the order stays a strict one
  auto at = [&](int64_t i) { return std::isnan(key[i]) ? INFINITY : key[i]; };
  auto before = [&](int64_t a, int64_t b) { return at(a) < at(b) || (at(a) == at(b) && a < b); };
  for (int64_t m = std::min<int64_t>(64, n);; m = std::min<int64_t>(4 * m, n)) {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::nth_element(order.begin(), order.begin() + (m - 1), order.end(), before);
    std::sort(order.begin(), order.begin() + m, before);
    double taken = 0.0;
    int64_t k = 0;
    while (k < m && (taken < target || k < least)) taken += mass[order[k++]];
    if (k < m || m == n) return at(order[k - 1]);
  }
}

// top_p over one row of n log-probabilities (rows.h): the highest first, the mass e**x against p * its sum
void top_p_row(const float* x, float* y, int64_t n, float p, int keep) {
  std::vector<double> key(n), mass(n);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    key[i] = -static_cast<double>(x[i]);  // +inf for a token an earlier cut removed: last
    mass[i] = x[i] == -INFINITY ? 0.0 : static_cast<double>(exp_scalar(x[i]));
    total += mass[i];
  }
  const double threshold = cut_key(key, mass, static_cast<double>(p) * total, std::min<int64_t>(std::max(keep, 1), n));
  for (int64_t i = 0; i < n; ++i) y[i] = key[i] > threshold ? -INFINITY : x[i];
}

// typical_p over one row of n log-probabilities (rows.h): the nearest to the entropy first, the probabilities
// against p
void typical_p_row(const float* x, float* y, int64_t n, float p, int keep) {
  double top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, static_cast<double>(x[i]));
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += x[i] == -INFINITY ? 0.0 : std::exp(static_cast<double>(x[i]) - top);
  const double lse = top + std::log(total);
  std::vector<double> prob(n), dist(n);
  double entropy = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double lp = static_cast<double>(x[i]) - lse;
    prob[i] = x[i] == -INFINITY ? 0.0 : std::exp(lp);
    if (prob[i] > 0.0) entropy -= prob[i] * lp;
  }
  for (int64_t i = 0; i < n; ++i) dist[i] = x[i] == -INFINITY ? INFINITY : std::fabs(-(static_cast<double>(x[i]) - lse) - entropy);
  const double threshold = cut_key(dist, prob, p, std::min<int64_t>(std::max(keep, 1), n));
  for (int64_t i = 0; i < n; ++i) y[i] = dist[i] > threshold ? -INFINITY : x[i];
}

// top_k over one row (rows.h): the k-th highest score from a min-heap of the k highest seen, then every token
// at least as high (ties of the k-th kept, as transformers' top-k keeps them); one pass, no sort of the row
void top_k_row(const float* x, float* y, int64_t n, int64_t k) {
  std::vector<float> heap;
  heap.reserve(k);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;  // kept as it is, as top_p keeps it: the engine reports NaN scores
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(x[i]);
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    } else if (x[i] > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = x[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  }
  const float least = static_cast<int64_t>(heap.size()) < k ? -INFINITY : heap.front();
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] >= least || std::isnan(x[i]) ? x[i] : -INFINITY;
}

// softmax over one row: log_softmax_row, then e**y with the same exp, exactly 0 where y is -inf
void softmax_row(const float* x, float* y, int64_t n) {
  log_softmax_row(x, y, n);
  int64_t i = 0;
#ifdef MLXINFER_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(y + i);
    _mm256_storeu_ps(y + i, _mm256_and_ps(exp8(v), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ)));
  }
#endif
  for (; i < n; ++i) y[i] = y[i] == -INFINITY ? 0.0f : exp_scalar(y[i]);
}

}  // namespace

mx::Stream cpu_stream(mx::StreamOrDevice s, const char* error) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device.type != mx::Device::cpu) throw std::invalid_argument(error);
  return stream;
}

std::vector<mx::array> hold(mx::cpu::CommandEncoder& enc, const std::vector<mx::array>& inputs, mx::array& out) {
  std::vector<mx::array> held;
  for (const auto& a : inputs) {
    enc.set_input_array(a);
    held.push_back(mx::array::unsafe_weak_copy(a));
  }
  enc.set_output_array(out);
  return held;
}

void CpuPrimitive::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error(std::string("[mlxinfer] ") + name() + " has no GPU implementation");
}

void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float r = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t k = 0; k < n; ++k) y[k] = (x[k] * r) * w[k];
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s);
  if (x.ndim() < 1 || weight.ndim() != 1 || weight.shape(0) != x.shape(-1)) {
    throw std::invalid_argument("[mlxinfer.rms_norm] weight must be 1-D with x's last dimension");
  }
  return mx::array(
      x.shape(), mx::float32, std::make_shared<RowOp>(stream, RowKind::rms_norm, eps), {f32(x, stream), f32(weight, stream)});
}

mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s);
  if (gate.shape() != up.shape()) {
    throw std::invalid_argument("[mlxinfer.swiglu] gate and up must have one shape");
  }
  return mx::array(
      gate.shape(), mx::float32, std::make_shared<RowOp>(stream, RowKind::swiglu, 0.0f), {f32(gate, stream), f32(up, stream)});
}

namespace {

// A node of one row op on x alone (..., V), `ok` its other arguments checked (`needs` says what they must be).
mx::array one_input(const char* name, RowKind kind, const mx::array& x, bool ok, const char* needs, float eps,
                    int offset, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s);
  if (x.ndim() < 1 || !ok) throw std::invalid_argument(std::string("[mlxinfer.") + name + "] x needs " + needs);
  return mx::array(x.shape(), mx::float32, std::make_shared<RowOp>(stream, kind, eps, offset), {f32(x, stream)});
}

// A sampler cut's node (top_p, typical_p): p in (0, 1] and the floor of kept tokens checked.
mx::array cut_node(const char* name, RowKind kind, const mx::array& x, float p, int keep, mx::StreamOrDevice s) {
  return one_input(name, kind, x, p > 0.0f && p <= 1.0f && keep >= 0,
                   "at least one dimension, p in (0, 1], min_tokens_to_keep >= 0", p, keep, s);
}

}  // namespace

mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s) {
  return one_input("log_softmax", RowKind::log_softmax, x, true, "at least one dimension", 0.0f, 0, s);
}

mx::array softmax(const mx::array& x, mx::StreamOrDevice s) {
  return one_input("softmax", RowKind::softmax, x, true, "at least one dimension", 0.0f, 0, s);
}

mx::array top_k(const mx::array& x, int k, mx::StreamOrDevice s) {
  return one_input("top_k", RowKind::top_k, x, k >= 1, "at least one dimension, k >= 1", 0.0f, k, s);
}

mx::array top_p(const mx::array& x, float p, int min_tokens_to_keep, mx::StreamOrDevice s) {
  return cut_node("top_p", RowKind::top_p, x, p, min_tokens_to_keep, s);
}

mx::array typical_p(const mx::array& x, float p, int min_tokens_to_keep, mx::StreamOrDevice s) {
  return cut_node("typical_p", RowKind::typical_p, x, p, min_tokens_to_keep, s);
}

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin, int offset, mx::StreamOrDevice s) {
  auto stream = cpu_stream(s);
  if (x.ndim() < 2 || x.shape(-1) % 2 || cos.ndim() != 2 || cos.shape() != sin.shape() ||
      cos.shape(1) * 2 != x.shape(-1) || offset < 0 || offset + x.shape(-2) > cos.shape(0)) {
    throw std::invalid_argument("[mlxinfer.rope] x (..., L, E) needs cos and sin tables (>= offset + L, E / 2)");
  }
  return mx::array(
      x.shape(),
      mx::float32,
      std::make_shared<RowOp>(stream, RowKind::rope, 0.0f, offset),
      {f32(x, stream), f32(cos, stream), f32(sin, stream)});
}

void rope_rows(const float* x, const float* cos, const float* sin, float* y, int64_t rows, int64_t L, int64_t E,
               int offset) {
  const int64_t half = E / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = offset + r % L;
    rotate(x + r * E, cos + pos * half, sin + pos * half, y + r * E, E);
  }
}

void RowOp::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.dispatch([in = hold(enc, inputs, out), out = mx::array::unsafe_weak_copy(out), kind = kind_, eps = eps_,
                offset = offset_]() mutable {
    std::vector<std::vector<float>> copies(in.size());
    std::vector<const float*> p;
    for (size_t i = 0; i < in.size(); ++i) p.push_back(dense(in[i], copies[i]));
    float* y = out.data<float>();
    const int64_t n = out.ndim() ? out.shape(-1) : 1;
    const int64_t rows = n ? static_cast<int64_t>(out.size()) / n : 0;
    if (kind == RowKind::rope) {
      return rope_rows(p[0], p[1], p[2], y, rows, in[0].shape(-2), n, offset);
    }
    for_rows(rows, kind == RowKind::rms_norm ? n : 8 * n, [&](int64_t r0, int64_t r1) {  // an exp: ~8 plain ops
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = p[0] + r * n;
        float* yr = y + r * n;
        switch (kind) {
          case RowKind::rms_norm: rms_norm_row(x, p[1], yr, n, eps); break;
          case RowKind::swiglu: swiglu_row(x, p[1] + r * n, yr, n); break;
          case RowKind::log_softmax: log_softmax_row(x, yr, n); break;
          case RowKind::softmax: softmax_row(x, yr, n); break;
          case RowKind::top_k: top_k_row(x, yr, n, offset); break;
          case RowKind::top_p: top_p_row(x, yr, n, eps, offset); break;
          case RowKind::typical_p: typical_p_row(x, yr, n, eps, offset); break;
          case RowKind::rope: break;
        }
      }
    });
  });
}

bool RowOp::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RowOp&>(other);
  return kind_ == o.kind_ && eps_ == o.eps_ && offset_ == o.offset_;
}

}  // namespace mlxinfer
