// A kernel's private copy of constant data in 2 MiB pages (Linux
// transparent huge pages, asked for with madvise), for kernels that stream
// large weights every invoke: one TLB entry per 2 MiB instead of 512, and
// no 4 KiB boundary every 64 cache lines for the hardware prefetchers.
// Where the system gives no huge pages (THP "never", not Linux, no memory)
// Of() answers the source itself: the copy would cost memory and gain
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>

#include <fstream>
#include <string>
#endif

namespace fusekit {

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
    copy_ = Allocate(bytes);
    if (copy_ == nullptr) {
      copy_ = const_cast<T*>(source);  // read in place
    } else {
      std::memcpy(copy_, source, bytes);
    }
    return static_cast<const T*>(copy_);
  }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;

#if defined(__linux__)
  static bool Enabled() {
    static const bool enabled = [] {
      std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
      std::string line;
      return std::getline(file, line) && line.find("[never]") == std::string::npos;
    }();
    return enabled;
  }

  void* Allocate(size_t bytes) {
    // Below one huge page there is nothing to gain.
    if (bytes < kHuge || !Enabled()) return nullptr;
    // Whole huge pages, one more to align the start to 2 MiB.
    const size_t size = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) / kHuge * kHuge;
    void* aligned = reinterpret_cast<void*>(start);
    if (madvise(aligned, size - (start - reinterpret_cast<uintptr_t>(base)), MADV_HUGEPAGE) != 0) {
      munmap(base, size);
      return nullptr;
    }
    map_ = base;
    map_size_ = size;
    return aligned;
  }

  void Release() {
    if (map_ != nullptr) munmap(map_, map_size_);
    map_ = nullptr;
    map_size_ = 0;
    copy_ = nullptr;
  }
#else
  void* Allocate(size_t) { return nullptr; }
  void Release() { copy_ = nullptr; }
#endif

  const void* source_ = nullptr;
  size_t bytes_ = 0;
  void* copy_ = nullptr;
  void* map_ = nullptr;
  size_t map_size_ = 0;
};

}  // namespace fusekit
