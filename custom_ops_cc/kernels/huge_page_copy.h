// A kernel's private copy of constant data in 2 MiB pages (Linux
// transparent huge pages, asked for with madvise), for kernels that stream
// large weights every invoke: one TLB entry per 2 MiB instead of 512 (a
// miss costs a two-dimensional page walk in a virtual machine), and no
// 4 KiB boundary every 64 cache lines for the hardware prefetchers.
//
// Copies are slices of shared regions of huge pages (HugePagePool), so a
// model's many weight matrices smaller than one huge page (an int8 decode
// step's are 0.1-0.9 MB each) share pages instead of each reading its own
// 4 KiB ones.  Where the system gives no huge pages (THP "never", not
// Linux, no memory) Of() answers the source itself: the copy would cost
// memory and gain nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>

#include <fstream>
#include <mutex>
#include <string>
#include <vector>
#endif

namespace fusekit {

#if defined(__linux__)
// Slices of mappings advised MADV_HUGEPAGE, one pool per process; a mapping
// is returned to the system when its last slice is.
class HugePagePool {
 public:
  static constexpr size_t kHuge = size_t{2} << 20;

  // Never destroyed: kernels may release their copies during static
  // destruction, in any order.
  static HugePagePool& Get() {
    static HugePagePool* pool = new HugePagePool;
    return *pool;
  }

  // `bytes` aligned to a cache line (64 B), or nullptr.
  void* Take(size_t bytes) {
    if (bytes == 0 || !Enabled()) return nullptr;
    bytes = (bytes + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> lock(mu_);
    Region* open = regions_.empty() ? nullptr : &regions_.back();
    if (open == nullptr || open->size - open->used < bytes) {
      Region fresh;
      if (!Map(bytes > kRegion ? bytes : kRegion, &fresh)) return nullptr;
      regions_.push_back(fresh);
      open = &regions_.back();
    }
    char* slice = open->start + open->used;
    open->used += bytes;
    open->live += 1;
    return slice;
  }

  void Give(void* slice) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < regions_.size(); ++i) {
      Region& r = regions_[i];
      const char* p = static_cast<const char*>(slice);
      if (p < r.start || p >= r.start + r.size) continue;
      if (--r.live == 0) {
        munmap(r.base, r.map_size);
        regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return;
    }
  }

 private:
  // A region holds many small matrices; a larger one gets its own.
  static constexpr size_t kRegion = size_t{32} << 20;
  static constexpr size_t kAlign = 64;

  struct Region {
    void* base = nullptr;  // the mapping
    size_t map_size = 0;
    char* start = nullptr;  // its first 2 MiB boundary
    size_t size = 0, used = 0, live = 0;
  };

  static bool Enabled() {
    static const bool enabled = [] {
      std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
      std::string line;
      return std::getline(file, line) && line.find("[never]") == std::string::npos;
    }();
    return enabled;
  }

  static bool Map(size_t bytes, Region* out) {
    // Whole huge pages, one more to align the start to 2 MiB.
    const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
    const size_t map_size = size + kHuge;
    void* base =
        mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return false;
    const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) / kHuge * kHuge;
    char* aligned = reinterpret_cast<char*>(start);
    if (madvise(aligned, size, MADV_HUGEPAGE) != 0) {
      munmap(base, map_size);
      return false;
    }
    out->base = base;
    out->map_size = map_size;
    out->start = aligned;
    out->size = size;
    return true;
  }

  std::mutex mu_;
  std::vector<Region> regions_;
};
#endif

class HugePageCopy {
 public:
  HugePageCopy() = default;
  HugePageCopy(const HugePageCopy&) = delete;
  HugePageCopy& operator=(const HugePageCopy&) = delete;
  ~HugePageCopy() { Release(); }

  // The copy of `count` elements at `source`, made at the first call and
  // again when the source moves or grows (constant data stays put).
  template <typename T>
  const T* Of(const T* source, size_t count) {
    const size_t bytes = count * sizeof(T);
    if (source == source_ && bytes == bytes_) return static_cast<const T*>(copy_);
    Release();
    source_ = source;
    bytes_ = bytes;
#if defined(__linux__)
    slice_ = HugePagePool::Get().Take(bytes);
#endif
    if (slice_ == nullptr) {
      copy_ = const_cast<T*>(source);  // read in place
    } else {
      std::memcpy(slice_, source, bytes);
      copy_ = slice_;
    }
    return static_cast<const T*>(copy_);
  }

 private:
  void Release() {
#if defined(__linux__)
    if (slice_ != nullptr) HugePagePool::Get().Give(slice_);
#endif
    slice_ = nullptr;
    copy_ = nullptr;
    source_ = nullptr;
    bytes_ = 0;
  }

  const void* source_ = nullptr;
  size_t bytes_ = 0;
  void* copy_ = nullptr;
  void* slice_ = nullptr;  // ours, from the pool
};

}  // namespace fusekit
