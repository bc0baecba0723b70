// The part both adapters (delegate plugin, op resolver) share: one NodeState
// per node, and the checks every kernel gets before its own Prepare and
// Invoke.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "interpreter_resources.h"

namespace fusekit {

struct NodeState {
  const KernelDef* def = nullptr;
  // Tensor indices in the original op's operand order (a delegate node lists
  // them sorted by index instead); -1 for an omitted optional input.
  std::vector<int> inputs;
  std::vector<int> outputs;
  // Outputs the runtime will not allocate because nothing reads them (known
  // to the delegate adapter); they write into the shared sink instead.
  std::vector<bool> output_unread;
  Attrs attrs;
  // A version-1 node of a kernel whose optional inputs used to be packed:
  // for each input position, the node's packed position or -1 (absent);
  // empty otherwise.  `mapped_inputs` is what `inputs` became, so that a
  // second Prepare does not map twice.
  std::vector<int> v1_layout;
  std::vector<int> mapped_inputs;
  // Set when the options or attrs are unusable; init cannot report errors,
  // so Prepare does.
  std::string create_error;

  // The kernel instance of the dtype variant chosen in Prepare.
  const KernelVariant* variant = nullptr;
  void* kernel = nullptr;

  // Whether outputs are the runtime's own tensors, which a kernel may turn
  // into views of an input (the interpreters' delegate and op-resolver
  // paths); false where outputs are buffers handed in (LiteRT).
  bool outputs_can_alias = false;
  // Per output, set by OpContext::AliasOutput in Prepare: the input position
  // whose memory it views (-1: none) and the byte offset into it.
  std::vector<int> alias_input;
  std::vector<size_t> alias_offset;

  std::shared_ptr<InterpreterResources> resources;
  // Per Invoke: where each output's data goes when the runtime left it
  // without memory (nullptr: the tensor's own data).
  std::vector<void*> output_override;

  ~NodeState();
};

// Parses and validates the options (errors kept for Prepare).
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
