#include "interpreter_resources.h"

#include <map>
#include <mutex>
#include <new>

namespace fusekit {

void* Arena::Get(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > size_) {
    // Grow by half again so that slowly rising requests do not reallocate
    // on every node; 64 spare bytes let the start be cache-line aligned.
    size_t want = bytes + bytes / 2;
    if (want < bytes) want = bytes;  // overflow
    memory_.reset(new (std::nothrow) uint8_t[want + 64]);
    size_ = memory_ ? want : 0;
    if (!memory_) return nullptr;
  }
  auto p = reinterpret_cast<uintptr_t>(memory_.get());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
}

ThreadPool* InterpreterResources::Pool() {
  if (!pool || pool->size() != num_threads) {
    pool.reset();
    pool = std::make_unique<ThreadPool>(num_threads);
  }
  return pool.get();
}

std::shared_ptr<InterpreterResources> ResourcesFor(TfLiteContext* context) {
  static std::mutex mutex;
  // weak_ptr: an entry whose interpreter is gone expires, and a new
  // interpreter at the same address gets fresh resources.
  static auto* table =
      new std::map<const TfLiteContext*, std::weak_ptr<InterpreterResources>>();
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = table->begin(); it != table->end();) {
    it = it->second.expired() ? table->erase(it) : std::next(it);
  }
  auto& slot = (*table)[context];
  auto resources = slot.lock();
  if (!resources) {
    resources = std::make_shared<InterpreterResources>();
    slot = resources;
  }
  const int threads = context != nullptr ? context->recommended_num_threads : 1;
  resources->num_threads = threads > 0 ? threads : 1;
  return resources;
}

}  // namespace fusekit
