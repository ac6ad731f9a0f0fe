// The arithmetic under attention.h's primitives, on host pointers (attend_math.cpp).
#pragma once

#include <cstdint>

namespace mlxinfer {

// B rows of L new positions each, H query heads over Hk key/value heads of E values, a cache of cap
// positions of which offset are filled.
struct Shapes {
  int64_t B, L, H, Hk, E, cap, offset;
};

// The new positions' keys (rotated, after the head norm when given) and values into kv
// (B, 2, Hk, cap, E); qkv is (B, L, (H + 2 Hk) E).
void write(const Shapes& d, const float* qkv, const float* cos, const float* sin, const float* norm, float eps,
           float* kv);

// out (B, L, H E): each (row, head, new position) alone over the written cache, in a fixed order, on
// the pool's threads when the work is large enough (which thread computes a unit never changes it).
void attend_all(const Shapes& d, float scale, const float* qkv, const float* cos, const float* sin, const float* kv,
                const float* norm, float eps, float* out);

}  // namespace mlxinfer
