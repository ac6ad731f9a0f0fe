// The kernel's threads: a fixed set of workers that share a call's chunks of output columns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace mlxinfer {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_ia32_pause();
#endif
}

// A fixed set of workers that share a call's chunks of columns with the caller. Chunks are claimed
// from one atomic ticket (generation << 32 | next chunk), so a worker that is late or descheduled
// (a busy machine) only means the caller computes more chunks itself: which thread computes a chunk
// never changes its arithmetic. Workers spin briefly between calls (a decode step calls the kernel
// ~200 times, microseconds apart), then sleep on a futex, so an idle process costs nothing.
class Pool {
 public:
  explicit Pool(int n);
  int size() const {
    return n_;
  }
  // run(fn, chunks) where no other call holds the pool (true), else nothing (false: the caller runs them itself)
  bool try_run(const std::function<void(int)>& fn, int chunks) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (lock.owns_lock()) run(fn, chunks);
    return lock.owns_lock();
  }
  // fn(0 .. chunks-1), each exactly once, on the caller and the workers; returns when all are done.
  void run(const std::function<void(int)>& fn, int chunks) {
    const uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
    Slot& slot = slots_[gen & 1];
    slot.fn.store(&fn, std::memory_order_relaxed);
    slot.chunks.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    ticket_.store(gen << 32, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    wake_.notify_all();
    participate();
    for (int spins = 0; done_.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < 4096) {
        cpu_relax();
      } else {
        std::this_thread::yield();  // a worker holds a chunk but has lost its core
      }
    }
  }

 private:
  struct Slot {
    std::atomic<const std::function<void(int)>*> fn{nullptr};
    std::atomic<int> chunks{0};
  };

  void participate() {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const Slot& slot = slots_[(t >> 32) & 1];
      const auto* fn = slot.fn.load(std::memory_order_relaxed);
      const int64_t chunks = slot.chunks.load(std::memory_order_relaxed);
      const int64_t i = static_cast<int64_t>(t & 0xffffffffu);
      if (i >= chunks) return;
      // the claim succeeds only while the ticket still names this generation, so fn is still alive
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        (*fn)(static_cast<int>(i));
        done_.fetch_add(1, std::memory_order_release);
        t = ticket_.load(std::memory_order_acquire);
      }
    }
  }

  void work();

  int n_;
  Slot slots_[2];
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> done_{0};
  std::atomic<uint32_t> wake_{0};
  std::mutex busy_;
};

// The process's pool (its size: the cores this process may use, or MLXINFER_QMM_THREADS), made at
// first use and again in a child after fork.
Pool& pool();

// fn(r0, r1) over rows [0, M) in chunks on the pool's threads where the pool is free and the rows are
// worth waking it for (work: values a row touches), else fn(0, M) here. A row's result depends on that
// row alone, so how the rows are split never changes a bit. A batch's row ops (activations rounded to
// 8 bits, norms, SwiGLU) ran on the node's one thread while the other cores waited.
template <class Fn>
void for_rows(int64_t M, int64_t work, Fn&& fn) {
  constexpr int64_t kMinRowsWork = 1 << 14;
  Pool& p = pool();
  if (M < 2 || p.size() < 2 || M * work < kMinRowsWork) return fn(int64_t{0}, M);
  const int64_t per = (M + 2 * p.size() - 1) / (2 * p.size()), chunks = (M + per - 1) / per;
  if (!p.try_run([&](int i) { fn(i * per, std::min<int64_t>(M, (i + 1) * per)); }, static_cast<int>(chunks))) {
    fn(int64_t{0}, M);
  }
}

}  // namespace mlxinfer
