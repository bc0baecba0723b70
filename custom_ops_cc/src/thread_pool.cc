#include "thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fusekit {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a thread polls before it sleeps on a condition variable.  A
// futex wake costs tens of microseconds, about the time a whole row block
// of a norm takes; kernels call ParallelFor back to back (and a model runs
// fused ops one after another), so a short poll catches most of them while
// keeping idle CPU use negligible.
constexpr auto kSpin = std::chrono::microseconds(30);

template <typename Ready>
bool SpinUntil(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(int worker) {
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) return;
    fn_(arg_, begin, std::min(n_, begin + chunk_), worker);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    SpinUntil([&] {
      return stop_.load(std::memory_order_relaxed) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    int worker;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_.load()) return;
      seen = generation_.load();
      if (!open_ || joined_ >= max_workers_) continue;  // done or not needed
      worker = ++joined_;
      busy_.fetch_add(1, std::memory_order_relaxed);
    }
    RunChunks(worker);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock, so the caller cannot check and sleep in between.
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, int max_threads,
                             void (*fn)(void*, int64_t, int64_t, int),
                             void* arg) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(
      {static_cast<int64_t>(std::max(max_threads, 1)),
       static_cast<int64_t>(size()), max_chunks}));
  if (threads <= 1) {
    fn(arg, 0, n, 0);
    return;
  }
  // About four chunks per thread balances uneven chunks without paying a
  // claim per grain.
  const int64_t chunk =
      std::max<int64_t>(grain, (n + 4 * threads - 1) / (4 * threads));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = fn;
    arg_ = arg;
    n_ = n;
    chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    open_ = true;
    max_workers_ = threads - 1;
    joined_ = 0;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  RunChunks(0);
  {
    // Every chunk is claimed: no worker joins from here on, and only the
    // ones that joined are waited for.
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  if (SpinUntil([&] { return busy_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return busy_.load(std::memory_order_acquire) == 0; });
}

}  // namespace fusekit
