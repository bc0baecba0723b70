// Implementation of the kernel SDK declared in fusekit/kernel_sdk.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "flatbuffers/flexbuffers.h"
#include "fusekit/kernel_sdk.h"
#include "node_runner.h"

namespace fusekit {

const char* TypeName(TfLiteType type) {
  switch (type) {
    case kTfLiteFloat32: return "float32";
    case kTfLiteInt32: return "int32";
    case kTfLiteUInt8: return "uint8";
    case kTfLiteInt64: return "int64";
    case kTfLiteString: return "string";
    case kTfLiteBool: return "bool";
    case kTfLiteInt16: return "int16";
    case kTfLiteComplex64: return "complex64";
    case kTfLiteInt8: return "int8";
    case kTfLiteFloat16: return "float16";
    case kTfLiteFloat64: return "float64";
    default: return "unknown";
  }
}

// ---------------------------------------------------------------- registry

std::vector<KernelDef>& KernelRegistry() {
  // A function-local static: registrars in other translation units run
  // before main in unspecified order.
  static std::vector<KernelDef> registry;
  return registry;
}

const KernelDef* FindKernel(const char* name) {
  if (name == nullptr) return nullptr;
  for (const KernelDef& def : KernelRegistry()) {
    if (std::strcmp(def.name, name) == 0) return &def;
  }
  return nullptr;
}

KernelRegistrar::KernelRegistrar(const KernelDef& def) {
  if (FindKernel(def.name) != nullptr) {
    std::fprintf(stderr, "fusekit: kernel %s registered twice; keeping the first\n",
                 def.name);
    return;
  }
  KernelRegistry().push_back(def);
}

// ------------------------------------------------------------------- attrs

Attrs::Attrs(const void* data, size_t size) {
  if (data == nullptr || size == 0) {
    // No options at all: an op without attrs.  Every Get returns defaults.
    valid_ = true;
    return;
  }
  buffer_.assign(static_cast<const uint8_t*>(data),
                 static_cast<const uint8_t*>(data) + size);
  if (!flexbuffers::VerifyBuffer(buffer_.data(), buffer_.size())) {
    error_ = "custom options are not a valid flexbuffer";
    return;
  }
  if (!flexbuffers::GetRoot(buffer_.data(), buffer_.size()).IsMap()) {
    error_ = "custom options are not a flexbuffer map";
    return;
  }
  valid_ = true;
}

namespace {

flexbuffers::Reference Lookup(const std::vector<uint8_t>& buffer,
                              const char* key) {
  if (buffer.empty()) return flexbuffers::Reference();
  return flexbuffers::GetRoot(buffer.data(), buffer.size()).AsMap()[key];
}

bool IsNumber(const flexbuffers::Reference& r) {
  return r.IsNumeric() || r.IsBool();
}

}  // namespace

bool Attrs::Has(const char* key) const {
  return valid_ && !Lookup(buffer_, key).IsNull();
}

std::vector<std::string> Attrs::Keys() const {
  std::vector<std::string> keys;
  if (!valid_ || buffer_.empty()) return keys;
  auto map_keys = flexbuffers::GetRoot(buffer_.data(), buffer_.size())
                      .AsMap()
                      .Keys();
  for (size_t i = 0; i < map_keys.size(); ++i) {
    keys.push_back(map_keys[i].AsKey());
  }
  return keys;
}

double Attrs::GetFloat(const char* key, double default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  if (!IsNumber(r)) {
    error_ = std::string("attr '") + key + "' is not a number";
    return default_value;
  }
  return r.AsDouble();
}

int64_t Attrs::GetInt(const char* key, int64_t default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  if (!(r.IsInt() || r.IsUInt() || r.IsBool())) {
    error_ = std::string("attr '") + key + "' is not an integer";
    return default_value;
  }
  return r.AsInt64();
}

bool Attrs::GetBool(const char* key, bool default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  // The TF converter writes bools as integers 0/1.
  if (!(r.IsBool() || r.IsInt() || r.IsUInt())) {
    error_ = std::string("attr '") + key + "' is not a bool";
    return default_value;
  }
  return r.AsInt64() != 0;
}

std::string Attrs::GetString(const char* key,
                             const std::string& default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  if (r.IsString()) return r.AsString().str();
  if (r.IsBlob()) {
    auto b = r.AsBlob();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  error_ = std::string("attr '") + key + "' is not a string";
  return default_value;
}

namespace {

template <typename T, typename Vec, typename Convert>
bool ReadElements(const Vec& v, const char* key, const char* what, std::string* error,
                  bool (*accept)(const flexbuffers::Reference&), Convert convert,
                  std::vector<T>* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    auto e = v[i];
    if (!accept(e)) {
      *error = std::string("attr '") + key + "' element " + std::to_string(i) +
               " is not " + what;
      out->clear();
      return false;
    }
    out->push_back(convert(e));
  }
  return true;
}

// Lists arrive as typed vectors (numbers, bools) or untyped vectors
// (strings); flexbuffers reads each kind through its own accessor.
template <typename T, typename Convert>
std::vector<T> ReadVector(const flexbuffers::Reference& r, const char* key,
                          const char* what, std::string* error,
                          bool (*accept)(const flexbuffers::Reference&),
                          Convert convert) {
  std::vector<T> out;
  if (r.IsTypedVector()) {
    ReadElements(r.AsTypedVector(), key, what, error, accept, convert, &out);
  } else if (r.IsFixedTypedVector()) {
    ReadElements(r.AsFixedTypedVector(), key, what, error, accept, convert, &out);
  } else if (r.IsVector()) {
    ReadElements(r.AsVector(), key, what, error, accept, convert, &out);
  } else {
    *error = std::string("attr '") + key + "' is not a list of " + what;
  }
  return out;
}

}  // namespace

std::vector<int64_t> Attrs::GetInts(const char* key,
                                    std::vector<int64_t> default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  return ReadVector<int64_t>(
      r, key, "integers", &error_,
      [](const flexbuffers::Reference& e) { return e.IsInt() || e.IsUInt(); },
      [](const flexbuffers::Reference& e) { return e.AsInt64(); });
}

std::vector<double> Attrs::GetFloats(const char* key,
                                     std::vector<double> default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  return ReadVector<double>(
      r, key, "numbers", &error_,
      [](const flexbuffers::Reference& e) { return e.IsNumeric(); },
      [](const flexbuffers::Reference& e) { return e.AsDouble(); });
}

std::vector<bool> Attrs::GetBools(const char* key,
                                  std::vector<bool> default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  return ReadVector<bool>(
      r, key, "bools", &error_,
      [](const flexbuffers::Reference& e) {
        return e.IsBool() || e.IsInt() || e.IsUInt();
      },
      [](const flexbuffers::Reference& e) { return e.AsInt64() != 0; });
}

std::vector<std::string> Attrs::GetStrings(
    const char* key, std::vector<std::string> default_value) const {
  if (!valid_) return default_value;
  auto r = Lookup(buffer_, key);
  if (r.IsNull()) return default_value;
  return ReadVector<std::string>(
      r, key, "strings", &error_,
      [](const flexbuffers::Reference& e) { return e.IsString(); },
      [](const flexbuffers::Reference& e) { return e.AsString().str(); });
}

// -------------------------------------------------------------- op context

const char* OpContext::op_name() const { return state_->def->name; }
int OpContext::num_inputs() const {
  return static_cast<int>(state_->inputs.size());
}
int OpContext::num_outputs() const {
  return static_cast<int>(state_->outputs.size());
}
Tensor OpContext::input(int i) const {
  if (i < 0 || i >= num_inputs() || state_->inputs[i] < 0) return Tensor();
  return Tensor(&context_->tensors[state_->inputs[i]]);
}
Tensor OpContext::output(int i) const {
  if (i < 0 || i >= num_outputs() || state_->outputs[i] < 0) return Tensor();
  return Tensor(&context_->tensors[state_->outputs[i]]);
}
const Attrs& OpContext::attrs() const { return state_->attrs; }

int OpContext::num_threads() const {
  return context_->recommended_num_threads > 0
             ? context_->recommended_num_threads
             : 1;
}

TfLiteStatus OpContext::ResizeOutput(int i, const std::vector<int>& dims) {
  Tensor out = output(i);
  if (!out.present()) return Fail("output %d does not exist", i);
  // ResizeTensor takes ownership and releases the array with free().
  auto* array = static_cast<TfLiteIntArray*>(
      std::malloc(sizeof(TfLiteIntArray) + sizeof(int) * dims.size()));
  if (array == nullptr) return Fail("out of memory resizing output %d", i);
  array->size = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) array->data[d] = dims[d];
  return context_->ResizeTensor(context_, out.raw_tensor(), array);
}

void* OpContext::Scratch(size_t bytes) {
  if (bytes > state_->scratch_bytes) {
    // 64 spare bytes let the pointer be aligned to a cache line.
    state_->scratch.reset(new (std::nothrow) uint8_t[bytes + 64]);
    state_->scratch_bytes = state_->scratch ? bytes : 0;
    if (!state_->scratch) return nullptr;
  }
  auto p = reinterpret_cast<uintptr_t>(state_->scratch.get());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
}

TfLiteStatus OpContext::Fail(const char* format, ...) const {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  ReportError(context_, "%s: %s", op_name(), message);
  return kTfLiteError;
}

TfLiteStatus OpContext::ExpectType(const Tensor& t, const char* what,
                                   TfLiteType type) const {
  if (!t.present()) return Fail("%s is missing", what);
  if (t.type() != type) {
    return Fail("%s must be %s, got %s", what, TypeName(type),
                TypeName(t.type()));
  }
  return kTfLiteOk;
}

TfLiteStatus OpContext::ExpectRankAtLeast(const Tensor& t, const char* what,
                                          int rank) const {
  if (t.rank() < rank) {
    return Fail("%s must have rank >= %d, got rank %d", what, rank, t.rank());
  }
  return kTfLiteOk;
}

}  // namespace fusekit
