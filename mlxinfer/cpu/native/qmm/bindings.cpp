// The Python module mlxinfer/cpu/qmm.py loads: the op, and what the build holds.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "attention.h"
#include "int8.h"
#include "qmm.h"
#include "rows.h"
#include "wide.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using mlxinfer::linear_chain, mlxinfer::StageArgs;
using namespace nb::literals;

NB_MODULE(_mlxinfer_qmm, m) {
  m.doc() = "mlxinfer's batch-invariant CPU quantized matmul (float32 activations)";
  // y = x @ dequantize(w, scales, biases).T as mx.quantized_matmul(..., transpose=True) computes it, x (..., K) in
  // float32 (other float dtypes are cast), scales and biases in float32, float16 or bfloat16: a one-stage chain.
  m.def("quantized_matmul", [](const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                               int group_size, int bits, mx::StreamOrDevice s) {
    return linear_chain(x, {StageArgs{"", std::nullopt, 0.0f, {w}, {scales}, {biases}, group_size, bits}}, {}, s);
  }, "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x @ dequantize(w, scales, biases).T with float32 arithmetic (MLX's affine layout, transpose=True)");
  m.def(
      "linear_chain",
      &mlxinfer::linear_chain,
      "x"_a,
      "stages"_a,
      "residual"_a = nb::none(),
      nb::kw_only(),
      "stream"_a = nb::none(),
      "quantized matmuls in a row as one node: per stage (prologue '' | 'rms_norm' | 'swiglu_halves', norm weight "
      "or None, eps, ws, scales, biases, group_size, bits), each stage's output the next one's input, then + residual");
  m.def("dequantize_rows", &mlxinfer::dequantize_rows, "ids"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a,
        "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "the rows ids of a quantized table dequantized in float32 (an embedding lookup): (..., K)");
  m.def("write_cache", &mlxinfer::write_cache, "kv"_a, "qkv"_a, "cos"_a, "sin"_a, "offset"_a, "n_heads"_a,
        "n_kv_heads"_a, "first"_a = 0, "norm"_a = nb::none(), "eps"_a = 0.0f, nb::kw_only(), "base"_a = 0,
        "stream"_a = nb::none(),
        "the KV cache (C, 2, Hk, capacity, E) of qkv's rows first .. first + C - 1 with the new positions' keys "
        "(rotated) and values written, in place where it can be; base: slot 0 holds position base");
  m.def("attend", &mlxinfer::attend, "qkv"_a, "cos"_a, "sin"_a, "kvs"_a, "offsets"_a, "n_heads"_a, "n_kv_heads"_a,
        "scale"_a, "norm"_a = nb::none(), "eps"_a = 0.0f, nb::kw_only(), "out_proj"_a = nb::none(),
        "residual"_a = nb::none(), "then"_a = std::vector<mlxinfer::StageArgs>{}, "write_in_place"_a = false,
        "prefix"_a = nb::none(), "stream"_a = nb::none(),
        "causal attention of the new positions' queries (rotated) over the written caches (kvs[g] at offsets[g], "
        "holding qkv's rows in order): (B, L, H E); with out_proj (w, scales, biases, group_size, bits) projected "
        "in the same node, then + residual; with then (linear_chain's stages), h = that and the node gives h + "
        "linear_chain(h, then); with write_in_place, the new keys and values are first written into kvs[g] itself; "
        "with prefix (1, 2, n_kv_heads, base, E), positions below base are that, shared by every row");
  m.def("log_softmax", &mlxinfer::log_softmax, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x - logsumexp(x) over the last axis, float32, one primitive");
  m.def("softmax", &mlxinfer::softmax, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "e**log_softmax(x) over the last axis with the kernel's exp, float32, one primitive");
  m.def("top_k", &mlxinfer::top_k, "x"_a, "k"_a, nb::kw_only(), "stream"_a = nb::none(),
        "the top-k cut over the last axis (ties of the k-th kept; sampler apply_top_k's rule), one primitive");
  m.def("top_p", &mlxinfer::top_p, "x"_a, "p"_a, "min_tokens_to_keep"_a = 1, nb::kw_only(), "stream"_a = nb::none(),
        "the nucleus cut of log-probabilities over the last axis (sampler apply_top_p's rule), float32, one primitive");
  m.def("typical_p", &mlxinfer::typical_p, "x"_a, "p"_a, "min_tokens_to_keep"_a = 1, nb::kw_only(),
        "stream"_a = nb::none(),
        "locally typical sampling's cut of log-probabilities over the last axis (apply_typical_p's rule), one primitive");
  m.def("rms_norm", &mlxinfer::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
        "x * rsqrt(mean(x^2) + eps) * weight over the last axis, float32, one primitive");
  m.def("swiglu", &mlxinfer::swiglu, "gate"_a, "up"_a, nb::kw_only(), "stream"_a = nb::none(),
        "silu(gate) * up in float32, one primitive");
  m.def("rope", &mlxinfer::rope, "x"_a, "cos"_a, "sin"_a, "offset"_a, nb::kw_only(), "stream"_a = nb::none(),
        "non-interleaved RoPE from cos/sin tables, float32, one primitive");
  m.def("repack_int8", &mlxinfer::repack_int8_array, "w"_a, "group_size"_a, "bits"_a,
        "w (MLX's affine layout) in the int8 path's layout, the same shape and bytes (int8.cpp); its matmuls take "
        "bits | int8_flag()");
  m.def("qmm_int8", &mlxinfer::qmm_i8_array, "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
        "reference"_a = false,
        "x (M, K) @ W.T for w in repack_int8's layout, evaluated now; reference: the portable code, value by value");
  m.def("int8_lane_groups", &mlxinfer::lane_groups_array, "scales"_a, "K"_a, "group_size"_a,
        "scales or biases (N, K / group_size) as the int8 layout's lanes (N, int8_lanes(K, group_size))");
  m.def("int8_lanes", &mlxinfer::int8_lanes, "K"_a, "group_size"_a);
  m.def("int8_flag", [] { return mlxinfer::kInt8Layout; });
  m.def("int8_isa", &mlxinfer::int8_isa, "How this build sums the int8 path's products: VNNI, AVX2 or portable C++");
  m.def("int8_supports", &mlxinfer::int8_supports, "K"_a, "group_size"_a, "bits"_a);
  m.def("abi", [] { return mlxinfer::QMM_ABI; });
  m.def("avx2", &mlxinfer::compiled_with_avx2, "Whether this build runs the AVX2+FMA kernel");
  m.def("tile", &mlxinfer::tile_shape, "The several-row tiles' shape, rows x columns");
  m.def("wide", &mlxinfer::wide_tiles, "Whether the several-row tiles run 512-bit (wide.h; the same bits)");
  m.def("set_wide", &mlxinfer::set_wide_tiles, "on"_a, "Run the several-row tiles 512-bit or not (tests)");
  m.def("threads", &mlxinfer::thread_count, "Threads that share the output columns");
}
