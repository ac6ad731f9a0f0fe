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
// A cache kv is (C, 2, Hk, capacity, E), keys then values in one buffer, for C rows of qkv, with
// offset + L <= capacity: positions < offset are filled. cos, sin (P, E / 2) with offset + L <= P
// (non-interleaved RoPE, as rope() applies it).
//
// write_cache: kv with positions offset .. offset + L - 1 of qkv's rows first .. first + C - 1 written
// (the keys rotated, the values as they are), in the input's buffer when nothing else holds it (as
// MLX's slice update does), else in a copy: one single-output node, since MLX cannot donate an input
// that several sibling outputs hold.
// norm (E,): each key head (write_cache) or query head (attend) RMS-normalized with these weights
// and eps before RoPE, as Qwen3's k_norm and q_norm do (rms_norm's arithmetic).
// base: the cache's slot 0 holds position base (the positions before it are a prefix held elsewhere).
mx::array write_cache(const mx::array& kv, const mx::array& qkv, const mx::array& cos, const mx::array& sin,
                      int offset, int n_heads, int n_kv_heads, int first = 0,
                      const std::optional<mx::array>& norm = std::nullopt, float eps = 0.0f, int base = 0,
                      mx::StreamOrDevice s = {});

// attend: (B, L, H E), causal attention of the new positions' queries over the written caches, in one
// node. The caches kvs[g] at offsets[g] hold qkv's rows in order: one cache for a batch that shares
// its length, or one a row for ragged rows (the server's, each its own length). Query l of a row (at
// position offset + l) reads positions 0 .. offset + l of its cache; query head h reads key/value
// head h / (H / Hk). Each (row, head, position) is computed alone in a fixed order: a row's bits
// never depend on the other rows, nor on how they are grouped into caches.
// out_proj (w, scales, biases, group_size, bits): the output projection applied in the same node,
// then + residual when given: (B, L, N), the bits of attend, then linear_chain's one stage and its add.
// then (with out_proj and residual): h = that result, and the node gives h + linear_chain(h, then), the
// bits of the chain as its own node (a decoder layer's MLP: one node fewer a layer).
// write_in_place: the node first writes the new keys and values into each kvs[g] itself, the bits
// write_cache gives, where one write node a cache was (30 x A nodes a step for ragged rows). The
// caller promises that each kvs[g] is float32, row-contiguous and held by nothing that must keep its
// old contents (the server's rows: each row's cache is its own copy, model/ragged.py); no head norm.
// prefix (1, 2, n_kv_heads, base, E): positions 0 .. base - 1 of every row, shared (the prompt of the exact
// answers' paths); each cache's slot s then holds position base + s. A row's bits are the same either way.
using OutProj = std::tuple<mx::array, mx::array, mx::array, int, int>;
mx::array attend(const mx::array& qkv, const mx::array& cos, const mx::array& sin, const std::vector<mx::array>& kvs,
                 const std::vector<int>& offsets, int n_heads, int n_kv_heads, float scale,
                 const std::optional<mx::array>& norm = std::nullopt, float eps = 0.0f,
                 const std::optional<OutProj>& out_proj = std::nullopt,
                 const std::optional<mx::array>& residual = std::nullopt, const std::vector<StageArgs>& then = {},
                 bool write_in_place = false, const std::optional<mx::array>& prefix = std::nullopt,
                 mx::StreamOrDevice s = {});

class Attend : public CpuPrimitive {
 public:
  // norm: a head norm's weight among the inputs; out_group_size/out_bits: an output projection (0: none)
  Attend(mx::Stream stream, std::vector<int> offsets, int n_heads, int n_kv_heads, float scale, float eps, bool norm,
         int out_group_size, int out_bits, bool residual, std::vector<Stage> then, bool write, bool prefix)
      : CpuPrimitive(stream),
        write_(write),
        prefix_(prefix),
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
  const char* name() const override {
    return "MlxinferAttend";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  bool write_, prefix_;
  std::vector<int> offsets_;
  int n_heads_, n_kv_heads_, out_group_size_, out_bits_;
  float scale_, eps_;
  bool norm_, residual_;
  std::vector<Stage> then_;
};

class WriteCache : public CpuPrimitive {
 public:
  WriteCache(mx::Stream stream, int offset, int n_heads, int n_kv_heads, int first, float eps, bool norm, int base)
      : CpuPrimitive(stream),
        base_(base),
        offset_(offset),
        n_heads_(n_heads),
        n_kv_heads_(n_kv_heads),
        first_(first),
        eps_(eps),
        norm_(norm) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "MlxinferWriteCache";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int base_, offset_, n_heads_, n_kv_heads_, first_;
  float eps_;
  bool norm_;
};

}  // namespace mlxinfer
