// What the fusekit nodes of one interpreter share: the thread pool sized by
// its num_threads, the scratch arena and the memory given to outputs the
// runtime left unallocated.  Nodes hold a shared reference; the last node
// freed releases it, so an interpreter's threads end with the interpreter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fusekit/tflite_abi.h"
#include "thread_pool.h"

namespace fusekit {

// A 64-byte aligned buffer that only grows.
class Arena {
 public:
  void* Get(size_t bytes);

 private:
  std::unique_ptr<uint8_t[]> memory_;
  size_t size_ = 0;
};

struct InterpreterResources {
  int num_threads = 1;
  std::unique_ptr<ThreadPool> pool;  // created on first use
  Arena scratch;
  Arena sink;  // outputs nothing reads and the runtime did not allocate

  ThreadPool* Pool();
};

// The resources of the interpreter owning `context` (nodes of one subgraph
// share a context).  Safe to call from several interpreters in threads.
std::shared_ptr<InterpreterResources> ResourcesFor(TfLiteContext* context);

}  // namespace fusekit
