// One layer's attention for the new positions as one primitive: RoPE on the queries and keys of the
// fused q/k/v projection, the new keys and values written into the KV cache in place, and causal
// attention of each new query over every cached position. MLX's CPU back end composes the same
// from ~25 nodes (reshapes, transposes, two slice updates, slices, broadcasts, two matmuls, a
// softmax); at a few microseconds a node that was a third of a decode step.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "qmm.h"

namespace mlxinfer {

namespace mx = mlx::core;

// qkv (B, L, (H + 2 Hk) E): each position's H query heads, then Hk key heads, then Hk value heads.
// A layer's cache kv is (B, 2, Hk, capacity, E), keys then values in one buffer, with offset + L <=
// capacity: positions < offset are filled. cos, sin (P, E / 2) with offset + L <= P (non-interleaved
// RoPE, as rope() applies it).
//
// write_cache: kv with positions offset .. offset + L - 1 written (the keys rotated, the values as
// they are), in the input's buffer when nothing else holds it (as MLX's slice update does), else in
// a copy: one single-output node, since MLX cannot donate an input that several sibling outputs hold.
// attend: (B, L, H E), query l (at position offset + l) over positions 0 .. offset + l of the
// written cache; query head h reads key/value head h / (H / Hk). Each (row, head, position) is
// computed alone in a fixed order: a row's bits never depend on B.
// row >= 0: only that row of qkv, for a one-row cache (the server's rows each have their own).
// norm (E,): each key head (write_cache) or query head (attend) RMS-normalized with these weights
// and eps before RoPE, as Qwen3's k_norm and q_norm do (rms_norm's arithmetic).
mx::array write_cache(const mx::array& kv, const mx::array& qkv, const mx::array& cos, const mx::array& sin,
                      int offset, int n_heads, int n_kv_heads, int row = -1,
                      const std::optional<mx::array>& norm = std::nullopt, float eps = 0.0f, mx::StreamOrDevice s = {});
// out_proj (w, scales, biases, group_size, bits): the output projection applied in the same node,
// then + residual when given: (B, L, N), the bits of attend, then linear_chain's one stage and its add.
// then (with out_proj and residual): h = that result, and the node gives h + linear_chain(h, then), the
// bits of the chain as its own node (a decoder layer's MLP: one node fewer a layer).
using OutProj = std::tuple<mx::array, mx::array, mx::array, int, int>;
mx::array attend(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const mx::array& kv,
                 int offset, int n_heads, int n_kv_heads, float scale, int row = -1,
                 const std::optional<mx::array>& norm = std::nullopt, float eps = 0.0f,
                 const std::optional<OutProj>& out_proj = std::nullopt,
                 const std::optional<mx::array>& residual = std::nullopt, const std::vector<StageArgs>& then = {},
                 mx::StreamOrDevice s = {});

// attend for rows that each have a cache of their own (the server's): row r of qkv (A, L, ...) over
// kvs[r] (1, 2, Hk, capacity_r, E) at offsets[r], in one node; each row's bits are those of
// attend(..., row=r), and out_proj / residual apply to all rows at once, as attend's do.
// write_in_place: the node first writes each row's new keys and values into kvs[r] itself, the bits
// write_cache(..., row=r) gives, where one write node a row was (30 x A nodes a step). The caller
// promises that each kvs[r] is float32, row-contiguous and held by nothing that must keep its old
// contents (the server's rows: each row's cache is its own copy, model/rows.py); no head norm.
mx::array attend_rows(const mx::array& qkv, const mx::array& cos, const mx::array& sin,
                      const std::vector<mx::array>& kvs, const std::vector<int>& offsets, int n_heads, int n_kv_heads,
                      float scale,
                      const std::optional<mx::array>& norm = std::nullopt, float eps = 0.0f,
                      const std::optional<OutProj>& out_proj = std::nullopt,
                      const std::optional<mx::array>& residual = std::nullopt, const std::vector<StageArgs>& then = {},
                      bool write_in_place = false, mx::StreamOrDevice s = {});

class AttendRows : public mx::UnaryPrimitive {
 public:
  AttendRows(mx::Stream stream, std::vector<int> offsets, int n_heads, int n_kv_heads, float scale, float eps, bool norm,
             int out_group_size, int out_bits, bool residual, std::vector<Stage> then, bool write)
      : mx::UnaryPrimitive(stream),
        write_(write),
        offsets_(std::move(offsets)),
        n_heads_(n_heads),
        n_kv_heads_(n_kv_heads),
        out_group_size_(out_group_size),
        out_bits_(out_bits),
        scale_(scale),
        eps_(eps),
        norm_(norm),
        residual_(residual),
        then_(std::move(then)) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "MlxinferAttendRows";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  bool write_;
  std::vector<int> offsets_;
  int n_heads_, n_kv_heads_, out_group_size_, out_bits_;
  float scale_, eps_;
  bool norm_, residual_;
  std::vector<Stage> then_;
};

enum class AttendKind { write, attend };

class Attend : public mx::UnaryPrimitive {
 public:
  // norm: a head norm's weight among the inputs; out_group_size/out_bits: an output projection (0: none)
  Attend(mx::Stream stream, AttendKind kind, int offset, int n_heads, int n_kv_heads, float scale, int row, float eps,
         bool norm, int out_group_size = 0, int out_bits = 0, bool residual = false, std::vector<Stage> then = {})
      : mx::UnaryPrimitive(stream),
        kind_(kind),
        offset_(offset),
        n_heads_(n_heads),
        n_kv_heads_(n_kv_heads),
        row_(row),
        out_group_size_(out_group_size),
        out_bits_(out_bits),
        scale_(scale),
        eps_(eps),
        norm_(norm),
        residual_(residual),
        then_(std::move(then)) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return kind_ == AttendKind::attend ? "MlxinferAttend" : "MlxinferWriteCache";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  AttendKind kind_;
  int offset_, n_heads_, n_kv_heads_, row_, out_group_size_, out_bits_;
  float scale_, eps_;
  bool norm_, residual_;
  std::vector<Stage> then_;
};

}  // namespace mlxinfer
