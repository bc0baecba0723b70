// LiteRT custom-op adapter: serves the kernel registry through
// LiteRtCustomOpKernel (LiteRtAddCustomOpKernelOption), the way custom ops
// reach LiteRT's CompiledModel.  Kernels stay unaware of it: each node gets a
// NodeState and a small private TfLiteContext whose tensors view the host
// memory of LiteRT's tensor buffers, so the SDK's checks, Prepare and Invoke
// run exactly as under the delegate and the resolver.
//
// Node identity.  LiteRT's dispatcher registers one kernel entry per custom
// code, and none of its callbacks (GetOutputLayouts, Run) says which node it
// serves: every node of a code shares the entry's user_data.  Matching calls
// to nodes by their order is not sound (nodes of one op with different
// shapes, signatures run in any order, partial re-prepares), so the adapter
// never does it.  fusekit_litert_add_model_kernels gives every node of the
// library's ops a custom code of its own in a copy of the model
// (litert_node_codes.cc: "<op>@s<subgraph>.op<index>") and registers one
// kernel entry per node, whose user_data is that node's slot: every call
// names its node.  A slot serves exactly one node: if LiteRT ever inits a
// second node on one entry (a runtime that copies nodes, or
// fusekit_litert_add_kernels on a model with two nodes of one op), the slot
// refuses to prepare or run and records why; it never guesses.
//
// LiteRT ignores the statuses Init, GetOutputLayouts and Run return.  Every
// failure is recorded on the handle (op name and message) for
// fusekit_litert_last_error, and a failed shape inference hands back an
// output layout LiteRT's own resize rejects, so creation fails as well.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/litert.h"
#include "litert_model_check.h"
#include "litert_node_codes.h"
#include "node_runner.h"

namespace fusekit {
namespace {

// The LiteRT functions the adapter calls, taken from the libLiteRt.so the
// process has loaded: the library itself links against no runtime.
struct LiteRtApi {
  decltype(&LiteRtAddCustomOpKernelOption) add_custom_op = nullptr;
  decltype(&LiteRtGetTensorBufferTensorType) tensor_type = nullptr;
  decltype(&LiteRtGetTensorBufferSize) buffer_size = nullptr;
  decltype(&LiteRtLockTensorBuffer) lock = nullptr;
  decltype(&LiteRtUnlockTensorBuffer) unlock = nullptr;
  std::string error;
};

template <typename F>
bool Resolve(void* handle, const char* name, F* out) {
  void* sym = dlsym(handle, name);
  *out = reinterpret_cast<F>(sym);
  return sym != nullptr;
}

const LiteRtApi& Api() {
  static const LiteRtApi api = [] {
    LiteRtApi a;
    // A library opened RTLD_LOCAL (Python's ctypes, dlopen by an app) is not
    // in the global scope; RTLD_NOLOAD finds it by name without loading it.
    void* loaded = dlopen("libLiteRt.so", RTLD_LAZY | RTLD_NOLOAD);
    for (void* scope : {RTLD_DEFAULT, loaded}) {
      if (scope == loaded && loaded == nullptr) continue;
      if (Resolve(scope, "LiteRtAddCustomOpKernelOption", &a.add_custom_op) &&
          Resolve(scope, "LiteRtGetTensorBufferTensorType", &a.tensor_type) &&
          Resolve(scope, "LiteRtGetTensorBufferSize", &a.buffer_size) &&
          Resolve(scope, "LiteRtLockTensorBuffer", &a.lock) &&
          Resolve(scope, "LiteRtUnlockTensorBuffer", &a.unlock)) {
        return a;
      }
    }
    a = LiteRtApi();
    a.error =
        "the LiteRT C API (LiteRtAddCustomOpKernelOption, LiteRtLockTensorBuffer, "
        "...) is not loaded in this process: load libLiteRt.so first";
    return a;
  }();
  return api;
}

std::mutex& StaticErrorMutex() {
  static std::mutex m;
  return m;
}
std::string& StaticError() {
  static std::string e;
  return e;
}

// One node of an op as LiteRT sees it.
struct LiteNode {
  std::unique_ptr<NodeState> state;
  std::vector<TfLiteTensor> tensors;  // inputs, then outputs
  std::vector<std::string> names;
  // What the node was last prepared for: a change at run time (the real
  // dtypes arrive only with the buffers) prepares it again.
  std::vector<TfLiteType> prepared_types;
  std::vector<std::vector<int>> prepared_shapes;
  bool prepared = false;
  bool running = false;  // ResizeTensor then checks instead of resizing

  ~LiteNode() {
    for (TfLiteTensor& t : tensors) std::free(t.dims);
  }
};

// The user_data of one kernel entry: the one node it serves.
struct OpSlot {
  FusekitLiteRt* handle = nullptr;
  const KernelDef* def = nullptr;
  std::string code;   // the custom code LiteRT knows the entry by
  std::string where;  // "subgraph S operator K" ("" when registered by op name)
  std::unique_ptr<LiteNode> node;
  size_t live = 0;         // Init calls not yet matched by Destroy
  bool ambiguous = false;  // a second node was initialized on this entry
};

}  // namespace
}  // namespace fusekit

struct FusekitLiteRt {
  // One context for every node of the handle: nodes run one at a time, and
  // ResourcesFor(context) then gives them one thread pool and scratch arena.
  TfLiteContext context;
  fusekit::LiteNode* current = nullptr;
  std::vector<std::unique_ptr<fusekit::OpSlot>> slots;
  fusekit::NodeCodedModel model;  // fusekit_litert_add_model_kernels' copy
  std::mutex mutex;
  std::string error;
  size_t live_nodes = 0;
  bool released = false;
};

namespace fusekit {
namespace {

void Record(FusekitLiteRt* h, const std::string& message) {
  std::lock_guard<std::mutex> lock(h->mutex);
  if (h->error.empty()) h->error = message;
}

void ReportToHandle(TfLiteContext* context, const char* format, ...) {
  char message[768];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  std::string text(message);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  Record(static_cast<FusekitLiteRt*>(context->impl_), text);
}

TfLiteIntArray* NewDims(const int* dims, int rank) {
  auto* a = static_cast<TfLiteIntArray*>(
      std::malloc(sizeof(TfLiteIntArray) + sizeof(int) * (rank > 0 ? rank : 0)));
  if (a == nullptr) return nullptr;
  a->size = rank;
  for (int i = 0; i < rank; ++i) a->data[i] = dims[i];
  return a;
}

// During shape inference the kernel's ResizeOutput sets the output's dims;
// during a run the outputs already have LiteRT's shape, which must match.
TfLiteStatus ResizeInContext(TfLiteContext* context, TfLiteTensor* tensor,
                             TfLiteIntArray* new_size) {
  auto* h = static_cast<FusekitLiteRt*>(context->impl_);
  LiteNode* node = h->current;
  if (node != nullptr && node->running) {
    const bool same = tensor->dims != nullptr && tensor->dims->size == new_size->size &&
                      std::memcmp(tensor->dims->data, new_size->data,
                                  sizeof(int) * new_size->size) == 0;
    std::free(new_size);
    if (!same) {
      ReportToHandle(context,
                     "%s: output shape at run time differs from the shape LiteRT "
                     "allocated (the input shapes changed after the model was "
                     "compiled)",
                     node->state->def->name.c_str());
      return kTfLiteError;
    }
    return kTfLiteOk;
  }
  std::free(tensor->dims);
  tensor->dims = new_size;
  return kTfLiteOk;
}

void SetTensor(TfLiteTensor* t, TfLiteType type, const int* dims, int rank,
               const char* name) {
  std::free(t->dims);
  std::memset(t, 0, sizeof(*t));
  t->type = type;
  t->dims = NewDims(dims, rank);
  t->allocation_type = kTfLiteArenaRw;
  t->name = name;
}

std::string SlotName(const OpSlot& slot) {
  return slot.where.empty() ? slot.def->name : slot.def->name + " (" + slot.where + ")";
}

// The node a call on `slot` is for, or null (recorded) when that is not
// certain.
LiteNode* SlotNode(OpSlot* slot, const char* what) {
  if (slot->ambiguous) {
    Record(slot->handle,
           SlotName(*slot) + ": refused to " + what +
               ": LiteRT created several nodes on one kernel entry and does not say which "
               "node a call is for" +
               (slot->where.empty()
                    ? "; register the kernels with fusekit_litert_add_model_kernels, which "
                      "gives every node its own entry"
                    : " (the runtime copied the node)"));
    return nullptr;
  }
  if (slot->node == nullptr) {
    Record(slot->handle, SlotName(*slot) + ": " + what + " of a node that was never initialized");
    return nullptr;
  }
  return slot->node.get();
}

LiteRtStatus Init(void* user_data, const void* data, size_t size) {
  auto* slot = static_cast<OpSlot*>(user_data);
  if (slot->live == 0) {
    slot->node = std::make_unique<LiteNode>();
    slot->node->state = NewNodeState(slot->def, data, size);
    slot->ambiguous = false;
  } else if (!slot->ambiguous) {
    slot->ambiguous = true;
    slot->node.reset();
    SlotNode(slot, "prepare it");  // records why
  }
  ++slot->live;
  std::lock_guard<std::mutex> lock(slot->handle->mutex);
  ++slot->handle->live_nodes;
  return kLiteRtStatusOk;
}

// Binds a node's tensors to the handle's context and runs PrepareNode.
TfLiteStatus PrepareBound(FusekitLiteRt* h, LiteNode* node) {
  h->context.tensors = node->tensors.data();
  h->context.tensors_size = node->tensors.size();
  h->current = node;
  const TfLiteStatus status = PrepareNode(&h->context, node->state.get());
  node->prepared_types.clear();
  node->prepared_shapes.clear();
  for (const TfLiteTensor& t : node->tensors) {
    node->prepared_types.push_back(t.type);
    node->prepared_shapes.push_back(
        std::vector<int>(t.dims->data, t.dims->data + t.dims->size));
  }
  node->prepared = status == kTfLiteOk;
  return status;
}

void SizeNode(LiteNode* node, const KernelDef& def, size_t n_in, size_t n_out) {
  if (node->tensors.size() == n_in + n_out) return;
  for (TfLiteTensor& t : node->tensors) std::free(t.dims);
  node->tensors.assign(n_in + n_out, TfLiteTensor());
  for (TfLiteTensor& t : node->tensors) std::memset(&t, 0, sizeof(t));
  node->names.clear();
  for (size_t i = 0; i < n_in + n_out; ++i) {
    const bool in = i < n_in;
    const auto& list = in ? def.input_names : def.output_names;
    const size_t k = in ? i : i - n_in;
    node->names.push_back(k < list.size() ? list[k] : (in ? "input" : "output") +
                                                          std::to_string(k));
  }
  NodeState& s = *node->state;
  s.inputs.clear();
  s.outputs.clear();
  for (size_t i = 0; i < n_in; ++i) s.inputs.push_back(static_cast<int>(i));
  for (size_t i = 0; i < n_out; ++i) s.outputs.push_back(static_cast<int>(n_in + i));
}

LiteRtStatus GetOutputLayouts(void* user_data, size_t n_in, const LiteRtLayout* in,
                              size_t n_out, LiteRtLayout* out) {
  auto* slot = static_cast<OpSlot*>(user_data);
  FusekitLiteRt* h = slot->handle;
  // Until shape inference succeeds the outputs carry a negative dim, which
  // LiteRT's resize refuses: the node cannot be prepared silently.
  for (size_t i = 0; i < n_out; ++i) {
    std::memset(&out[i], 0, sizeof(out[i]));
    out[i].rank = 1;
    out[i].dimensions[0] = -1;
  }
  LiteNode* node = SlotNode(slot, "infer its output shapes");
  if (node == nullptr) return kLiteRtStatusErrorRuntimeFailure;
  const KernelDef& def = *slot->def;
  SizeNode(node, def, n_in, n_out);
  // The dispatcher passes layouts only; dtypes arrive with the buffers at
  // run time.  Shapes do not depend on the dtype variant, so the first
  // variant's dtypes stand in (Run prepares again with the real ones).
  const KernelVariant& guess = def.variants.front();
  for (size_t i = 0; i < n_in + n_out; ++i) {
    const bool is_in = i < n_in;
    const size_t k = is_in ? i : i - n_in;
    const auto& types = is_in ? guess.input_types : guess.output_types;
    const TfLiteType type = k < types.size() ? types[k] : kTfLiteNoType;
    if (is_in) {
      if (in[i].rank > LITERT_TENSOR_MAX_RANK) {
        Record(h, def.name + ": input '" + node->names[i] + "' has rank " +
                      std::to_string(in[i].rank) + ", more than LiteRT's " +
                      std::to_string(LITERT_TENSOR_MAX_RANK));
        return kLiteRtStatusErrorInvalidArgument;
      }
      SetTensor(&node->tensors[i], type, in[i].dimensions,
                static_cast<int>(in[i].rank), node->names[i].c_str());
    } else {
      SetTensor(&node->tensors[i], type, nullptr, 0, node->names[i].c_str());
    }
  }
  node->running = false;
  if (PrepareBound(h, node) != kTfLiteOk) return kLiteRtStatusErrorRuntimeFailure;
  for (size_t i = 0; i < n_out; ++i) {
    const TfLiteIntArray* dims = node->tensors[n_in + i].dims;
    if (dims->size > LITERT_TENSOR_MAX_RANK) {
      Record(h, def.name + ": output '" + node->names[n_in + i] + "' has rank " +
                    std::to_string(dims->size) + ", more than LiteRT's " +
                    std::to_string(LITERT_TENSOR_MAX_RANK));
      return kLiteRtStatusErrorInvalidArgument;
    }
    out[i].rank = static_cast<unsigned>(dims->size);
    for (int d = 0; d < dims->size; ++d) out[i].dimensions[d] = dims->data[d];
  }
  return kLiteRtStatusOk;
}

// Locks every buffer for the length of one Run and unlocks on every path.
class Locks {
 public:
  explicit Locks(const LiteRtApi& api) : api_(api) {}
  ~Locks() {
    for (LiteRtTensorBuffer b : locked_) api_.unlock(b);
  }
  void* Lock(LiteRtTensorBuffer b, LiteRtTensorBufferLockMode mode) {
    void* addr = nullptr;
    if (api_.lock(b, &addr, mode) != kLiteRtStatusOk) return nullptr;
    locked_.push_back(b);
    return addr;
  }

 private:
  const LiteRtApi& api_;
  std::vector<LiteRtTensorBuffer> locked_;
};

LiteRtStatus Run(void* user_data, size_t n_in, const LiteRtTensorBuffer* inputs,
                 size_t n_out, LiteRtTensorBuffer* outputs) {
  auto* slot = static_cast<OpSlot*>(user_data);
  FusekitLiteRt* h = slot->handle;
  const KernelDef& def = *slot->def;
  const LiteRtApi& api = Api();
  LiteNode* node = SlotNode(slot, "run it");
  if (node == nullptr) return kLiteRtStatusErrorRuntimeFailure;
  if (node->tensors.size() != n_in + n_out) {
    Record(h, def.name + ": run with " + std::to_string(n_in) + " inputs and " +
                  std::to_string(n_out) +
                  " outputs does not match the node it was prepared as");
    return kLiteRtStatusErrorRuntimeFailure;
  }
  Locks locks(api);
  bool changed = !node->prepared;
  for (size_t i = 0; i < n_in + n_out; ++i) {
    const bool is_in = i < n_in;
    LiteRtTensorBuffer b = is_in ? inputs[i] : outputs[i - n_in];
    LiteRtRankedTensorType type;
    size_t size = 0;
    if (b == nullptr || api.tensor_type(b, &type) != kLiteRtStatusOk ||
        api.buffer_size(b, &size) != kLiteRtStatusOk) {
      Record(h, def.name + ": " + (is_in ? "input '" : "output '") + node->names[i] +
                    "' has no usable LiteRT tensor buffer");
      return kLiteRtStatusErrorRuntimeFailure;
    }
    void* addr = locks.Lock(b, is_in ? kLiteRtTensorBufferLockModeRead
                                     : kLiteRtTensorBufferLockModeWrite);
    if (addr == nullptr) {
      Record(h, def.name + ": could not lock the host memory of " +
                    (is_in ? "input '" : "output '") + node->names[i] + "'");
      return kLiteRtStatusErrorRuntimeFailure;
    }
    const int rank = static_cast<int>(type.layout.rank);
    const std::vector<int> shape(type.layout.dimensions, type.layout.dimensions + rank);
    TfLiteTensor& t = node->tensors[i];
    const TfLiteType dtype = static_cast<TfLiteType>(type.element_type);
    if (i >= node->prepared_shapes.size() || node->prepared_shapes[i] != shape ||
        node->prepared_types[i] != dtype) {
      changed = true;
    }
    SetTensor(&t, dtype, shape.data(), rank, node->names[i].c_str());
    t.data = addr;
    t.bytes = size;
  }
  if (changed) {
    // Real dtypes (or shapes) differ from the ones shape inference assumed:
    // prepare again against the live buffers; outputs must keep LiteRT's
    // shape.
    node->running = true;
    if (PrepareBound(h, node) != kTfLiteOk) return kLiteRtStatusErrorRuntimeFailure;
  }
  h->context.tensors = node->tensors.data();
  h->context.tensors_size = node->tensors.size();
  h->current = node;
  node->running = true;
  return InvokeNode(&h->context, node->state.get()) == kTfLiteOk
             ? kLiteRtStatusOk
             : kLiteRtStatusErrorRuntimeFailure;
}

void DeleteIfDone(FusekitLiteRt* h) {
  bool done;
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    done = h->released && h->live_nodes == 0;
  }
  if (done) delete h;
}

LiteRtStatus Destroy(void* user_data) {
  auto* slot = static_cast<OpSlot*>(user_data);
  FusekitLiteRt* h = slot->handle;
  if (slot->live > 0 && --slot->live == 0) {
    slot->node.reset();
    slot->ambiguous = false;
  }
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    if (h->live_nodes > 0) --h->live_nodes;
  }
  DeleteIfDone(h);
  return kLiteRtStatusOk;
}

const LiteRtCustomOpKernel kKernelTable = {Init, GetOutputLayouts, Run, Destroy};

void SetStaticError(const std::string& e) {
  std::lock_guard<std::mutex> lock(StaticErrorMutex());
  StaticError() = e;
}

}  // namespace
}  // namespace fusekit

namespace fusekit {
namespace {

// The checks every entry point runs before it registers anything; "" when
// the library can serve LiteRT.
std::string Unusable(LiteRtOptions options) {
  if (options == nullptr) return "options is NULL";
  if (!Api().error.empty()) return Api().error;
  if (!RegistryError().empty()) return "fusekit plugin is unusable: " + RegistryError();
  return std::string();
}

FusekitLiteRt* NewHandle(int num_threads) {
  auto* h = new FusekitLiteRt();
  std::memset(&h->context, 0, sizeof(h->context));
  h->context.impl_ = h;
  h->context.ResizeTensor = ResizeInContext;
  h->context.ReportError = ReportToHandle;
  h->context.recommended_num_threads = num_threads > 0 ? num_threads : 1;
  return h;
}

// Registers one kernel entry, LiteRT's custom code `code`, served by `def`.
bool AddEntry(FusekitLiteRt* h, LiteRtOptions options, const KernelDef* def,
              const std::string& code, int version, const std::string& where,
              const char* entry_point) {
  auto slot = std::make_unique<OpSlot>();
  slot->handle = h;
  slot->def = def;
  slot->code = code;
  slot->where = where;
  // LiteRT copies the kernel table and the name; the slot must outlive the
  // compiled model (the handle keeps it until release and the last Destroy).
  const LiteRtStatus status =
      Api().add_custom_op(options, code.c_str(), version, &kKernelTable, slot.get());
  // Entries added before stay registered on `options`: keep every slot.
  h->slots.push_back(std::move(slot));
  if (status == kLiteRtStatusOk) return true;
  SetStaticError(std::string(entry_point) + ": LiteRtAddCustomOpKernelOption(" + code +
                 ") failed with status " + std::to_string(status));
  h->released = true;  // leaked on purpose: `options` still points at the slots
  return false;
}

}  // namespace
}  // namespace fusekit

extern "C" FUSEKIT_LITERT_API FusekitLiteRt* fusekit_litert_add_model_kernels(
    LiteRtOptions options, const void* model, size_t size, int num_threads) {
  using namespace fusekit;
  const char* kEntry = "fusekit_litert_add_model_kernels";
  const std::string unusable = Unusable(options);
  if (!unusable.empty()) {
    SetStaticError(std::string(kEntry) + ": " + unusable);
    return nullptr;
  }
  const std::string problem = CheckModelForLiteRt(static_cast<const uint8_t*>(model), size);
  if (!problem.empty()) {
    SetStaticError(problem);
    return nullptr;
  }
  NodeCodedModel coded =
      GiveNodesOwnCodes(static_cast<const uint8_t*>(model), size,
                        [](const std::string& op) { return FindKernel(op.c_str()) != nullptr; });
  if (!coded.error.empty()) {
    SetStaticError(std::string(kEntry) + ": " + coded.error);
    return nullptr;
  }
  FusekitLiteRt* h = NewHandle(num_threads);
  h->model = std::move(coded);
  for (const CodedNode& node : h->model.nodes) {
    const std::string where =
        "subgraph " + std::to_string(node.subgraph) + " operator " + std::to_string(node.op_index);
    if (!AddEntry(h, options, FindKernel(node.op.c_str()), node.code, node.version, where,
                  kEntry)) {
      return nullptr;
    }
  }
  return h;
}

extern "C" FUSEKIT_LITERT_API const void* fusekit_litert_model_data(
    const FusekitLiteRt* handle) {
  return handle == nullptr ? nullptr : handle->model.data.get();
}

extern "C" FUSEKIT_LITERT_API size_t fusekit_litert_model_size(const FusekitLiteRt* handle) {
  return handle == nullptr ? 0 : handle->model.size;
}

extern "C" FUSEKIT_LITERT_API FusekitLiteRt* fusekit_litert_add_kernels(
    LiteRtOptions options, const char* const* ops_or_null, int num_threads) {
  using namespace fusekit;
  const char* kEntry = "fusekit_litert_add_kernels";
  const std::string unusable = Unusable(options);
  if (!unusable.empty()) {
    SetStaticError(std::string(kEntry) + ": " + unusable);
    return nullptr;
  }
  std::vector<const KernelDef*> defs;
  if (ops_or_null == nullptr) {
    for (const KernelDef& d : KernelRegistry()) defs.push_back(&d);
  } else {
    for (const char* const* op = ops_or_null; *op != nullptr; ++op) {
      const KernelDef* d = FindKernel(*op);
      if (d == nullptr) {
        std::string known;
        for (const KernelDef& k : KernelRegistry()) known += (known.empty() ? "" : ", ") + k.name;
        SetStaticError(std::string(kEntry) + ": no kernel named '" + *op +
                       "' in this library (it has: " + known + ")");
        return nullptr;
      }
      defs.push_back(d);
    }
  }
  FusekitLiteRt* h = NewHandle(num_threads);
  for (const KernelDef* d : defs) {
    if (!AddEntry(h, options, d, d->name, 1, std::string(), kEntry)) return nullptr;
  }
  return h;
}

extern "C" FUSEKIT_LITERT_API LiteRtStatus fusekit_litert_check_model(const void* data,
                                                                    size_t size) {
  const std::string problem =
      fusekit::CheckModelForLiteRt(static_cast<const uint8_t*>(data), size);
  if (problem.empty()) return kLiteRtStatusOk;
  fusekit::SetStaticError(problem);
  return kLiteRtStatusErrorInvalidArgument;
}

extern "C" FUSEKIT_LITERT_API const char* fusekit_litert_last_error(
    const FusekitLiteRt* handle) {
  if (handle == nullptr) {
    std::lock_guard<std::mutex> lock(fusekit::StaticErrorMutex());
    return fusekit::StaticError().empty() ? nullptr : fusekit::StaticError().c_str();
  }
  auto* h = const_cast<FusekitLiteRt*>(handle);
  std::lock_guard<std::mutex> lock(h->mutex);
  return h->error.empty() ? nullptr : h->error.c_str();
}

extern "C" FUSEKIT_LITERT_API void fusekit_litert_clear_error(FusekitLiteRt* handle) {
  if (handle == nullptr) return;
  std::lock_guard<std::mutex> lock(handle->mutex);
  handle->error.clear();
}

extern "C" FUSEKIT_LITERT_API void fusekit_litert_release(FusekitLiteRt* handle) {
  if (handle == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(handle->mutex);
    handle->released = true;
  }
  fusekit::DeleteIfDone(handle);
}
