// A fixed set of worker threads that run one ParallelFor at a time.  Created
// once per interpreter (see interpreter_resources.h) and reused by every
// fusekit node of it: never a thread per invoke.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace fusekit {

class ThreadPool {
 public:
  // `threads` counts the caller: a pool of 1 has no workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(arg, begin, end, worker) over [0, n) in chunks of >= grain
  // items, on at most `max_threads` threads including the caller, and
  // returns when every chunk is done.  Chunks are claimed dynamically, so an
  // uneven chunk (a causal block, a short row) does not stall the rest.
  // `worker` is 0 for the caller and 1.. for the workers that joined, dense
  // and below the thread count, so it can index per-thread scratch.
  void ParallelFor(int64_t n, int64_t grain, int max_threads,
                   void (*fn)(void*, int64_t, int64_t, int), void* arg);

 private:
  void WorkerLoop();
  void RunChunks(int worker);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  // Under mutex_: whether the job still takes workers, how many it may
  // take, how many did.  A worker that wakes after the caller finished
  // every chunk itself does not join, so the caller never waits for a wake.
  bool open_ = false;
  int max_workers_ = 0;
  int joined_ = 0;
  std::atomic<int> busy_{0};  // joined workers still running chunks

  // The current job (written under mutex_ before the generation bump).
  void (*fn_)(void*, int64_t, int64_t, int) = nullptr;
  void* arg_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace fusekit
