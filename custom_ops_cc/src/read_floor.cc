// fusekit_read_bytes: reads a buffer once, as fast as this CPU can, for
// benchmarks' memory floors.  A memory-bound step cannot take less time than
// reading the bytes it needs once; a reduction written for numerical quality
// (numpy's pairwise float sum) runs well below the bandwidth, so the floor
// needs a loop that does nothing but load: the widest vectors the CPU has
// (the kernels' own SIMD dispatch), several independent accumulators so the
// loads never wait on an add, and the kernels' thread pool for more than one
// thread.  Compiled into fusekit's own library only (not into plugins built
// with fusekit.build_plugin).
#include <cstddef>
#include <cstdint>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/read_floor.cc"
#include "fusekit/simd_begin.h"

// XOR of every 8-byte word of [p, p + bytes), then of the trailing bytes:
// integer lanes, so the loop has no floating-point latency to hide and no
// value can trap.
uint64_t XorWords(const uint8_t* HWY_RESTRICT p, size_t bytes) {
  const hn::ScalableTag<uint64_t> d;
  const size_t step = hn::Lanes(d) * sizeof(uint64_t);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * step <= bytes; i += 4 * step) {
    a0 = hn::Xor(a0, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i)));
    a1 = hn::Xor(a1, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + step)));
    a2 = hn::Xor(a2, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + 2 * step)));
    a3 = hn::Xor(a3, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + 3 * step)));
  }
  for (; i + step <= bytes; i += step) {
    a0 = hn::Xor(a0, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i)));
  }
  const auto all = hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3));
  uint64_t lanes[hn::MaxLanes(d)];
  hn::StoreU(all, d, lanes);
  uint64_t result = 0;
  for (size_t k = 0; k < hn::Lanes(d); ++k) result ^= lanes[k];
  // The rest word by word, then byte by byte: the same value at every
  // vector width.
  for (; i + sizeof(uint64_t) <= bytes; i += sizeof(uint64_t)) {
    uint64_t word;
    std::memcpy(&word, p + i, sizeof(word));
    result ^= word;
  }
  for (; i < bytes; ++i) result ^= p[i];
  return result;
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <atomic>
#include <memory>
#include <mutex>

#include "fusekit/simd.h"
#include "plugin_exports.h"
#include "thread_pool.h"

namespace fusekit {
namespace {

// Blocks claimed one at a time by the pool's threads: large enough that a
// claim costs nothing next to the reads, small enough to balance threads.
constexpr size_t kBlock = 64 * 1024;

struct ReadArgs {
  const uint8_t* data;
  size_t bytes;
  uint64_t (*xor_words)(const uint8_t*, size_t);
  std::atomic<uint64_t> result{0};
};

void ReadBlocks(void* arg, int64_t begin, int64_t end, int /*worker*/) {
  auto* args = static_cast<ReadArgs*>(arg);
  const size_t first = static_cast<size_t>(begin) * kBlock;
  const size_t last = std::min(args->bytes, static_cast<size_t>(end) * kBlock);
  args->result.fetch_xor(args->xor_words(args->data + first, last - first),
                         std::memory_order_relaxed);
}

// One pool per thread count, kept for the process: a benchmark calls this
// thousands of times and must not time thread creation.
ThreadPool* PoolOf(int threads) {
  static std::mutex mutex;
  static std::unique_ptr<ThreadPool> pools[64];
  std::lock_guard<std::mutex> lock(mutex);
  auto& pool = pools[threads - 1];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return pool.get();
}

}  // namespace
}  // namespace fusekit

extern "C" FUSEKIT_EXPORT uint64_t fusekit_read_bytes(const void* data, size_t bytes,
                                                     int threads) {
  using namespace fusekit;
  if (data == nullptr || bytes == 0) return 0;
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  static const auto xor_words = FUSEKIT_SIMD_CHOOSE(XorWords);
  ReadArgs args;
  args.data = static_cast<const uint8_t*>(data);
  args.bytes = bytes;
  args.xor_words = xor_words;
  const int64_t blocks = static_cast<int64_t>((bytes + kBlock - 1) / kBlock);
  PoolOf(threads)->ParallelFor(blocks, 1, threads, ReadBlocks, &args);
  return args.result.load(std::memory_order_relaxed);
}

#endif  // HWY_ONCE
