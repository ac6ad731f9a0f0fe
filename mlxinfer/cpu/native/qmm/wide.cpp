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
// The loop for registers named R ("zmm" or "ymm"): zero 0-11, 20 and 21, then n times 0-11 += 20 * 21
#define MLXINFER_ZERO2(R, a, b) "vpxord %%" R #a ", %%" R #a ", %%" R #a "\n vpxord %%" R #b ", %%" R #b ", %%" R #b "\n"
#define MLXINFER_FMA2(R, a, b) "vfmadd231ps %%" R "20, %%" R "21, %%" R #a "\n vfmadd231ps %%" R "20, %%" R "21, %%" R #b "\n"
#define MLXINFER_FMA_LOOP(R)                                                                                        \
  MLXINFER_ZERO2(R, 0, 1) MLXINFER_ZERO2(R, 2, 3) MLXINFER_ZERO2(R, 4, 5) MLXINFER_ZERO2(R, 6, 7) MLXINFER_ZERO2(R, 8, 9) \
  MLXINFER_ZERO2(R, 10, 11) MLXINFER_ZERO2(R, 20, 21) "1:\n" MLXINFER_FMA2(R, 0, 1) MLXINFER_FMA2(R, 2, 3)            \
  MLXINFER_FMA2(R, 4, 5) MLXINFER_FMA2(R, 6, 7) MLXINFER_FMA2(R, 8, 9) MLXINFER_FMA2(R, 10, 11) "dec %0\n jnz 1b\n"
#define MLXINFER_FMA_CLOBBERS \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm20", "xmm21"
template <bool WIDE>
double fma_ns(long n) {
  const auto t = std::chrono::steady_clock::now();
  if constexpr (WIDE) {
    __asm__ volatile(MLXINFER_FMA_LOOP("zmm") : "+r"(n)::MLXINFER_FMA_CLOBBERS);
  } else {
    __asm__ volatile(MLXINFER_FMA_LOOP("ymm") : "+r"(n)::MLXINFER_FMA_CLOBBERS);
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
