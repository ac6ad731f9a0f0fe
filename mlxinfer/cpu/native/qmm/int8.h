// The int8 path: MLX's 4/8-bit affine weights with the activations rounded to 8 bits per group and
// multiplied as integers (llama.cpp's arithmetic, not the float32 of qmm.cpp). int8.cpp says what stays fixed.
#pragma once

#include <cstdint>
#include <vector>

#include "qmm.h"

namespace mlxinfer {

// A `bits` argument with this flag set names the int8 path's weight layout (repack_int8's), 4 or 8 bits below it.
constexpr int kInt8Layout = 0x100;

inline int value_bits(int bits) {
  return bits & 0xff;
}
inline bool int8_layout(int bits) {
  return (bits & kInt8Layout) != 0;
}

// "AVX-512 VNNI", "AVX2 maddubs" or "portable C++": how this build sums the int8 path's products (the same bits).
const char* int8_isa();

// Whether the int8 path takes K values in groups of group_size at `bits` (4: K a multiple of 64).
bool int8_supports(int64_t K, int group_size, int bits);

// The int8 layout's scales and biases: one a lane of each segment of groups, (N, int8_lanes(K, group_size)),
// from MLX's (N, K / group_size) by int8_lane_groups (a group's value, repeated across the lanes it spans).
int64_t int8_lanes(int64_t K, int group_size);
mx::array lane_groups_array(const mx::array& scales, int64_t K, int group_size);

// w (N, K * bits / 32) in MLX's layout -> the same bytes in the int8 path's layout (out: N * K * bits / 32 words).
void repack_int8(const uint32_t* w, uint32_t* out, int64_t N, int64_t K, int group_size, int bits);

// y (M, sum of N) = x @ W.T for weights in repack_int8's layout: qmm_f32's contract with int8 activations.
void qmm_i8(const float* x, const std::vector<Weight>& weights, ScaleType scale_type, float* y, int64_t M, int64_t K,
            int group_size, int bits, bool reference = false);

// A row of a table in repack_int8's layout (with lane scales and biases) dequantized (dequantize_row's values, read from the other layout).
void dequantize_row_i8(const uint32_t* w, const void* s, const void* b, ScaleType scale_type, float* y, int64_t K,
                       int group_size, int bits);

// The extension's ops: the repacked copy of w, and qmm_i8 alone on arrays (reference: the portable code).
mx::array repack_int8_array(const mx::array& w, int group_size, int bits);
mx::array qmm_i8_array(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                       int group_size, int bits, bool reference);

}  // namespace mlxinfer
