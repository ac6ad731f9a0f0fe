// The arithmetic under attention.h's primitives, on host pointers (attend_math.cpp).
#pragma once

#include <cstdint>

namespace mlxinfer {

// B rows of L new positions each, H query heads over Hk key/value heads of E values, a cache of cap
// positions of which offset are filled. base: the first `base` positions are a prefix every row shares,
// (1, 2, Hk, base, E), and the cache's slot s holds position base + s.
struct Shapes {
  int64_t B, L, H, Hk, E, cap, offset;
  int64_t base = 0;
};

// The new positions' keys (rotated, after the head norm when given) and values into kv
// (B, 2, Hk, cap, E); qkv is (B, L, (H + 2 Hk) E).
void write(const Shapes& d, const float* qkv, const float* cos, const float* sin, const float* norm, float eps,
           float* kv);

// out (B, L, H E): each (row, head, new position) alone over the written cache (after the shared prefix,
// when d.base), in a fixed order, on the pool's threads when the work is large enough (which thread
// computes a unit never changes it, nor does where a position is held).
void attend_all(const Shapes& d, float scale, const float* qkv, const float* cos, const float* sin, const float* kv,
                const float* norm, float eps, float* out, const float* prefix = nullptr);

}  // namespace mlxinfer
