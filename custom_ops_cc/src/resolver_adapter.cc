// Op-resolver adapter: registers every kernel with a
// tflite::MutableOpResolver, for C++ apps and for tflite-runtime's
// custom_op_registerers.  Unlike a delegate node, a resolver node keeps its
// original operand order and its custom options.
#include <array>
#include <cstring>
#include <utility>

#include "fusekit/kernel_sdk.h"
#include "node_runner.h"
#include "plugin_exports.h"
#include "resolver_adapter.h"

namespace fusekit {
namespace {

// TfLiteRegistration::init receives no registration pointer, so each kernel
// slot gets an init of its own that knows its index in the registry.
constexpr size_t kMaxKernels = 64;

template <size_t I>
void* InitAt(TfLiteContext*, const char* buffer, size_t length) {
  if (I >= KernelRegistry().size()) return nullptr;
  return NewNodeState(&KernelRegistry()[I], buffer, length).release();
}

TfLiteStatus PrepareResolved(TfLiteContext* context, TfLiteNode* node) {
  auto* state = static_cast<NodeState*>(node->user_data);
  if (state != nullptr) {
    state->inputs = IntArrayToVector(node->inputs);
    state->outputs = IntArrayToVector(node->outputs);
    state->outputs_can_alias = true;
  }
  return PrepareNode(context, state);
}

TfLiteStatus InvokeResolved(TfLiteContext* context, TfLiteNode* node) {
  return InvokeNode(context, static_cast<NodeState*>(node->user_data));
}

using InitFn = void* (*)(TfLiteContext*, const char*, size_t);

template <size_t... I>
constexpr std::array<InitFn, sizeof...(I)> MakeInits(
    std::index_sequence<I...>) {
  return {&InitAt<I>...};
}

constexpr auto kInits = MakeInits(std::make_index_sequence<kMaxKernels>());

}  // namespace

std::vector<std::pair<const char*, TfLiteRegistration>> ResolverRegistrations(
    std::string* error) {
  std::vector<std::pair<const char*, TfLiteRegistration>> out;
  const auto& registry = KernelRegistry();
  if (!RegistryError().empty()) {
    *error = "fusekit plugin is unusable: " + RegistryError();
    return out;
  }
  if (registry.size() > kMaxKernels) {
    *error = "fusekit: more than 64 kernels in one library";
    return out;
  }
  for (size_t i = 0; i < registry.size(); ++i) {
    TfLiteRegistration reg;
    std::memset(&reg, 0, sizeof(reg));
    reg.init = kInits[i];
    reg.free = FreeNodeState;
    reg.prepare = PrepareResolved;
    reg.invoke = InvokeResolved;
    reg.builtin_code = kFusekitBuiltinCustom;
    reg.custom_name = registry[i].name.c_str();
    reg.version = 1;
    out.emplace_back(registry[i].name.c_str(), reg);
  }
  return out;
}

}  // namespace fusekit

extern "C" FUSEKIT_EXPORT int fusekit_register_ops_with(
    void* resolver, FusekitAddCustomFn add_custom) {
  if (resolver == nullptr || add_custom == nullptr) return -1;
  std::string error;
  auto regs = fusekit::ResolverRegistrations(&error);
  if (!error.empty()) {
    fusekit::ReportError(nullptr, "%s", error.c_str());
    return -1;
  }
  // AddCustom copies the registration, so stack copies are fine.
  for (const auto& [name, reg] : regs) add_custom(resolver, name, &reg, 1, 1);
  return static_cast<int>(regs.size());
}
