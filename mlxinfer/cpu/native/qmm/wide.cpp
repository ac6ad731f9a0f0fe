// See wide.h.
#include "wide.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

namespace mlxinfer {

namespace {

std::atomic<int> g_wide{-1};  // -1: not decided yet

#if defined(__AVX512F__) && (defined(__x86_64__) || defined(_M_X64))
// ns for 12 independent chains of n FMAs, at 256 or 512 bits (asm: the compiler keeps them in registers), all
template <bool WIDE>
double fma_ns(long n) {
  const auto t = std::chrono::steady_clock::now();
  if constexpr (WIDE) {
    __asm__ volatile(
        "1:\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm0\n vfmadd231ps %%zmm20, %%zmm21, %%zmm1\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm2\n vfmadd231ps %%zmm20, %%zmm21, %%zmm3\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm4\n vfmadd231ps %%zmm20, %%zmm21, %%zmm5\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm6\n vfmadd231ps %%zmm20, %%zmm21, %%zmm7\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm8\n vfmadd231ps %%zmm20, %%zmm21, %%zmm9\n"
        "vfmadd231ps %%zmm20, %%zmm21, %%zmm10\n vfmadd231ps %%zmm20, %%zmm21, %%zmm11\n"
        "dec %0\n jnz 1b\n"
        : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
  } else {
    __asm__ volatile(
        "1:\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm0\n vfmadd231ps %%ymm20, %%ymm21, %%ymm1\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm2\n vfmadd231ps %%ymm20, %%ymm21, %%ymm3\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm4\n vfmadd231ps %%ymm20, %%ymm21, %%ymm5\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm6\n vfmadd231ps %%ymm20, %%ymm21, %%ymm7\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm8\n vfmadd231ps %%ymm20, %%ymm21, %%ymm9\n"
        "vfmadd231ps %%ymm20, %%ymm21, %%ymm10\n vfmadd231ps %%ymm20, %%ymm21, %%ymm11\n"
        "dec %0\n jnz 1b\n"
        : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
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

}  // namespace

bool wide_tiles() {
  int w = g_wide.load(std::memory_order_relaxed);
  if (w < 0) {
    const char* env = std::getenv("MLXINFER_QMM_WIDE");
    const bool on = env && *env ? env[0] == '1' : measure();
#if !defined(__AVX512F__)
    w = 0;
    (void)on;
#else
    w = on ? 1 : 0;
#endif
    g_wide.store(w, std::memory_order_relaxed);
  }
  return w == 1;
}

void set_wide_tiles(bool on) {
#if defined(__AVX512F__)
  g_wide.store(on ? 1 : 0, std::memory_order_relaxed);
#else
  (void)on;
#endif
}

}  // namespace mlxinfer
