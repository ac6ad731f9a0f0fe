// See pool.h.
#include "pool.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <new>
#include <thread>

namespace mlxinfer {

namespace {

int cores_allowed() {
  if (const char* env = std::getenv("MLXINFER_QMM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
#ifdef __linux__  // the cores this process may run on (taskset, cgroups); elsewhere, all of them
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

}  // namespace

Pool::Pool(int n) : n_(n) {
  for (int i = 1; i < n_; ++i) {
    std::thread([this] { work(); }).detach();  // lives as long as the process
  }
}

void Pool::work() {
  uint32_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    uint32_t w;
    int spins = 0;
    while ((w = wake_.load(std::memory_order_acquire)) == seen) {
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(100)) {
        wake_.wait(seen, std::memory_order_acquire);
      } else if (spins % 8 == 0) {
        sched_yield();  // a runnable thread of this process (Python building the next step) takes the core
      } else {
        cpu_relax();
      }
    }
    seen = w;
    participate();
  }
}

namespace {

std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mutex;

void forget_pool_after_fork() {
  g_pool.store(nullptr);  // the child has none of the parent's workers; leak the old object
  new (&g_pool_mutex) std::mutex();
}

}  // namespace

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  p = g_pool.load(std::memory_order_relaxed);
  if (!p) {
    static bool registered = false;
    if (!registered) {
      pthread_atfork(nullptr, nullptr, forget_pool_after_fork);
      registered = true;
    }
    p = new Pool(cores_allowed());
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace mlxinfer
