// Tensor views and the op context of the kernel SDK (fusekit/kernel_sdk.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fusekit/kernel_sdk.h"
#include "node_runner.h"

namespace fusekit {

const char* TypeName(TfLiteType type) {
  switch (type) {
    case kTfLiteNoType: return "notype";
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
    case kTfLiteComplex128: return "complex128";
    case kTfLiteUInt64: return "uint64";
    case kTfLiteResource: return "resource";
    case kTfLiteVariant: return "variant";
    case kTfLiteUInt32: return "uint32";
    case kTfLiteUInt16: return "uint16";
    case kTfLiteInt4: return "int4";
    case kTfLiteBFloat16: return "bfloat16";
    case kTfLiteInt2: return "int2";
    case kTfLiteUInt4: return "uint4";
    case kTfLiteFloat8E4M3FN: return "float8_e4m3fn";
    case kTfLiteFloat8E5M2: return "float8_e5m2";
  }
  return "unknown type";
}

size_t TypeSize(TfLiteType type) {
  switch (type) {
    case kTfLiteFloat32: case kTfLiteInt32: case kTfLiteUInt32: return 4;
    case kTfLiteInt64: case kTfLiteUInt64: case kTfLiteFloat64:
    case kTfLiteComplex64: return 8;
    case kTfLiteComplex128: return 16;
    case kTfLiteInt16: case kTfLiteUInt16: case kTfLiteFloat16:
    case kTfLiteBFloat16: return 2;
    case kTfLiteUInt8: case kTfLiteInt8: case kTfLiteBool:
    case kTfLiteFloat8E4M3FN: case kTfLiteFloat8E5M2: return 1;
    default: return 0;  // packed, strings, resources
  }
}

int64_t Tensor::num_elements() const {
  if (t_ == nullptr) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank(); ++i) {
    const int d = t_->dims->data[i];
    if (d < 0) return -1;
    // Checked even after a zero dim: [0, 2^31, 2^31, 2^31] has no elements
    // but is still a shape no buffer can back.
    int64_t next;
    if (__builtin_mul_overflow(n == 0 ? int64_t{1} : n, int64_t{d}, &next)) return -1;
    n = n == 0 ? 0 : next;
  }
  return n;
}

QuantParams Tensor::quantization() const {
  QuantParams q;
  if (t_ == nullptr || t_->quantization.type != kTfLiteAffineQuantization ||
      t_->quantization.params == nullptr) {
    return q;
  }
  const auto* affine =
      static_cast<const TfLiteAffineQuantization*>(t_->quantization.params);
  if (affine->scale == nullptr || affine->scale->size <= 0) return q;
  q.scales = affine->scale->data;
  q.count = affine->scale->size;
  if (affine->zero_point != nullptr && affine->zero_point->size == q.count) {
    q.zero_points = affine->zero_point->data;
  }
  q.axis = q.count > 1 ? affine->quantized_dimension : -1;
  return q;
}

// -------------------------------------------------------------- op context

const char* OpContext::op_name() const { return state_->def->name.c_str(); }
int OpContext::num_inputs() const { return static_cast<int>(state_->inputs.size()); }
int OpContext::num_outputs() const { return static_cast<int>(state_->outputs.size()); }

Tensor OpContext::input(int i) const {
  if (i < 0 || i >= num_inputs() || state_->inputs[i] < 0) return Tensor(nullptr, i);
  return Tensor(&context_->tensors[state_->inputs[i]], i);
}

Tensor OpContext::output(int i) const {
  if (i < 0 || i >= num_outputs() || state_->outputs[i] < 0) return Tensor(nullptr, i);
  void* override_data =
      static_cast<size_t>(i) < state_->output_override.size() ? state_->output_override[i]
                                                             : nullptr;
  return Tensor(&context_->tensors[state_->outputs[i]], i, override_data);
}

const Attrs& OpContext::attrs() const { return state_->attrs; }

int OpContext::num_threads() const {
  return state_->resources ? state_->resources->num_threads : 1;
}

void OpContext::RunParallel(int64_t n, int64_t grain,
                            void (*fn)(void*, int64_t, int64_t, int), void* arg) {
  if (n <= 0) return;
  const int threads = num_threads();
  if (threads <= 1 || n <= grain) {
    fn(arg, 0, n, 0);
    return;
  }
  state_->resources->Pool()->ParallelFor(n, grain, threads, fn, arg);
}

TfLiteStatus OpContext::ResizeOutput(int i, const std::vector<int>& dims) {
  Tensor out = output(i);
  if (!out.present()) return Fail("output %d does not exist", i);
  for (int d : dims) {
    if (d < 0) return Fail("output %d: negative dim %d", i, d);
  }
  // ResizeTensor takes ownership and releases the array with free().
  auto* array = static_cast<TfLiteIntArray*>(
      std::malloc(sizeof(TfLiteIntArray) + sizeof(int) * dims.size()));
  if (array == nullptr) return Fail("out of memory resizing output %d", i);
  array->size = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) array->data[d] = dims[d];
  return context_->ResizeTensor(context_, out.raw_tensor(), array);
}

bool OpContext::AliasOutput(const Tensor& out, const Tensor& in, size_t byte_offset) {
  const int o = out.position();
  const int i = in.position();
  // A constant input is read-only memory mapped from the model: never a
  // buffer to write through.
  if (!state_->outputs_can_alias || !out.present() || !in.present() || in.is_constant() ||
      o < 0 || o >= num_outputs() || i < 0 || i >= num_inputs()) {
    return false;
  }
  state_->alias_input.resize(state_->outputs.size(), -1);
  state_->alias_offset.resize(state_->outputs.size(), 0);
  state_->alias_input[o] = i;
  state_->alias_offset[o] = byte_offset;
  return true;
}

void* OpContext::Scratch(size_t bytes) {
  if (!state_->resources) return nullptr;
  return state_->resources->scratch.Get(bytes);
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

}  // namespace fusekit
