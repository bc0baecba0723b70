#include "node_runner.h"

#include <cstdio>

namespace fusekit {

void ReportError(TfLiteContext* context, const char* format, ...) {
  char message[768];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  if (context != nullptr && context->ReportError != nullptr) {
    // Runtimes join consecutive reports: end each message with a newline.
    context->ReportError(context, "%s\n", message);
  } else {
    std::fprintf(stderr, "%s\n", message);
  }
}

std::vector<int> IntArrayToVector(const TfLiteIntArray* array) {
  std::vector<int> v;
  if (array != nullptr) v.assign(array->data, array->data + array->size);
  return v;
}

void FreeNodeState(TfLiteContext*, void* state) {
  delete static_cast<NodeState*>(state);
}

std::unique_ptr<NodeState> NewNodeState(const KernelDef* def,
                                        const void* options, size_t size) {
  auto state = std::make_unique<NodeState>();
  state->def = def;
  state->attrs = Attrs(options, size);
  if (!state->attrs.valid()) {
    state->create_error = "malformed custom options (" +
                          state->attrs.error() + ", " + std::to_string(size) +
                          " bytes)";
    return state;
  }
  std::string error;
  state->kernel = def->create(state->attrs, &error);
  if (!state->kernel) {
    state->create_error = error.empty() ? "kernel creation failed" : error;
  } else if (!state->attrs.ok()) {
    state->create_error = state->attrs.error();
    state->kernel.reset();
  }
  return state;
}

TfLiteStatus PrepareNode(TfLiteContext* context, NodeState* state) {
  if (state == nullptr) {
    ReportError(context, "fusekit: node has no state (kernel init failed)");
    return kTfLiteError;
  }
  const KernelDef& def = *state->def;
  if (!state->create_error.empty()) {
    ReportError(context, "%s: %s", def.name, state->create_error.c_str());
    return kTfLiteError;
  }
  const int n_in = static_cast<int>(state->inputs.size());
  if (n_in < def.min_inputs || n_in > def.max_inputs) {
    if (def.min_inputs == def.max_inputs) {
      ReportError(context, "%s: expected %d inputs, got %d", def.name,
                  def.min_inputs, n_in);
    } else {
      ReportError(context, "%s: expected %d to %d inputs, got %d", def.name,
                  def.min_inputs, def.max_inputs, n_in);
    }
    return kTfLiteError;
  }
  const int n_out = static_cast<int>(state->outputs.size());
  if (n_out != def.num_outputs) {
    ReportError(context, "%s: expected %d outputs, got %d", def.name,
                def.num_outputs, n_out);
    return kTfLiteError;
  }
  OpContext ctx(context, state);
  return state->kernel->Prepare(ctx);
}

TfLiteStatus InvokeNode(TfLiteContext* context, NodeState* state) {
  if (state == nullptr || !state->kernel) return kTfLiteError;
  OpContext ctx(context, state);
  return state->kernel->Invoke(ctx);
}

}  // namespace fusekit
