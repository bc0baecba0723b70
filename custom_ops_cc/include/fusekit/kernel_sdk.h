// fusekit kernel SDK: the only way fusekit kernels are written.
//
// A kernel sees typed tensor views, its attrs (read by key from the flexbuffer
// custom options the converter wrote), and a context to resize outputs, get
// scratch memory and report errors that name the op.  It knows nothing about
// how it reaches a runtime: the delegate plugin and the resolver adapter turn
// the registry of kernels into what each runtime takes.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusekit/tflite_abi.h"

// Bumped whenever a struct or function below changes in a way that breaks
// plugins built against an older header.
#define FUSEKIT_ABI_VERSION 1

namespace fusekit {

// A float16 value as stored in a TFLite tensor (raw IEEE half bits).
struct Half {
  uint16_t bits;
};

template <typename T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr TfLiteType value = kTfLiteFloat32;
};
template <>
struct TypeOf<int32_t> {
  static constexpr TfLiteType value = kTfLiteInt32;
};
template <>
struct TypeOf<int64_t> {
  static constexpr TfLiteType value = kTfLiteInt64;
};
template <>
struct TypeOf<int8_t> {
  static constexpr TfLiteType value = kTfLiteInt8;
};
template <>
struct TypeOf<uint8_t> {
  static constexpr TfLiteType value = kTfLiteUInt8;
};
template <>
struct TypeOf<Half> {
  static constexpr TfLiteType value = kTfLiteFloat16;
};

const char* TypeName(TfLiteType type);

// A non-owning view of one tensor of the node.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(TfLiteTensor* t) : t_(t) {}

  bool present() const { return t_ != nullptr; }
  TfLiteType type() const { return t_->type; }
  int rank() const { return t_->dims ? t_->dims->size : 0; }
  int dim(int i) const {
    return t_->dims->data[i < 0 ? rank() + i : i];
  }
  std::vector<int> shape() const {
    std::vector<int> s(rank());
    for (int i = 0; i < rank(); ++i) s[i] = t_->dims->data[i];
    return s;
  }
  int64_t num_elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank(); ++i) n *= t_->dims->data[i];
    return n;
  }
  // Constant tensors (weights) are read-only memory mapped from the model.
  bool is_constant() const { return t_->allocation_type == kTfLiteMmapRo; }
  const char* name() const { return t_->name ? t_->name : "?"; }

  // Typed access; the kernel checks the dtype in Prepare (see OpContext).
  template <typename T>
  T* data() const {
    return static_cast<T*>(FusekitTensorData(t_));
  }
  void* raw() const { return FusekitTensorData(t_); }
  size_t bytes() const { return t_->bytes; }
  TfLiteTensor* raw_tensor() const { return t_; }

 private:
  TfLiteTensor* t_ = nullptr;
};

// Attrs of one node, parsed from the flexbuffer map in its custom options.
// Reading a key that is absent returns the default; a key of the wrong type
// is an error reported by the Get call (ok() turns false, error() says why).
class Attrs {
 public:
  Attrs() = default;
  Attrs(const void* data, size_t size);

  // False when the custom options are not a flexbuffer map.
  bool valid() const { return valid_; }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  bool Has(const char* key) const;
  std::vector<std::string> Keys() const;

  double GetFloat(const char* key, double default_value) const;
  int64_t GetInt(const char* key, int64_t default_value) const;
  bool GetBool(const char* key, bool default_value) const;
  std::string GetString(const char* key,
                        const std::string& default_value) const;
  std::vector<int64_t> GetInts(const char* key,
                               std::vector<int64_t> default_value = {}) const;
  std::vector<double> GetFloats(const char* key,
                                std::vector<double> default_value = {}) const;
  std::vector<bool> GetBools(const char* key,
                             std::vector<bool> default_value = {}) const;
  std::vector<std::string> GetStrings(
      const char* key, std::vector<std::string> default_value = {}) const;

 private:
  // The options are copied so that flexbuffer reads are aligned and outlive
  // the model buffer.
  std::vector<uint8_t> buffer_;
  bool valid_ = false;
  mutable std::string error_;
};

class Kernel;
struct NodeState;

// What a kernel sees of its node while it prepares or runs.
class OpContext {
 public:
  OpContext(TfLiteContext* context, NodeState* state)
      : context_(context), state_(state) {}

  const char* op_name() const;
  int num_inputs() const;
  int num_outputs() const;
  Tensor input(int i) const;
  Tensor output(int i) const;
  const Attrs& attrs() const;

  // The interpreter's thread count (num_threads), at least 1.
  int num_threads() const;

  // Sets output i's shape; the runtime allocates it before Invoke.
  TfLiteStatus ResizeOutput(int i, const std::vector<int>& dims);

  // Per-node scratch memory kept across invocations, grown on demand and
  // 64-byte aligned.
  void* Scratch(size_t bytes);

  // Reports "<op name>: <message>" through the runtime and returns
  // kTfLiteError, so kernels write `return ctx.Fail("...", ...)`.
  TfLiteStatus Fail(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));

  // Checks shared by most kernels, each reporting a message naming the op.
  TfLiteStatus ExpectType(const Tensor& t, const char* what,
                          TfLiteType type) const;
  TfLiteStatus ExpectRankAtLeast(const Tensor& t, const char* what,
                                 int rank) const;

  TfLiteContext* tflite_context() const { return context_; }

 private:
  TfLiteContext* context_;
  NodeState* state_;
};

// A kernel instance lives as long as its node; it is created from the node's
// attrs and may precompute from them.
class Kernel {
 public:
  virtual ~Kernel() = default;
  // Checks inputs (dtype, rank, shape) and sets output shapes.
  virtual TfLiteStatus Prepare(OpContext& ctx) = 0;
  virtual TfLiteStatus Invoke(OpContext& ctx) = 0;
};

// How a runtime may call a kernel: declared arity and the constructor.
struct KernelDef {
  const char* name;
  int min_inputs;
  int max_inputs;
  int num_outputs;
  // Returns nullptr and sets *error when the attrs are unusable.
  std::unique_ptr<Kernel> (*create)(const Attrs& attrs, std::string* error);
};

// The kernels compiled into this library.
std::vector<KernelDef>& KernelRegistry();
const KernelDef* FindKernel(const char* name);

struct KernelRegistrar {
  explicit KernelRegistrar(const KernelDef& def);
};

// Default constructor adapter for kernels built as `Class(const Attrs&,
// std::string* error)`.
template <typename K>
std::unique_ptr<Kernel> CreateKernel(const Attrs& attrs, std::string* error) {
  auto kernel = std::make_unique<K>(attrs, error);
  if (!error->empty()) return nullptr;
  return kernel;
}

}  // namespace fusekit

#define FUSEKIT_CONCAT_INNER(a, b) a##b
#define FUSEKIT_CONCAT(a, b) FUSEKIT_CONCAT_INNER(a, b)

// Registers `Class` as the kernel of custom op `name` taking between
// `min_inputs` and `max_inputs` inputs and producing `num_outputs` outputs.
#define FUSEKIT_REGISTER_KERNEL(name, Class, min_inputs, max_inputs,       \
                                num_outputs)                               \
  static ::fusekit::KernelRegistrar FUSEKIT_CONCAT(fusekit_registrar_,     \
                                                   __COUNTER__)(           \
      ::fusekit::KernelDef{name, min_inputs, max_inputs, num_outputs,      \
                           &::fusekit::CreateKernel<Class>})
