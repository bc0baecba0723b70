// The part both adapters (delegate plugin, op resolver) share: one NodeState
// per node, and the checks every kernel gets before its own Prepare.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace fusekit {

struct NodeState {
  const KernelDef* def = nullptr;
  // Tensor indices in the original op's operand order (a delegate node lists
  // them sorted by index instead).
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;
  std::unique_ptr<Kernel> kernel;
  // Set when the kernel could not be created; init cannot report errors, so
  // Prepare does.
  std::string create_error;
  std::unique_ptr<uint8_t[]> scratch;
  size_t scratch_bytes = 0;
};

// Parses the options and creates the kernel (errors kept for Prepare).
std::unique_ptr<NodeState> NewNodeState(const KernelDef* def,
                                        const void* options, size_t size);

TfLiteStatus PrepareNode(TfLiteContext* context, NodeState* state);
TfLiteStatus InvokeNode(TfLiteContext* context, NodeState* state);

// Copies a TFLite int array (node inputs, an execution plan).
std::vector<int> IntArrayToVector(const TfLiteIntArray* array);

// The TfLiteRegistration::free of both adapters.
void FreeNodeState(TfLiteContext* context, void* state);

// Reports one message (newline appended) through context->ReportError,
// falling back to stderr.
void ReportError(TfLiteContext* context, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace fusekit
