// External-delegate adapter: how the pip interpreters (ai-edge-litert,
// tf.lite, tflite-runtime) get fusekit's kernels.  The delegate claims every
// CUSTOM node whose name a registered kernel provides, one node per
// replacement call, and runs it through the kernel SDK.
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "node_runner.h"
#include "plugin_exports.h"

namespace fusekit {
namespace {

// What the delegate copies from an original custom node while it still can
// (GetNodeAndRegistration only works inside the delegate's Prepare).
struct CapturedNode {
  const KernelDef* def;
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<uint8_t> options;
};

bool Contains(const TfLiteIntArray* array, int value) {
  if (array == nullptr) return false;
  for (int i = 0; i < array->size; ++i) {
    if (array->data[i] == value) return true;
  }
  return false;
}

// What makes the graph unsafe to partition, or an empty string.  The
// runtimes' partitioner (run by ReplaceNodeSubsetsWithDelegateKernels) trusts
// every node's tensor indices and that each tensor has one writer; on a
// malformed model, which tflite-runtime loads without verifying, it reads
// out of bounds.  Their own path reports most of these graphs as errors, so
// the delegate refuses them before partitioning instead of claiming nodes.
std::string GraphProblem(TfLiteContext* context, const std::vector<int>& plan) {
  const int tensor_count = static_cast<int>(context->tensors_size);
  // Position in the plan of each tensor's writer (-1: none).
  std::vector<int> written_at(context->tensors_size, -1);
  std::vector<TfLiteNode*> nodes(plan.size(), nullptr);
  char message[160];
  for (size_t k = 0; k < plan.size(); ++k) {
    const int index = plan[k];
    TfLiteNode* node = nullptr;
    TfLiteRegistration* reg = nullptr;
    if (context->GetNodeAndRegistration(context, index, &node, &reg) != kTfLiteOk ||
        node == nullptr || node->inputs == nullptr || node->outputs == nullptr) {
      std::snprintf(message, sizeof(message), "node %d cannot be read", index);
      return message;
    }
    nodes[k] = node;
    for (int i = 0; i < node->inputs->size; ++i) {
      const int t = node->inputs->data[i];
      if (t < -1 || t >= tensor_count) {
        std::snprintf(message, sizeof(message),
                      "node %d: input %d is tensor %d, outside 0..%d", index, i, t,
                      tensor_count - 1);
        return message;
      }
    }
    for (int i = 0; i < node->outputs->size; ++i) {
      const int t = node->outputs->data[i];
      if (t < 0 || t >= tensor_count) {
        std::snprintf(message, sizeof(message),
                      "node %d: output %d is tensor %d, outside 0..%d", index, i, t,
                      tensor_count - 1);
        return message;
      }
      if (written_at[t] >= 0) {
        std::snprintf(message, sizeof(message),
                      "tensor %d is written by node %d and node %d", t,
                      plan[written_at[t]], index);
        return message;
      }
      written_at[t] = static_cast<int>(k);
      if (context->tensors[t].allocation_type == kTfLiteMmapRo) {
        std::snprintf(message, sizeof(message), "node %d writes constant tensor %d",
                      index, t);
        return message;
      }
      if (Contains(node->inputs, t)) {
        std::snprintf(message, sizeof(message), "node %d reads its own output tensor %d",
                      index, t);
        return message;
      }
    }
  }
  // In plan order every tensor is written before it is read: a node reading
  // a tensor that a later node writes (a cycle, or a graph input
  // overwritten after use) breaks the partitioner's ordering too.
  for (size_t k = 0; k < plan.size(); ++k) {
    const TfLiteIntArray* inputs = nodes[k]->inputs;
    for (int i = 0; i < inputs->size; ++i) {
      const int t = inputs->data[i];
      if (t >= 0 && written_at[t] >= static_cast<int>(k)) {
        std::snprintf(message, sizeof(message),
                      "node %d reads tensor %d before node %d writes it", plan[k], t,
                      plan[written_at[t]]);
        return message;
      }
    }
  }
  return std::string();
}

struct DelegateData {
  std::mutex mutex;
  // Keyed by (context, node index): one delegate may serve several
  // interpreters.
  std::map<std::pair<const TfLiteContext*, int>, CapturedNode> nodes;
  bool verbose = false;
};

void* KernelInit(TfLiteContext* context, const char* buffer, size_t) {
  const auto* params = reinterpret_cast<const TfLiteDelegateParams*>(buffer);
  auto* data = static_cast<DelegateData*>(params->delegate->data_);
  if (params->nodes_to_replace == nullptr ||
      params->nodes_to_replace->size != 1) {
    ReportError(context, "fusekit: delegate partition must hold one node");
    return nullptr;
  }
  const int node_index = params->nodes_to_replace->data[0];
  std::lock_guard<std::mutex> lock(data->mutex);
  auto it = data->nodes.find({context, node_index});
  if (it == data->nodes.end()) {
    ReportError(context, "fusekit: node %d was not captured", node_index);
    return nullptr;
  }
  const CapturedNode& captured = it->second;
  auto state = NewNodeState(captured.def, captured.options.data(),
                            captured.options.size());
  state->inputs = captured.inputs;
  state->outputs = captured.outputs;
  state->outputs_can_alias = true;
  // The delegate node lists only the outputs something reads; the runtime
  // never allocates the others, so the kernel must not write them.
  state->output_unread.resize(captured.outputs.size());
  for (size_t i = 0; i < captured.outputs.size(); ++i) {
    state->output_unread[i] = !Contains(params->output_tensors, captured.outputs[i]);
  }
  return state.release();
}

TfLiteStatus KernelPrepare(TfLiteContext* context, TfLiteNode* node) {
  return PrepareNode(context, static_cast<NodeState*>(node->user_data));
}

TfLiteStatus KernelInvoke(TfLiteContext* context, TfLiteNode* node) {
  return InvokeNode(context, static_cast<NodeState*>(node->user_data));
}

TfLiteStatus DelegatePrepare(TfLiteContext* context, TfLiteDelegate* delegate) {
  auto* data = static_cast<DelegateData*>(delegate->data_);
  TfLiteIntArray* plan = nullptr;
  if (context->GetExecutionPlan(context, &plan) != kTfLiteOk) {
    return kTfLiteError;
  }
  // The plan changes as nodes are replaced: work on a copy.
  const std::vector<int> node_indices = IntArrayToVector(plan);
  std::vector<std::pair<int, const KernelDef*>> claimed;
  const std::string problem = GraphProblem(context, node_indices);
  if (!problem.empty()) {
    ReportError(context,
                "fusekit: the model's graph is malformed (%s); no node was delegated",
                problem.c_str());
    return kTfLiteError;
  }
  {
    std::lock_guard<std::mutex> lock(data->mutex);
    for (int index : node_indices) {
      TfLiteNode* node = nullptr;
      TfLiteRegistration* reg = nullptr;
      if (context->GetNodeAndRegistration(context, index, &node, &reg) !=
          kTfLiteOk) {
        return kTfLiteError;
      }
      if (reg->builtin_code != kFusekitBuiltinCustom) continue;
      const KernelDef* def = FindKernel(reg->custom_name);
      if (def == nullptr) continue;
      CapturedNode captured;
      captured.def = def;
      captured.inputs = IntArrayToVector(node->inputs);
      captured.outputs = IntArrayToVector(node->outputs);
      if (node->custom_initial_data != nullptr &&
          node->custom_initial_data_size > 0) {
        const auto* p =
            static_cast<const uint8_t*>(node->custom_initial_data);
        captured.options.assign(p, p + node->custom_initial_data_size);
      }
      data->nodes[{context, index}] = std::move(captured);
      claimed.emplace_back(index, def);
    }
  }
  for (const auto& [index, def] : claimed) {
    // The runtimes read every field of the registration, so the trailing
    // ones must be zero (a stray registration_external crashes).
    TfLiteRegistration registration;
    std::memset(&registration, 0, sizeof(registration));
    registration.init = KernelInit;
    registration.free = FreeNodeState;
    registration.prepare = KernelPrepare;
    registration.invoke = KernelInvoke;
    registration.builtin_code = kFusekitBuiltinDelegate;
    registration.custom_name = def->name.c_str();
    registration.version = 1;
    // One node per call: adjacent custom nodes replaced together would
    // become one partition whose inner tensor is never allocated.
    struct {
      int size;
      int data[1];
    } one = {1, {index}};
    const auto* nodes = reinterpret_cast<const TfLiteIntArray*>(&one);
    if (context->ReplaceNodeSubsetsWithDelegateKernels(
            context, registration, nodes, delegate) != kTfLiteOk) {
      return kTfLiteError;
    }
    if (data->verbose) {
      std::fprintf(stderr, "fusekit: node %d (%s) runs on fusekit\n", index,
                   def->name.c_str());
    }
  }
  return kTfLiteOk;
}

}  // namespace
}  // namespace fusekit

extern "C" {

FUSEKIT_EXPORT TfLiteDelegate* tflite_plugin_create_delegate(
    char** keys, char** values, size_t num_options,
    void (*report_error)(const char*)) {
  if (!fusekit::RegistryError().empty()) {
    if (report_error != nullptr) {
      const std::string message =
          "fusekit plugin is unusable: " + fusekit::RegistryError();
      report_error(message.c_str());
    }
    return nullptr;
  }
  auto* data = new fusekit::DelegateData();
  for (size_t i = 0; i < num_options; ++i) {
    const std::string key = keys[i];
    const std::string value = values[i];
    if (key == "verbose") {
      data->verbose = value == "1" || value == "true";
    } else {
      if (report_error != nullptr) {
        const std::string message =
            "fusekit delegate: unknown option '" + key +
            "' (known options: verbose)";
        report_error(message.c_str());
      }
      delete data;
      return nullptr;
    }
  }
  auto* delegate = new TfLiteDelegate;
  std::memset(delegate, 0, sizeof(*delegate));
  delegate->data_ = data;
  delegate->Prepare = fusekit::DelegatePrepare;
  // Without AllowDynamicTensors the runtime prepares the original graph
  // first and fails on the still-unresolved custom ops.
  delegate->flags = kTfLiteDelegateFlagsAllowDynamicTensors;
  return delegate;
}

FUSEKIT_EXPORT void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) {
  if (delegate == nullptr) return;
  delete static_cast<fusekit::DelegateData*>(delegate->data_);
  delete delegate;
}

}  // extern "C"
