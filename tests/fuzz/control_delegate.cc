// The fuzzer's CONTROL delegate: no fusekit code at all.  It claims the same
// custom nodes fusekit would (names given in the "ops" option, comma
// separated), gives each output the shape of the node's first input and
// writes zeros into whatever memory the runtime allocated.  When a mutant
// crashes a runtime through fusekit and also crashes it through this
// delegate, the crash is the runtime's own.
//
// The TFLite C ABI is declared here again, independently of fusekit's
// tflite_abi.h, so that a layout mistake in fusekit cannot hide in the
// control too.  Layouts: x86-64, the same facts fusekit's tflite_abi.h
// pins with static_asserts.
//
// Built at test time: g++ -std=c++17 -O1 -shared -fPIC control_delegate.cc
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

extern "C" {

struct CtlIntArray {
  int size;
  int data[];
};

struct CtlTensor {  // TfLiteTensor, 112 bytes
  int type;
  void* data;
  CtlIntArray* dims;
  unsigned char rest_a[40 - 24];
  size_t bytes;
  unsigned char rest_b[112 - 48];
};
static_assert(sizeof(CtlTensor) == 112, "TfLiteTensor size");
static_assert(offsetof(CtlTensor, bytes) == 40, "TfLiteTensor::bytes");

struct CtlNode {  // TfLiteNode, 80 bytes
  CtlIntArray* inputs;
  CtlIntArray* outputs;
  CtlIntArray* intermediates;
  CtlIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  void* delegate;
  bool might_have_side_effect;
};
static_assert(sizeof(CtlNode) == 80, "TfLiteNode size");

struct CtlContext;
struct CtlDelegate;

struct CtlRegistration {  // TfLiteRegistration, 88 bytes
  void* (*init)(CtlContext*, const char*, size_t);
  void (*free)(CtlContext*, void*);
  int (*prepare)(CtlContext*, CtlNode*);
  int (*invoke)(CtlContext*, CtlNode*);
  const char* (*profiling_string)(const CtlContext*, const CtlNode*);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;
  void* async_kernel;
  uint64_t inplace_operator;
};
static_assert(sizeof(CtlRegistration) == 88, "TfLiteRegistration size");
static_assert(offsetof(CtlRegistration, builtin_code) == 40, "builtin_code");
static_assert(offsetof(CtlRegistration, custom_name) == 48, "custom_name");

struct CtlContext {  // TfLiteContext, 200 bytes; only the members used
  size_t tensors_size;
  int (*GetExecutionPlan)(CtlContext*, CtlIntArray**);
  CtlTensor* tensors;
  void* impl_;
  int (*ResizeTensor)(CtlContext*, CtlTensor*, CtlIntArray*);
  void (*ReportError)(CtlContext*, const char*, ...);
  void* AddTensors;
  int (*GetNodeAndRegistration)(CtlContext*, int, CtlNode**, CtlRegistration**);
  int (*ReplaceNodeSubsetsWithDelegateKernels)(CtlContext*, CtlRegistration,
                                                const CtlIntArray*, CtlDelegate*);
  unsigned char rest[200 - 72];
};
static_assert(sizeof(CtlContext) == 200, "TfLiteContext size");
static_assert(offsetof(CtlContext, ReplaceNodeSubsetsWithDelegateKernels) == 64,
              "ReplaceNodeSubsetsWithDelegateKernels");

struct CtlDelegate {  // TfLiteDelegate, 56 bytes
  void* data_;
  int (*Prepare)(CtlContext*, CtlDelegate*);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder;
};
static_assert(sizeof(CtlDelegate) == 56, "TfLiteDelegate size");

struct CtlDelegateParams {
  CtlDelegate* delegate;
  CtlIntArray* nodes_to_replace;
  CtlIntArray* input_tensors;
  CtlIntArray* output_tensors;
};

}  // extern "C"

namespace {

constexpr int kOk = 0;
constexpr int kError = 1;
constexpr int kBuiltinCustom = 32;
constexpr int kBuiltinDelegate = 51;

struct Captured {
  std::vector<int> inputs;
  std::vector<int> outputs;
};

struct Control {
  std::set<std::string> ops;
  std::mutex mutex;
  // Captured while the original node is still visible (only possible
  // inside the delegate's Prepare), keyed by (context, node index).
  std::map<std::pair<const CtlContext*, int>, Captured> nodes;
};

std::vector<int> Copy(const CtlIntArray* a) {
  std::vector<int> v;
  if (a != nullptr && a->size > 0) v.assign(a->data, a->data + a->size);
  return v;
}

bool InRange(const CtlContext* c, int index) {
  return index >= 0 && static_cast<size_t>(index) < c->tensors_size;
}

void* Init(CtlContext* context, const char* buffer, size_t) {
  const auto* params = reinterpret_cast<const CtlDelegateParams*>(buffer);
  auto* control = static_cast<Control*>(params->delegate->data_);
  if (params->nodes_to_replace == nullptr || params->nodes_to_replace->size != 1) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(control->mutex);
  auto it = control->nodes.find({context, params->nodes_to_replace->data[0]});
  if (it == control->nodes.end()) return nullptr;
  return new Captured(it->second);
}

void Free(CtlContext*, void* data) { delete static_cast<Captured*>(data); }

int Prepare(CtlContext* context, CtlNode* node) {
  auto* node_data = static_cast<Captured*>(node->user_data);
  if (node_data == nullptr) return kError;
  // A well-behaved kernel of the kind fusekit runs: outputs take the shape
  // of the first input.  Nothing more is checked than the control itself
  // needs to stay memory safe.
  if (node_data->inputs.empty() || !InRange(context, node_data->inputs[0])) return kOk;
  const CtlIntArray* dims = context->tensors[node_data->inputs[0]].dims;
  if (dims == nullptr || dims->size < 0 || dims->size > 16) return kOk;
  for (int d = 0; d < dims->size; ++d) {
    if (dims->data[d] < 0 || dims->data[d] > (1 << 24)) return kOk;
  }
  for (int out : node_data->outputs) {
    if (!InRange(context, out)) continue;
    // ResizeTensor takes ownership and frees the array with free().
    auto* shape = static_cast<CtlIntArray*>(
        std::malloc(sizeof(int) * (static_cast<size_t>(dims->size) + 1)));
    if (shape == nullptr) return kError;
    shape->size = dims->size;
    std::memcpy(shape->data, dims->data, sizeof(int) * static_cast<size_t>(dims->size));
    if (context->ResizeTensor(context, &context->tensors[out], shape) != kOk) return kError;
  }
  return kOk;
}

int Invoke(CtlContext* context, CtlNode* node) {
  auto* node_data = static_cast<Captured*>(node->user_data);
  if (node_data == nullptr) return kError;
  std::vector<int> outs = node_data->outputs;
  for (int out : Copy(node->outputs)) outs.push_back(out);
  for (int out : outs) {
    if (!InRange(context, out)) continue;
    CtlTensor& t = context->tensors[out];
    if (t.data != nullptr && t.bytes > 0) std::memset(t.data, 0, t.bytes);
  }
  return kOk;
}

int DelegatePrepare(CtlContext* context, CtlDelegate* delegate) {
  auto* control = static_cast<Control*>(delegate->data_);
  CtlIntArray* plan = nullptr;
  if (context->GetExecutionPlan(context, &plan) != kOk) return kError;
  const std::vector<int> indices = Copy(plan);  // the plan changes below
  std::vector<int> claimed;
  {
    std::lock_guard<std::mutex> lock(control->mutex);
    for (int index : indices) {
      CtlNode* node = nullptr;
      CtlRegistration* reg = nullptr;
      if (context->GetNodeAndRegistration(context, index, &node, &reg) != kOk) return kError;
      if (reg->builtin_code != kBuiltinCustom || reg->custom_name == nullptr) continue;
      if (control->ops.count(reg->custom_name) == 0) continue;
      control->nodes[{context, index}] = Captured{Copy(node->inputs), Copy(node->outputs)};
      claimed.push_back(index);
    }
  }
  for (int index : claimed) {
    CtlRegistration reg;
    std::memset(&reg, 0, sizeof(reg));
    reg.init = Init;
    reg.free = Free;
    reg.prepare = Prepare;
    reg.invoke = Invoke;
    reg.builtin_code = kBuiltinDelegate;
    reg.custom_name = "fuzz_control";
    reg.version = 1;
    // One node per partition, as fusekit does, so partitions match.
    struct {
      int size;
      int data[1];
    } one = {1, {index}};
    if (context->ReplaceNodeSubsetsWithDelegateKernels(
            context, reg, reinterpret_cast<const CtlIntArray*>(&one), delegate) != kOk) {
      return kError;
    }
  }
  return kOk;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) CtlDelegate* tflite_plugin_create_delegate(
    char** keys, char** values, size_t count, void (*)(const char*)) {
  auto* control = new Control;
  for (size_t i = 0; i < count; ++i) {
    if (std::strcmp(keys[i], "ops") != 0) continue;
    std::string list = values[i];
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) control->ops.insert(list.substr(start, end - start));
      start = end + 1;
    }
  }
  auto* delegate = new CtlDelegate;
  std::memset(delegate, 0, sizeof(*delegate));
  delegate->data_ = control;
  delegate->Prepare = DelegatePrepare;
  delegate->flags = 1;  // AllowDynamicTensors, or the custom nodes fail first
  return delegate;
}

extern "C" __attribute__((visibility("default"))) void tflite_plugin_destroy_delegate(
    CtlDelegate* delegate) {
  if (delegate == nullptr) return;
  delete static_cast<Control*>(delegate->data_);
  delete delegate;
}
