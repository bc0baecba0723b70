#include "thread_pool.h"

#include <algorithm>

namespace fusekit {

ThreadPool::ThreadPool(int threads) {
  for (int w = 1; w < threads; ++w) {
    workers_.emplace_back([this, w] { WorkerLoop(w); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
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

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (worker >= active_workers_ + 1) continue;  // not needed this time
    }
    RunChunks(worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_workers_ == 0) done_.notify_one();
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
    active_workers_ = threads - 1;
    pending_workers_ = threads - 1;
    ++generation_;
  }
  wake_.notify_all();
  RunChunks(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_workers_ == 0; });
}

}  // namespace fusekit
