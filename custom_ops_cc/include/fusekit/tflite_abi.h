// fusekit's own declaration of the part of the TensorFlow Lite C ABI that the
// kernels and the delegate plugin touch.  No TFLite headers ship with the pip
// runtimes, so the out-of-tree build declares the structs here; every offset is
// pinned below so that a layout drift fails the build instead of crashing a
// runtime.  Only the fields fusekit reads or writes carry real types; the rest
// are opaque pointers of the right size.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef FUSEKIT_USE_TFLITE_HEADERS
// In-tree (Bazel) builds compile the same sources against the real headers.
#include "tensorflow/lite/core/c/common.h"
#else

extern "C" {

// Enums get a fixed underlying type: runtimes newer than this header may
// store values it does not list, and loading such a value into an enum
// without one is undefined behaviour.
typedef enum TfLiteStatus : int {
  kTfLiteOk = 0,
  kTfLiteError = 1,
  kTfLiteDelegateError = 2,
  kTfLiteApplicationError = 3,
  kTfLiteDelegateDataNotFound = 4,
  kTfLiteDelegateDataWriteError = 5,
  kTfLiteDelegateDataReadError = 6,
  kTfLiteUnresolvedOps = 7,
  kTfLiteCancelled = 8,
  kTfLiteOutputShapeNotKnown = 9,
} TfLiteStatus;

// Every type the runtimes of 2024-2026 use (LiteRT's common.h).
typedef enum TfLiteType : int {
  kTfLiteNoType = 0,
  kTfLiteFloat32 = 1,
  kTfLiteInt32 = 2,
  kTfLiteUInt8 = 3,
  kTfLiteInt64 = 4,
  kTfLiteString = 5,
  kTfLiteBool = 6,
  kTfLiteInt16 = 7,
  kTfLiteComplex64 = 8,
  kTfLiteInt8 = 9,
  kTfLiteFloat16 = 10,
  kTfLiteFloat64 = 11,
  kTfLiteComplex128 = 12,
  kTfLiteUInt64 = 13,
  kTfLiteResource = 14,
  kTfLiteVariant = 15,
  kTfLiteUInt32 = 16,
  kTfLiteUInt16 = 17,
  kTfLiteInt4 = 18,
  kTfLiteBFloat16 = 19,
  kTfLiteInt2 = 20,
  kTfLiteUInt4 = 21,
  kTfLiteFloat8E4M3FN = 22,
  kTfLiteFloat8E5M2 = 23,
} TfLiteType;

typedef enum TfLiteAllocationType : int {
  kTfLiteMemNone = 0,
  kTfLiteMmapRo = 1,
  kTfLiteArenaRw = 2,
  kTfLiteArenaRwPersistent = 3,
  kTfLiteDynamic = 4,
  kTfLitePersistentRo = 5,
  // Memory the runtime neither plans nor frees: the arena planner skips
  // such a tensor, and whoever set the type points its data somewhere.
  kTfLiteCustom = 6,
} TfLiteAllocationType;

typedef struct TfLiteIntArray {
  int size;
  int data[];
} TfLiteIntArray;

typedef struct TfLiteQuantizationParams {
  float scale;
  int32_t zero_point;
} TfLiteQuantizationParams;

typedef enum TfLiteQuantizationType : int {
  kTfLiteNoQuantization = 0,
  kTfLiteAffineQuantization = 1,
} TfLiteQuantizationType;

typedef struct TfLiteQuantization {
  TfLiteQuantizationType type;
  // TfLiteAffineQuantization* when type is kTfLiteAffineQuantization.
  void* params;
} TfLiteQuantization;

typedef struct TfLiteFloatArray {
  int size;
  float data[];
} TfLiteFloatArray;

// Per-tensor (one scale) or per-channel (one per index of
// quantized_dimension) affine quantization: real = scale * (q - zero_point).
typedef struct TfLiteAffineQuantization {
  TfLiteFloatArray* scale;
  TfLiteIntArray* zero_point;
  int32_t quantized_dimension;
} TfLiteAffineQuantization;

typedef struct TfLiteTensor {
  TfLiteType type;
  void* data;  // a union of typed pointers in TFLite; one pointer wide
  TfLiteIntArray* dims;
  TfLiteQuantizationParams params;
  TfLiteAllocationType allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  void* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  TfLiteQuantization quantization;
  void* sparsity;
  const TfLiteIntArray* dims_signature;
} TfLiteTensor;

typedef struct TfLiteNode {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  TfLiteIntArray* intermediates;
  TfLiteIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  void* delegate;
  bool might_have_side_effect;
} TfLiteNode;

struct TfLiteContext;
struct TfLiteDelegate;

typedef struct TfLiteRegistration {
  void* (*init)(TfLiteContext* context, const char* buffer, size_t length);
  void (*free)(TfLiteContext* context, void* buffer);
  TfLiteStatus (*prepare)(TfLiteContext* context, TfLiteNode* node);
  TfLiteStatus (*invoke)(TfLiteContext* context, TfLiteNode* node);
  const char* (*profiling_string)(const TfLiteContext* context,
                                  const TfLiteNode* node);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;
  void* async_kernel;
  uint64_t inplace_operator;
} TfLiteRegistration;

typedef struct TfLiteContext {
  size_t tensors_size;
  TfLiteStatus (*GetExecutionPlan)(TfLiteContext* context,
                                   TfLiteIntArray** execution_plan);
  TfLiteTensor* tensors;
  void* impl_;
  TfLiteStatus (*ResizeTensor)(TfLiteContext*, TfLiteTensor* tensor,
                               TfLiteIntArray* new_size);
  void (*ReportError)(TfLiteContext*, const char* format, ...);
  void* AddTensors;
  TfLiteStatus (*GetNodeAndRegistration)(TfLiteContext*, int node_index,
                                         TfLiteNode** node,
                                         TfLiteRegistration** registration);
  TfLiteStatus (*ReplaceNodeSubsetsWithDelegateKernels)(
      TfLiteContext*, TfLiteRegistration registration,
      const TfLiteIntArray* nodes_to_replace, TfLiteDelegate* delegate);
  int recommended_num_threads;
  void* GetExternalContext;
  void* SetExternalContext;
  bool allow_fp32_relax_to_fp16;
  void* profiler;
  void* (*AllocatePersistentBuffer)(TfLiteContext* ctx, size_t bytes);
  void* AllocateBufferForEval;
  void* RequestScratchBufferInArena;
  void* GetScratchBuffer;
  void* ResizeTensorExplicit;
  void* PreviewDelegatePartitioning;
  void* GetTensor;  // NULL in the full interpreter: use tensors[i]
  void* GetEvalTensor;
  void* GetModelMetadata;
  void* AcquireSubgraphContext;
  void* ReleaseSubgraphContext;
} TfLiteContext;

typedef enum TfLiteDelegateFlags {
  kTfLiteDelegateFlagsNone = 0,
  kTfLiteDelegateFlagsAllowDynamicTensors = 1,
} TfLiteDelegateFlags;

typedef struct TfLiteDelegate {
  void* data_;
  TfLiteStatus (*Prepare)(TfLiteContext* context, TfLiteDelegate* delegate);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder;
} TfLiteDelegate;

typedef struct TfLiteDelegateParams {
  TfLiteDelegate* delegate;
  TfLiteIntArray* nodes_to_replace;
  TfLiteIntArray* input_tensors;
  TfLiteIntArray* output_tensors;
} TfLiteDelegateParams;

}  // extern "C"

// The layout every runtime was checked against (x86-64 / aarch64, LP64).
static_assert(sizeof(void*) == 8, "fusekit's ABI declarations assume LP64");
static_assert(offsetof(TfLiteIntArray, data) == 4, "TfLiteIntArray.data");
static_assert(offsetof(TfLiteTensor, type) == 0, "TfLiteTensor.type");
static_assert(offsetof(TfLiteTensor, data) == 8, "TfLiteTensor.data");
static_assert(offsetof(TfLiteTensor, dims) == 16, "TfLiteTensor.dims");
static_assert(offsetof(TfLiteTensor, params) == 24, "TfLiteTensor.params");
static_assert(offsetof(TfLiteTensor, allocation_type) == 32,
              "TfLiteTensor.allocation_type");
static_assert(offsetof(TfLiteTensor, bytes) == 40, "TfLiteTensor.bytes");
static_assert(offsetof(TfLiteTensor, allocation) == 48,
              "TfLiteTensor.allocation");
static_assert(offsetof(TfLiteTensor, name) == 56, "TfLiteTensor.name");
static_assert(offsetof(TfLiteTensor, delegate) == 64, "TfLiteTensor.delegate");
static_assert(offsetof(TfLiteTensor, buffer_handle) == 72,
              "TfLiteTensor.buffer_handle");
static_assert(offsetof(TfLiteTensor, data_is_stale) == 76,
              "TfLiteTensor.data_is_stale");
static_assert(offsetof(TfLiteTensor, is_variable) == 77,
              "TfLiteTensor.is_variable");
static_assert(offsetof(TfLiteTensor, quantization) == 80,
              "TfLiteTensor.quantization");
static_assert(offsetof(TfLiteTensor, sparsity) == 96, "TfLiteTensor.sparsity");
static_assert(offsetof(TfLiteTensor, dims_signature) == 104,
              "TfLiteTensor.dims_signature");
static_assert(sizeof(TfLiteTensor) == 112, "sizeof(TfLiteTensor)");
static_assert(sizeof(TfLiteType) == 4, "TfLiteType is an int");
static_assert(offsetof(TfLiteFloatArray, data) == 4, "TfLiteFloatArray.data");
static_assert(offsetof(TfLiteAffineQuantization, zero_point) == 8,
              "TfLiteAffineQuantization.zero_point");
static_assert(offsetof(TfLiteAffineQuantization, quantized_dimension) == 16,
              "TfLiteAffineQuantization.quantized_dimension");

static_assert(offsetof(TfLiteNode, inputs) == 0, "TfLiteNode.inputs");
static_assert(offsetof(TfLiteNode, outputs) == 8, "TfLiteNode.outputs");
static_assert(offsetof(TfLiteNode, user_data) == 32, "TfLiteNode.user_data");
static_assert(offsetof(TfLiteNode, custom_initial_data) == 48,
              "TfLiteNode.custom_initial_data");
static_assert(offsetof(TfLiteNode, custom_initial_data_size) == 56,
              "TfLiteNode.custom_initial_data_size");
static_assert(offsetof(TfLiteNode, delegate) == 64, "TfLiteNode.delegate");
static_assert(offsetof(TfLiteNode, might_have_side_effect) == 72,
              "TfLiteNode.might_have_side_effect");
static_assert(sizeof(TfLiteNode) == 80, "sizeof(TfLiteNode)");

static_assert(offsetof(TfLiteRegistration, init) == 0, "Registration.init");
static_assert(offsetof(TfLiteRegistration, free) == 8, "Registration.free");
static_assert(offsetof(TfLiteRegistration, prepare) == 16,
              "Registration.prepare");
static_assert(offsetof(TfLiteRegistration, invoke) == 24,
              "Registration.invoke");
static_assert(offsetof(TfLiteRegistration, profiling_string) == 32,
              "Registration.profiling_string");
static_assert(offsetof(TfLiteRegistration, builtin_code) == 40,
              "Registration.builtin_code");
static_assert(offsetof(TfLiteRegistration, custom_name) == 48,
              "Registration.custom_name");
static_assert(offsetof(TfLiteRegistration, version) == 56,
              "Registration.version");
static_assert(offsetof(TfLiteRegistration, registration_external) == 64,
              "Registration.registration_external");
static_assert(offsetof(TfLiteRegistration, async_kernel) == 72,
              "Registration.async_kernel");
static_assert(offsetof(TfLiteRegistration, inplace_operator) == 80,
              "Registration.inplace_operator");
static_assert(sizeof(TfLiteRegistration) == 88, "sizeof(TfLiteRegistration)");

static_assert(offsetof(TfLiteContext, tensors_size) == 0, "tensors_size");
static_assert(offsetof(TfLiteContext, GetExecutionPlan) == 8,
              "GetExecutionPlan");
static_assert(offsetof(TfLiteContext, tensors) == 16, "tensors");
static_assert(offsetof(TfLiteContext, impl_) == 24, "impl_");
static_assert(offsetof(TfLiteContext, ResizeTensor) == 32, "ResizeTensor");
static_assert(offsetof(TfLiteContext, ReportError) == 40, "ReportError");
static_assert(offsetof(TfLiteContext, AddTensors) == 48, "AddTensors");
static_assert(offsetof(TfLiteContext, GetNodeAndRegistration) == 56,
              "GetNodeAndRegistration");
static_assert(offsetof(TfLiteContext, ReplaceNodeSubsetsWithDelegateKernels) ==
                  64,
              "ReplaceNodeSubsetsWithDelegateKernels");
static_assert(offsetof(TfLiteContext, recommended_num_threads) == 72,
              "recommended_num_threads");
static_assert(offsetof(TfLiteContext, GetExternalContext) == 80,
              "GetExternalContext");
static_assert(offsetof(TfLiteContext, SetExternalContext) == 88,
              "SetExternalContext");
static_assert(offsetof(TfLiteContext, allow_fp32_relax_to_fp16) == 96,
              "allow_fp32_relax_to_fp16");
static_assert(offsetof(TfLiteContext, profiler) == 104, "profiler");
static_assert(offsetof(TfLiteContext, AllocatePersistentBuffer) == 112,
              "AllocatePersistentBuffer");
static_assert(offsetof(TfLiteContext, AllocateBufferForEval) == 120,
              "AllocateBufferForEval");
static_assert(offsetof(TfLiteContext, RequestScratchBufferInArena) == 128,
              "RequestScratchBufferInArena");
static_assert(offsetof(TfLiteContext, GetScratchBuffer) == 136,
              "GetScratchBuffer");
static_assert(offsetof(TfLiteContext, ResizeTensorExplicit) == 144,
              "ResizeTensorExplicit");
static_assert(offsetof(TfLiteContext, PreviewDelegatePartitioning) == 152,
              "PreviewDelegatePartitioning");
static_assert(offsetof(TfLiteContext, GetTensor) == 160, "GetTensor");
static_assert(offsetof(TfLiteContext, GetEvalTensor) == 168, "GetEvalTensor");
static_assert(offsetof(TfLiteContext, GetModelMetadata) == 176,
              "GetModelMetadata");
static_assert(offsetof(TfLiteContext, AcquireSubgraphContext) == 184,
              "AcquireSubgraphContext");
static_assert(offsetof(TfLiteContext, ReleaseSubgraphContext) == 192,
              "ReleaseSubgraphContext");
static_assert(sizeof(TfLiteContext) == 200, "sizeof(TfLiteContext)");

static_assert(offsetof(TfLiteDelegate, data_) == 0, "Delegate.data_");
static_assert(offsetof(TfLiteDelegate, Prepare) == 8, "Delegate.Prepare");
static_assert(offsetof(TfLiteDelegate, flags) == 40, "Delegate.flags");
static_assert(offsetof(TfLiteDelegate, opaque_delegate_builder) == 48,
              "Delegate.opaque_delegate_builder");
static_assert(sizeof(TfLiteDelegate) == 56, "sizeof(TfLiteDelegate)");

static_assert(offsetof(TfLiteDelegateParams, nodes_to_replace) == 8,
              "DelegateParams.nodes_to_replace");
static_assert(offsetof(TfLiteDelegateParams, input_tensors) == 16,
              "DelegateParams.input_tensors");
static_assert(offsetof(TfLiteDelegateParams, output_tensors) == 24,
              "DelegateParams.output_tensors");

#endif  // FUSEKIT_USE_TFLITE_HEADERS

// The tensor's data pointer: a plain pointer here, a union in TFLite's own
// headers.
inline void* FusekitTensorData(const TfLiteTensor* t) {
#ifdef FUSEKIT_USE_TFLITE_HEADERS
  return t->data.raw;
#else
  return t->data;
#endif
}
inline void FusekitSetTensorData(TfLiteTensor* t, void* data) {
#ifdef FUSEKIT_USE_TFLITE_HEADERS
  t->data.raw = static_cast<char*>(data);
#else
  t->data = data;
#endif
}

// Builtin operator codes fusekit compares against (schema values).
constexpr int32_t kFusekitBuiltinCustom = 32;
constexpr int32_t kFusekitBuiltinDelegate = 51;
