// fusekit kernel SDK: the only way fusekit kernels are written.
//
// A kernel is a class whose Prepare and Invoke take typed tensor views; their
// parameter lists ARE the kernel's schema (in the manner of
// onnxruntime-extensions' lite custom ops):
//
//   class RmsNorm {
//    public:
//     RmsNorm(const fusekit::Attrs& attrs, std::string* error);
//     TfLiteStatus Prepare(fusekit::OpContext& ctx, fusekit::In<float> x,
//                          fusekit::In<float> gamma, fusekit::Out<float> y);
//     TfLiteStatus Invoke(fusekit::OpContext& ctx, fusekit::In<float> x,
//                         fusekit::In<float> gamma, fusekit::Out<float> y);
//   };
//   FUSEKIT_REGISTER_KERNEL("fusekit_rms_norm", RmsNorm,
//                           fusekit::Inputs("x", "gamma"),
//                           fusekit::Outputs("y"),
//                           fusekit::AttrSchema(fusekit::attr::Float("epsilon", 1e-6)));
//
// From that declaration the SDK checks, before the kernel sees a node: arity,
// the dtype of every input and output, attrs against their declared types
// and ranges (at init), the options format version, tensor indices, shapes
// (no negative dims, no element-count overflow; the rank and vector rules an
// OperandSpec declares) and, before every Invoke, that each tensor the
// kernel touches has memory of the right size.  The declaration is exported
// (fusekit_kernel_schema) and is the op's one spec: Python checks attrs and
// writes custom options through it.  A kernel that trusts its views cannot crash
// on a malformed model.  Registering the same name with another template
// instance (RmsNorm<Half>) adds a dtype variant; the node's dtypes pick one.
//
// Kernels know nothing about how they reach a runtime: the delegate plugin
// and the resolver adapter turn the registry into what each runtime takes.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusekit/tflite_abi.h"

// Bumped whenever a struct or function below changes in a way that breaks
// plugins built against an older header.
#define FUSEKIT_ABI_VERSION 2

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
struct TypeOf<int16_t> {
  static constexpr TfLiteType value = kTfLiteInt16;
};
template <>
struct TypeOf<bool> {
  static constexpr TfLiteType value = kTfLiteBool;
};
template <>
struct TypeOf<Half> {
  static constexpr TfLiteType value = kTfLiteFloat16;
};

// "float32", "int8", ...; "type <n>" style names for values no runtime uses.
const char* TypeName(TfLiteType type);
// Bytes per element, 0 for types without a fixed size (string, int4, ...).
size_t TypeSize(TfLiteType type);

// Affine quantization of a tensor: real = scale * (q - zero_point), one
// (scale, zero_point) per tensor or one per index of `axis`.
struct QuantParams {
  const float* scales = nullptr;
  const int32_t* zero_points = nullptr;  // may be null: all zero
  int count = 0;                         // 0: not quantized
  int axis = -1;                         // -1: per tensor
};

// A non-owning view of one tensor of the node.
class Tensor {
 public:
  Tensor() = default;
  Tensor(TfLiteTensor* t, int position, void* data_override = nullptr)
      : t_(t), data_override_(data_override), position_(position) {}

  // An absent optional input (index -1) is a view of no tensor: every
  // accessor below answers as for an empty tensor instead of dereferencing.
  bool present() const { return t_ != nullptr; }
  // The operand position (input or output index) this view was made for.
  int position() const { return position_; }
  TfLiteType type() const { return t_ ? t_->type : kTfLiteNoType; }
  int rank() const { return t_ && t_->dims ? t_->dims->size : 0; }
  // Dimension i (negative counts from the end); 0 when i is out of range.
  int dim(int i) const {
    const int r = rank();
    if (i < 0) i += r;
    return (i < 0 || i >= r) ? 0 : t_->dims->data[i];
  }
  std::vector<int> shape() const {
    std::vector<int> s(rank());
    for (int i = 0; i < rank(); ++i) s[i] = t_->dims->data[i];
    return s;
  }
  // Product of dims; -1 when a dim is negative or the product overflows
  // (the SDK rejects such tensors before a kernel sees them); 0 when absent.
  int64_t num_elements() const;
  // Constant tensors (weights) are read-only memory mapped from the model.
  bool is_constant() const { return t_ && t_->allocation_type == kTfLiteMmapRo; }
  const char* name() const { return t_ && t_->name ? t_->name : "?"; }

  // Typed access: nullptr when T is not the tensor's dtype (the typed views
  // In/Out/Opt below never hit that: the SDK checked the dtype).
  template <typename T>
  T* data() const {
    if (t_ == nullptr || t_->type != TypeOf<T>::value) return nullptr;
    return static_cast<T*>(raw());
  }
  void* raw() const {
    if (data_override_) return data_override_;
    return t_ ? FusekitTensorData(t_) : nullptr;
  }
  size_t bytes() const { return t_ ? t_->bytes : 0; }
  TfLiteTensor* raw_tensor() const { return t_; }

  // Quantization (count == 0 when the tensor is not affine-quantized).
  QuantParams quantization() const;
  float scale() const { return t_ ? t_->params.scale : 0.0f; }
  int32_t zero_point() const { return t_ ? t_->params.zero_point : 0; }

 private:
  TfLiteTensor* t_ = nullptr;
  void* data_override_ = nullptr;
  int position_ = -1;
};

// Typed views.  In<T>: a required input of dtype T.  Opt<T>: an optional
// input (absent when the node has fewer inputs or lists index -1; check
// present()).  Out<T>: an output.  The parameter types of a kernel's
// Invoke declare its schema.
template <typename T>
class In : public Tensor {
 public:
  using Tensor::Tensor;
  explicit In(const Tensor& t) : Tensor(t) {}
  const T* data() const { return static_cast<const T*>(raw()); }
};
template <typename T>
class Opt : public Tensor {
 public:
  using Tensor::Tensor;
  explicit Opt(const Tensor& t) : Tensor(t) {}
  const T* data() const { return present() ? static_cast<const T*>(raw()) : nullptr; }
};
template <typename T>
class Out : public Tensor {
 public:
  using Tensor::Tensor;
  explicit Out(const Tensor& t) : Tensor(t) {}
  T* data() const { return static_cast<T*>(raw()); }
};

// ------------------------------------------------------------------ attrs

enum class AttrType { kInt, kFloat, kBool, kString, kInts, kFloats, kBools, kStrings };
const char* AttrTypeName(AttrType type);

// One declared attr: its name, type, default (or required, or optional
// without a default) and, for numbers, the range it must lie in.  Every float
// attr must be finite.
struct AttrSpec {
  const char* name;
  AttrType type;
  bool required;
  double number_default;       // int, float, bool
  const char* string_default;  // string
  // False: an optional attr without a default; absent means absent (check
  // Has() before reading it), never a sentinel value.
  bool has_default = true;
  double min = -HUGE_VAL;  // int and float: the inclusive range
  double max = HUGE_VAL;

  // The attr must be >= / <= the bound (checked at node init, exported with
  // the schema so that Python checks it before writing a model).
  AttrSpec Min(double bound) const {
    AttrSpec spec = *this;
    spec.min = bound;
    return spec;
  }
  AttrSpec Max(double bound) const {
    AttrSpec spec = *this;
    spec.max = bound;
    return spec;
  }
};

namespace attr {
inline AttrSpec Float(const char* name, double default_value) {
  return {name, AttrType::kFloat, false, default_value, ""};
}
inline AttrSpec Int(const char* name, int64_t default_value) {
  return {name, AttrType::kInt, false, static_cast<double>(default_value), ""};
}
inline AttrSpec Bool(const char* name, bool default_value) {
  return {name, AttrType::kBool, false, default_value ? 1.0 : 0.0, ""};
}
inline AttrSpec String(const char* name, const char* default_value) {
  return {name, AttrType::kString, false, 0.0, default_value};
}
// Optional numbers and strings without a default: a node either carries
// them or not.
inline AttrSpec Float(const char* name) {
  AttrSpec spec{name, AttrType::kFloat, false, 0.0, ""};
  spec.has_default = false;
  return spec;
}
inline AttrSpec Int(const char* name) {
  AttrSpec spec{name, AttrType::kInt, false, 0.0, ""};
  spec.has_default = false;
  return spec;
}
inline AttrSpec String(const char* name) {
  AttrSpec spec{name, AttrType::kString, false, 0.0, ""};
  spec.has_default = false;
  return spec;
}
// Lists default to empty.
inline AttrSpec Ints(const char* name) { return {name, AttrType::kInts, false, 0.0, ""}; }
inline AttrSpec Floats(const char* name) { return {name, AttrType::kFloats, false, 0.0, ""}; }
inline AttrSpec Bools(const char* name) { return {name, AttrType::kBools, false, 0.0, ""}; }
inline AttrSpec Strings(const char* name) { return {name, AttrType::kStrings, false, 0.0, ""}; }
// An attr the node must carry.
inline AttrSpec Required(AttrSpec spec) {
  spec.required = true;
  spec.has_default = false;
  return spec;
}
}  // namespace attr

// Attrs of one node, parsed from the flexbuffer map in its custom options
// and validated against the kernel's AttrSchema at node init (a missing
// required attr or a wrong type never reaches the kernel).  The typed getters
// return the node's value or the declared default.  Reading a key the schema
// does not declare (a typo: Float("epsilom")) fails the node's init with an
// error naming the op and the key, instead of reading a silent zero.
class Attrs {
 public:
  Attrs() = default;
  Attrs(const void* data, size_t size);

  // False when the custom options are not a flexbuffer map (error() says why).
  bool valid() const { return valid_; }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  bool Has(const char* key) const;
  std::vector<std::string> Keys() const;

  // The format version of the options (the reserved key "options_version";
  // 1 when absent).  Read by the SDK, never declared by a kernel.
  int64_t FormatVersion() const;
  // A bool of an older options format that the current schema no longer
  // declares (read by the SDK to map version-1 nodes); `fallback` when
  // absent.  A value of another type sets *error.
  bool LegacyBool(const char* key, bool fallback, std::string* error = nullptr) const;

  // Declared attrs (defaults come from the schema; an optional attr without
  // a default reads as the type's zero when absent: check Has() first).
  double Float(const char* key) const;
  int64_t Int(const char* key) const;
  bool Bool(const char* key) const;
  std::string String(const char* key) const;
  std::vector<int64_t> Ints(const char* key) const;
  std::vector<double> Floats(const char* key) const;
  std::vector<bool> Bools(const char* key) const;
  std::vector<std::string> Strings(const char* key) const;

  // Checks every declared attr present in the map against its type and every
  // required one for presence; returns false with error() set otherwise.
  bool Validate(const std::vector<AttrSpec>* schema);

  // After Validate: why a getter or Has() was given a key the schema does
  // not declare (the first such key), else empty.  The SDK fails the node
  // with it after the kernel's constructor, Prepare and Invoke.
  const std::string& undeclared() const { return undeclared_; }

 private:
  const AttrSpec* Spec(const char* key) const;
  // Records `key` in undeclared_ when a schema is set and lacks it.
  void CheckDeclared(const char* key) const;
  mutable std::string undeclared_;
  std::vector<uint8_t> buffer_;  // copied: aligned reads, outlives the model
  bool valid_ = false;
  std::string error_;
  const std::vector<AttrSpec>* schema_ = nullptr;
};

// ---------------------------------------------------------------- scratch

// An array of T in a kernel's scratch (see ScratchLayout): `copies` arrays
// of `count` elements, `stride` bytes apart, at `offset` in the block.
template <typename T>
struct ScratchArray {
  size_t offset = 0;
  size_t stride = 0;
  int64_t count = 0;
  int64_t copies = 0;
  // Copy `copy` (e.g. a worker's own) of the array in the block `base`
  // that OpContext::Scratch(layout) returned.
  T* operator()(void* base, int64_t copy = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset +
                                stride * static_cast<size_t>(copy));
  }
};

// The typed layout of a kernel's scratch memory, computed from the shapes
// (in Prepare, and again in Invoke: the same shapes give the same layout).
// Every array starts on a 64-byte boundary (a cache line; the widest SIMD
// vector), so arrays of different threads never share a line.
//
//   ScratchLayout layout;
//   const auto rows = layout.Add<float>(n);                  // one array
//   const auto acc = layout.Add<double>(m, ctx.num_threads());  // one per worker
//   void* base = ctx.Scratch(layout);  // nullptr: out of memory
//   float* r = rows(base);
//   double* mine = acc(base, worker);
//
// A negative count or a size past size_t makes the layout unusable:
// bytes() is SIZE_MAX and OpContext::Scratch(layout) returns nullptr,
// which kernels report as out of memory, rather than a short block.
class ScratchLayout {
 public:
  static constexpr size_t kAlign = 64;

  template <typename T>
  ScratchArray<T> Add(int64_t count, int64_t copies = 1) {
    static_assert(alignof(T) <= kAlign, "scratch arrays are 64-byte aligned");
    ScratchArray<T> a;
    a.count = count;
    a.copies = copies;
    if (count < 0 || copies < 0 ||
        (count > 0 && static_cast<uint64_t>(count) > (SIZE_MAX - kAlign) / sizeof(T))) {
      overflow_ = true;
      return a;
    }
    a.stride = RoundUp(static_cast<size_t>(count) * sizeof(T));
    a.offset = bytes_;
    if (copies > 0 && a.stride > 0 &&
        static_cast<uint64_t>(copies) > (SIZE_MAX - bytes_) / a.stride) {
      overflow_ = true;
      return a;
    }
    bytes_ += a.stride * static_cast<size_t>(copies);
    return a;
  }

  // The block's size; SIZE_MAX when an array could not be laid out.
  size_t bytes() const { return overflow_ ? SIZE_MAX : bytes_; }

 private:
  static size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  size_t bytes_ = 0;
  bool overflow_ = false;
};

// ---------------------------------------------------------------- context

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

  // Runs fn(begin, end) or fn(begin, end, worker) over [0, n) in chunks of
  // at least `grain` items on the interpreter's thread pool (the caller
  // takes part; worker < num_threads() indexes per-thread scratch).
  template <typename F>
  void ParallelFor(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    RunParallel(n, grain,
                [](void* f, int64_t b, int64_t e, int worker) {
                  Fn& call = *static_cast<Fn*>(f);
                  if constexpr (std::is_invocable_v<Fn&, int64_t, int64_t, int>) {
                    call(b, e, worker);
                  } else {
                    (void)worker;
                    call(b, e);
                  }
                },
                const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Sets an output's shape; the runtime allocates it before Invoke.
  TfLiteStatus ResizeOutput(int i, const std::vector<int>& dims);
  TfLiteStatus ResizeOutput(const Tensor& out, const std::vector<int>& dims) {
    return ResizeOutput(out.position(), dims);
  }

  // Makes output `out` a view of input `in`'s memory from `byte_offset` on,
  // for kernels that update a buffer in place (a KV cache): the runtime
  // then gives the output no memory of its own, and before every Invoke the
  // SDK points it at the input's data + byte_offset (checked to fit).  Call
  // in Prepare, after ResizeOutput.  Returns false where a runtime hands
  // kernels output buffers of their own (LiteRT's CompiledModel) and for a
  // constant input (read-only model memory): the kernel must then write the
  // output itself.  In Invoke, `out.raw() ==
  // in.raw() + byte_offset` tells which case holds.
  bool AliasOutput(const Tensor& out, const Tensor& in, size_t byte_offset);

  // Scratch memory shared by every fusekit node of the interpreter (only one
  // node runs at a time), 64-byte aligned, grown on demand and kept.  The
  // contents do not survive to the next Invoke.  Ask in Prepare to allocate
  // early; nullptr when out of memory.
  void* Scratch(size_t bytes);
  // The block for a typed layout (nullptr when out of memory or when the
  // layout overflowed); its arrays are found with ScratchArray's operator().
  void* Scratch(const ScratchLayout& layout) {
    return layout.bytes() == SIZE_MAX ? nullptr : Scratch(layout.bytes());
  }

  // Reports "<op name>: <message>" through the runtime and returns
  // kTfLiteError, so kernels write `return ctx.Fail("...", ...)`.
  TfLiteStatus Fail(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));

  TfLiteContext* tflite_context() const { return context_; }

 private:
  void RunParallel(int64_t n, int64_t grain,
                   void (*fn)(void*, int64_t, int64_t, int), void* arg);
  TfLiteContext* context_;
  NodeState* state_;
};

// Fails the calling Prepare/Invoke with a message naming the op when `cond`
// does not hold: FUSEKIT_ENSURE(ctx, x.rank() >= 1, "x must ...", ...).
#define FUSEKIT_ENSURE(ctx, cond, ...)                       \
  do {                                                       \
    if (!(cond)) return (ctx).Fail(__VA_ARGS__);             \
  } while (0)
// Propagates a non-ok status.
#define FUSEKIT_ENSURE_OK(expr)                              \
  do {                                                       \
    const TfLiteStatus fusekit_status_ = (expr);             \
    if (fusekit_status_ != kTfLiteOk) return fusekit_status_; \
  } while (0)

// Comparisons that print both values when they fail:
//   FUSEKIT_ENSURE_EQ(ctx, gamma.dim(0), x.dim(-1));
//   FUSEKIT_ENSURE_LE(ctx, rotary_dim_, x.dim(-1), "rotary_dim");
// fail with "<op>: rotary_dim: expected rotary_dim_ <= x.dim(-1), got 96 vs 64".
// The optional trailing arguments are a printf format and its values, put
// before the comparison.  Each operand is evaluated once.  Values print as
// numbers, bools, strings or lists ({1, 2}) of those.
#define FUSEKIT_ENSURE_EQ(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, ==, "" __VA_ARGS__)
#define FUSEKIT_ENSURE_NE(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, !=, "" __VA_ARGS__)
#define FUSEKIT_ENSURE_LT(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, <, "" __VA_ARGS__)
#define FUSEKIT_ENSURE_LE(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, <=, "" __VA_ARGS__)
#define FUSEKIT_ENSURE_GT(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, >, "" __VA_ARGS__)
#define FUSEKIT_ENSURE_GE(ctx, a, b, ...) FUSEKIT_ENSURE_CMP_(ctx, a, b, >=, "" __VA_ARGS__)
// (The format is "" when none is given: GCC's zero-length format warning is
// off for the call, the format is still checked otherwise.)
#define FUSEKIT_ENSURE_CMP_(ctx, a, b, op, ...)                                     \
  do {                                                                              \
    const auto& fusekit_a_ = (a);                                                   \
    const auto& fusekit_b_ = (b);                                                   \
    if (!(fusekit_a_ op fusekit_b_)) {                                              \
      _Pragma("GCC diagnostic push")                                                \
      _Pragma("GCC diagnostic ignored \"-Wformat-zero-length\"")                    \
      return ::fusekit::internal::FailComparison(                                   \
          (ctx), #a " " #op " " #b, ::fusekit::internal::ValueText(fusekit_a_),     \
          ::fusekit::internal::ValueText(fusekit_b_), __VA_ARGS__);                 \
      _Pragma("GCC diagnostic pop")                                                 \
    }                                                                               \
  } while (0)

namespace internal {

// How FUSEKIT_ENSURE_EQ and friends print a value.
inline std::string NumberText(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", value);
  return text;
}
inline std::string ValueText(bool value) { return value ? "true" : "false"; }
inline std::string ValueText(const char* value) { return std::string("\"") + value + "\""; }
inline std::string ValueText(const std::string& value) { return ValueText(value.c_str()); }
template <typename T>
std::string ValueText(const T& value) {
  if constexpr (std::is_floating_point_v<T>) {
    return NumberText(static_cast<double>(value));
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(value));
  } else {
    // A container: {a, b, ...}.
    std::string text = "{";
    bool first = true;
    for (const auto& element : value) {
      if (!first) text += ", ";
      text += ValueText(element);
      first = false;
    }
    return text + "}";
  }
}

// Fails with "<op>: [<context>: ]expected <expression>, got <a> vs <b>";
// `format` (possibly "") and its values give the context.
inline TfLiteStatus FailComparison(const OpContext& ctx, const char* expression,
                                   const std::string& a, const std::string& b,
                                   const char* format, ...)
    __attribute__((format(printf, 5, 6)));
inline TfLiteStatus FailComparison(const OpContext& ctx, const char* expression,
                                   const std::string& a, const std::string& b,
                                   const char* format, ...) {
  char context[256] = "";
  va_list args;
  va_start(args, format);
  std::vsnprintf(context, sizeof(context), format, args);
  va_end(args);
  return ctx.Fail("%s%sexpected %s, got %s vs %s", context, context[0] ? ": " : "",
                  expression, a.c_str(), b.c_str());
}

}  // namespace internal

// --------------------------------------------------------------- registry

// The key of the options' format version in every custom options map.
inline constexpr const char* kOptionsVersionKey = "options_version";

// One declared input or output: its name and the rules on its shape that the
// SDK checks before the kernel's Prepare (and exports with the schema, so
// that Python checks them before writing a model).
struct OperandSpec {
  std::string name;
  int min_rank = -1;  // -1: no bound
  int max_rank = -1;
  // Non-empty: a vector (rank 1) as long as dim `length_dim` of input
  // `length_of` (a norm's gamma: OperandSpec("gamma").VectorOf("x", -1)).
  std::string length_of;
  int length_dim = -1;
  // An optional input's meaning when absent, as a value every element of a
  // written tensor would have (a norm's gamma: 1).  Writers put such a
  // tensor where an absent input precedes a present one (LiteRT's
  // CompiledModel cannot run a custom op listing input -1).
  bool has_absent_value = false;
  double absent_value = 0;

  OperandSpec(const char* n) : name(n) {}  // NOLINT: names convert
  OperandSpec(std::string n) : name(std::move(n)) {}  // NOLINT
  OperandSpec Rank(int lo, int hi) const {
    OperandSpec o = *this;
    o.min_rank = lo;
    o.max_rank = hi;
    return o;
  }
  OperandSpec MinRank(int lo) const { return Rank(lo, -1); }
  OperandSpec VectorOf(const char* input, int dim) const {
    OperandSpec o = *this;
    o.length_of = input;
    o.length_dim = dim;
    return o;
  }
  OperandSpec AbsentIs(double value) const {
    OperandSpec o = *this;
    o.has_absent_value = true;
    o.absent_value = value;
    return o;
  }
};

struct NameList {
  std::vector<OperandSpec> operands;
};
template <typename... S>
NameList Inputs(S... operands) {
  return NameList{{OperandSpec(operands)...}};
}
template <typename... S>
NameList Outputs(S... operands) {
  return NameList{{OperandSpec(operands)...}};
}
template <typename... A>
std::vector<AttrSpec> AttrSchema(A... specs) {
  return {specs...};
}

// The custom options format a kernel reads: its version (written under
// kOptionsVersionKey; a node without it is version 1) and how to read the
// version-1 nodes of a kernel whose optional inputs used to be packed.
//   fusekit::OptionsFormat(2).V1Presence("gamma", "scale")
// says: version 1 listed only the optional inputs a node had, input gamma
// being present when bool attr `scale` (default true) was.
struct OptionsFormat {
  int version = 1;
  std::vector<std::pair<std::string, std::string>> v1_presence;  // input, attr

  OptionsFormat() = default;
  explicit OptionsFormat(int v) : version(v) {}
  OptionsFormat V1Presence(const char* input, const char* attr) const {
    OptionsFormat f = *this;
    f.v1_presence.emplace_back(input, attr);
    return f;
  }
};

// One compiled dtype variant of a kernel (one template instance).
struct KernelVariant {
  std::vector<TfLiteType> input_types;
  std::vector<bool> input_optional;
  std::vector<TfLiteType> output_types;
  void* (*create)(const Attrs& attrs, std::string* error);
  void (*destroy)(void* kernel);
  TfLiteStatus (*prepare)(void* kernel, OpContext& ctx);
  TfLiteStatus (*invoke)(void* kernel, OpContext& ctx);
};

// A kernel: its name, operand names, attrs and dtype variants.
struct KernelDef {
  std::string name;
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
  std::vector<OperandSpec> inputs;  // names and shape rules, in input order
  std::vector<AttrSpec> attrs;
  OptionsFormat format;
  std::vector<KernelVariant> variants;
  int min_inputs = 0;  // inputs before the first optional one
  std::string schema_json;
};

// The kernels compiled into this library.
std::vector<KernelDef>& KernelRegistry();
const KernelDef* FindKernel(const char* name);
// Why this library's registry is unusable ("" when it is fine), e.g. one op
// name registered twice with the same dtypes.
const std::string& RegistryError();

void RegisterVariant(const char* name, const NameList& inputs,
                     const NameList& outputs, std::vector<AttrSpec> attrs,
                     KernelVariant variant, OptionsFormat format = OptionsFormat());

// ------------------------------------------- typed-signature machinery

namespace internal {

template <typename T>
struct Operand;  // what a parameter type of Invoke declares
template <typename T>
struct Operand<In<T>> {
  static constexpr bool is_input = true;
  static constexpr bool optional = false;
  static constexpr TfLiteType type = TypeOf<T>::value;
};
template <typename T>
struct Operand<Opt<T>> {
  static constexpr bool is_input = true;
  static constexpr bool optional = true;
  static constexpr TfLiteType type = TypeOf<T>::value;
};
template <typename T>
struct Operand<Out<T>> {
  static constexpr bool is_input = false;
  static constexpr bool optional = false;
  static constexpr TfLiteType type = TypeOf<T>::value;
};

template <typename M>
struct Signature;
template <typename K, typename... Args>
struct Signature<TfLiteStatus (K::*)(OpContext&, Args...)> {
  using Kernel = K;
  static constexpr size_t kCount = sizeof...(Args);
  static constexpr bool kIsInput[sizeof...(Args) + 1] = {
      Operand<std::decay_t<Args>>::is_input..., false};

  // Position of parameter I among the inputs (or among the outputs).
  static constexpr int PositionOf(size_t index) {
    int position = 0;
    for (size_t i = 0; i < index; ++i) {
      if (kIsInput[i] == kIsInput[index]) ++position;
    }
    return position;
  }

  template <typename A>
  static A Make(OpContext& ctx, size_t index) {
    using Op = Operand<std::decay_t<A>>;
    const int position = PositionOf(index);
    return std::decay_t<A>(Op::is_input ? ctx.input(position) : ctx.output(position));
  }

  template <typename Method, size_t... I>
  static TfLiteStatus CallWith(K* kernel, Method method, OpContext& ctx,
                               std::index_sequence<I...>) {
    return (kernel->*method)(ctx, Make<Args>(ctx, I)...);
  }
  template <typename Method>
  static TfLiteStatus Call(K* kernel, Method method, OpContext& ctx) {
    return CallWith(kernel, method, ctx, std::index_sequence_for<Args...>());
  }

  static void Describe(KernelVariant* v) {
    (Add<std::decay_t<Args>>(v), ...);
  }
  template <typename A>
  static void Add(KernelVariant* v) {
    using Op = Operand<A>;
    if (Op::is_input) {
      v->input_types.push_back(Op::type);
      v->input_optional.push_back(Op::optional);
    } else {
      v->output_types.push_back(Op::type);
    }
  }
};

// A getter was given a key the kernel's schema does not declare.
inline bool UndeclaredAttrRead(const OpContext& ctx) {
  return !ctx.attrs().undeclared().empty();
}

template <typename K>
KernelVariant MakeVariant() {
  using InvokeSig = Signature<decltype(&K::Invoke)>;
  using PrepareSig = Signature<decltype(&K::Prepare)>;
  static_assert(std::is_same_v<decltype(&K::Invoke), decltype(&K::Prepare)>,
                "a kernel's Prepare and Invoke must take the same parameters");
  (void)sizeof(PrepareSig);
  KernelVariant v;
  InvokeSig::Describe(&v);
  v.create = [](const Attrs& attrs, std::string* error) -> void* {
    auto* kernel = new K(attrs, error);
    if (error->empty()) *error = attrs.undeclared();
    if (!error->empty()) {
      delete kernel;
      return nullptr;
    }
    return kernel;
  };
  v.destroy = [](void* kernel) { delete static_cast<K*>(kernel); };
  v.prepare = [](void* kernel, OpContext& ctx) {
    const TfLiteStatus status = InvokeSig::Call(static_cast<K*>(kernel), &K::Prepare, ctx);
    return UndeclaredAttrRead(ctx) ? ctx.Fail("%s", ctx.attrs().undeclared().c_str()) : status;
  };
  v.invoke = [](void* kernel, OpContext& ctx) {
    const TfLiteStatus status = InvokeSig::Call(static_cast<K*>(kernel), &K::Invoke, ctx);
    return UndeclaredAttrRead(ctx) ? ctx.Fail("%s", ctx.attrs().undeclared().c_str()) : status;
  };
  return v;
}

struct Registrar {
  template <typename K>
  Registrar(const char* name, K*, const NameList& inputs, const NameList& outputs,
            std::vector<AttrSpec> attrs = {}, OptionsFormat format = OptionsFormat()) {
    RegisterVariant(name, inputs, outputs, std::move(attrs), MakeVariant<K>(),
                    std::move(format));
  }
};

}  // namespace internal
}  // namespace fusekit

#define FUSEKIT_CONCAT_INNER(a, b) a##b
#define FUSEKIT_CONCAT(a, b) FUSEKIT_CONCAT_INNER(a, b)

// Registers kernel class `Class` (one dtype variant) as custom op `name`:
//   FUSEKIT_REGISTER_KERNEL(name, Class, inputs, outputs[, attrs])
// inputs/outputs: fusekit::Inputs("x", ...), fusekit::Outputs("y", ...) name
// the operands of Invoke in order (an entry may be an OperandSpec with shape
// rules); attrs: fusekit::AttrSchema(...); format: fusekit::OptionsFormat.
#define FUSEKIT_REGISTER_KERNEL(name, Class, ...)                          \
  static ::fusekit::internal::Registrar FUSEKIT_CONCAT(fusekit_registrar_, \
                                                       __COUNTER__)(       \
      name, static_cast<Class*>(nullptr), __VA_ARGS__)
