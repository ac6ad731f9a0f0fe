// Scales and biases as the kernel reads them: in their stored dtype (float32, float16 or bfloat16),
// widened to float32 exactly as they are used, so a float16 checkpoint streams half the scale bytes a
// float32 copy would. The tags name the stored type for the kernel's templates (qmm.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "simd.h"

namespace mlxinfer {

struct F32 {
  using T = float;
};
struct F16 {
  using T = uint16_t;
};
struct BF16 {
  using T = uint16_t;
};

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float widen(F32, float v) {
  return v;
}
inline float widen(F16, uint16_t v) {
#ifdef MLXINFER_AVX2
  return _cvtsh_ss(v);  // F16C: the same exact widening, one instruction
#else
  return half_to_float(v);
#endif
}
inline float widen(BF16, uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace mlxinfer
