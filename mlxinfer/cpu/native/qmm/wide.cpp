// See wide.h.
#include "wide.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>

namespace mlxinfer {

namespace {

std::atomic<int> g_wide{-1};  // -1: not decided yet

#if defined(__AVX512F__) && (defined(__x86_64__) || defined(_M_X64))
// ns for 12 independent chains of n FMAs, at 256 or 512 bits (asm: the compiler keeps them in registers), all
// on zeros: 0 * 0 + 0 stays 0, so no denormal or NaN slow path times in (vpxord: AVX-512F, and VL for ymm16-31)
template <bool WIDE>
double fma_ns(long n) {
  const auto t = std::chrono::steady_clock::now();
  if constexpr (WIDE) {
    __asm__ volatile(
        "vpxord %%zmm0, %%zmm0, %%zmm0\n vpxord %%zmm1, %%zmm1, %%zmm1\n vpxord %%zmm2, %%zmm2, %%zmm2\n vpxord %%zmm3, %%zmm3, %%zmm3\n"
        "vpxord %%zmm4, %%zmm4, %%zmm4\n vpxord %%zmm5, %%zmm5, %%zmm5\n vpxord %%zmm6, %%zmm6, %%zmm6\n vpxord %%zmm7, %%zmm7, %%zmm7\n"
        "vpxord %%zmm8, %%zmm8, %%zmm8\n vpxord %%zmm9, %%zmm9, %%zmm9\n vpxord %%zmm10, %%zmm10, %%zmm10\n vpxord %%zmm11, %%zmm11, %%zmm11\n"
        "vpxord %%zmm20, %%zmm20, %%zmm20\n vpxord %%zmm21, %%zmm21, %%zmm21\n"
        "1:\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm0\n vfmadd231ps %%zmm20, %%zmm21, %%zmm1\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm2\n vfmadd231ps %%zmm20, %%zmm21, %%zmm3\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm4\n vfmadd231ps %%zmm20, %%zmm21, %%zmm5\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm6\n vfmadd231ps %%zmm20, %%zmm21, %%zmm7\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm8\n vfmadd231ps %%zmm20, %%zmm21, %%zmm9\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm10\n vfmadd231ps %%zmm20, %%zmm21, %%zmm11\n"
        "dec %0\n jnz 1b\n"
        : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm20", "xmm21");
  } else {
    __asm__ volatile(
        "vpxord %%ymm0, %%ymm0, %%ymm0\n vpxord %%ymm1, %%ymm1, %%ymm1\n vpxord %%ymm2, %%ymm2, %%ymm2\n vpxord %%ymm3, %%ymm3, %%ymm3\n"
        "vpxord %%ymm4, %%ymm4, %%ymm4\n vpxord %%ymm5, %%ymm5, %%ymm5\n vpxord %%ymm6, %%ymm6, %%ymm6\n vpxord %%ymm7, %%ymm7, %%ymm7\n"
        "vpxord %%ymm8, %%ymm8, %%ymm8\n vpxord %%ymm9, %%ymm9, %%ymm9\n vpxord %%ymm10, %%ymm10, %%ymm10\n vpxord %%ymm11, %%ymm11, %%ymm11\n"
        "vpxord %%ymm20, %%ymm20, %%ymm20\n vpxord %%ymm21, %%ymm21, %%ymm21\n"
        "1:\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm0\n vfmadd231ps %%ymm20, %%ymm21, %%ymm1\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm2\n vfmadd231ps %%ymm20, %%ymm21, %%ymm3\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm4\n vfmadd231ps %%ymm20, %%ymm21, %%ymm5\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm6\n vfmadd231ps %%ymm20, %%ymm21, %%ymm7\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm8\n vfmadd231ps %%ymm20, %%ymm21, %%ymm9\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm10\n vfmadd231ps %%ymm20, %%ymm21, %%ymm11\n"
        "dec %0\n jnz 1b\n"
        : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm20", "xmm21");
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count();
}

bool measure() {
  double narrow = 1e30, wide = 1e30;
  for (int i = 0; i < 5; ++i) {  // interleaved, the fastest of each: a busy core only slows a run down
    narrow = std::min(narrow, fma_ns<false>(20000));
    wide = std::min(wide, fma_ns<true>(20000));
  }
  return wide < 1.5 * narrow;
}
#else
bool measure() {
  return false;
}
#endif

#if defined(__AVX512F__)
constexpr bool kBuilt = true;  // this build has the 512-bit tiles
#else
constexpr bool kBuilt = false;
#endif

}  // namespace

bool wide_tiles() {
  int w = g_wide.load(std::memory_order_relaxed);
  if (w < 0) {
    const char* set = std::getenv("MLXINFER_QMM_WIDE");
    const std::string env = set ? set : "";
    const bool yes = env == "1" || env == "on" || env == "true", no = env == "0" || env == "off" || env == "false";
    w = kBuilt && (yes || (!no && measure())) ? 1 : 0;  // any other value: as if unset
    g_wide.store(w, std::memory_order_relaxed);
  }
  return w == 1;
}

void set_wide_tiles(bool on) {
  g_wide.store(kBuilt && on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace mlxinfer
