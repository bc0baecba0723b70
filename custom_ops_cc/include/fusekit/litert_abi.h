/* fusekit's own declaration of the part of the LiteRT C API (the litert/c headers)
 * that the LiteRT custom-op adapter and C apps use.  ai-edge-litert ships
 * libLiteRt.so without headers, so, as with tflite_abi.h, the declarations
 * live here and the struct layouts are pinned below.
 *
 * Checked on: the headers of google-ai-edge/LiteRT v2.2.0 and of its main
 * branch of August 2026 (litert_common.h, litert_layout.h,
 * litert_model_types.h, litert_custom_op_kernel.h, litert_options.h,
 * litert_opaque_options.h, litert_environment.h, litert_model.h,
 * litert_compiled_model.h, litert_tensor_buffer.h; identical for everything
 * declared here), and on the symbols ai-edge-litert 2.3.0's libLiteRt.so
 * exports (`nm -D`, symbol version VERS_1.0).
 *
 * Plain C: C apps include it through fusekit/litert.h. */
#ifndef FUSEKIT_LITERT_ABI_H_
#define FUSEKIT_LITERT_ABI_H_

#ifdef FUSEKIT_USE_LITERT_HEADERS
/* Builds inside a LiteRT source tree use the real headers instead. */
#include "litert/c/litert_common.h"
#include "litert/c/litert_compiled_model.h"
#include "litert/c/litert_custom_op_kernel.h"
#include "litert/c/litert_environment.h"
#include "litert/c/litert_layout.h"
#include "litert/c/litert_model.h"
#include "litert/c/litert_opaque_options.h"
#include "litert/c/litert_options.h"
#include "litert/c/litert_tensor_buffer.h"
#else

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handles. */
typedef struct LiteRtEnvironmentT* LiteRtEnvironment;
typedef struct LiteRtModelT* LiteRtModel;
typedef struct LiteRtSignatureT* LiteRtSignature;
typedef struct LiteRtTensorT* LiteRtTensor;
typedef struct LiteRtOptionsT* LiteRtOptions;
typedef struct LiteRtOpaqueOptionsT* LiteRtOpaqueOptions;
typedef struct LiteRtCompiledModelT* LiteRtCompiledModel;
typedef struct LiteRtTensorBufferT* LiteRtTensorBuffer;

/* LiteRtStatus: only the values fusekit names; any other is an error. */
typedef int LiteRtStatus;
#define kLiteRtStatusOk 0
#define kLiteRtStatusErrorInvalidArgument 1
#define kLiteRtStatusErrorRuntimeFailure 3
#define kLiteRtStatusErrorUnsupported 5

typedef size_t LiteRtParamIndex;
typedef int LiteRtHwAcceleratorSet;
#define kLiteRtHwAcceleratorCpu 1

/* LiteRtElementType values are TfLiteType's (float32 1, int32 2, ...,
 * float16 10). */
typedef int LiteRtElementType;

typedef int LiteRtTensorBufferLockMode;
#define kLiteRtTensorBufferLockModeRead 0
#define kLiteRtTensorBufferLockModeWrite 1
#define kLiteRtTensorBufferLockModeReadWrite 2

typedef int LiteRtTensorBufferType;
#define kLiteRtTensorBufferTypeHostMemory 1

#define LITERT_TENSOR_MAX_RANK 8

typedef struct {
  unsigned int rank : 7;
  unsigned int has_strides : 1;
  int32_t dimensions[LITERT_TENSOR_MAX_RANK];
  uint32_t strides[LITERT_TENSOR_MAX_RANK];
} LiteRtLayout;

typedef struct {
  LiteRtElementType element_type;
  LiteRtLayout layout;
} LiteRtRankedTensorType;

/* The custom-op kernel table (litert_custom_op_kernel.h).  LiteRT calls Init
 * once per node of the op, GetOutputLayouts when the node is prepared, Run
 * when it runs and Destroy when the node is freed, each with the user_data
 * given to LiteRtAddCustomOpKernelOption (shared by every node of the op).
 * Its dispatcher ignores the statuses these return. */
typedef struct {
  LiteRtStatus (*Init)(void* user_data, const void* init_data,
                       size_t init_data_size);
  LiteRtStatus (*GetOutputLayouts)(void* user_data, size_t num_inputs,
                                   const LiteRtLayout* input_layouts,
                                   size_t num_outputs,
                                   LiteRtLayout* output_layouts);
  LiteRtStatus (*Run)(void* user_data, size_t num_inputs,
                      const LiteRtTensorBuffer* inputs, size_t num_outputs,
                      LiteRtTensorBuffer* outputs);
  LiteRtStatus (*Destroy)(void* user_data);
} LiteRtCustomOpKernel;

/* Environment, model and signatures. */
typedef struct LiteRtEnvOption LiteRtEnvOption;
LiteRtStatus LiteRtCreateEnvironment(int num_options,
                                     const LiteRtEnvOption* options,
                                     LiteRtEnvironment* environment);
void LiteRtDestroyEnvironment(LiteRtEnvironment environment);
LiteRtStatus LiteRtCreateModelFromBuffer(LiteRtEnvironment environment,
                                         const void* buffer_addr,
                                         size_t buffer_size,
                                         LiteRtModel* model);
void LiteRtDestroyModel(LiteRtModel model);
LiteRtStatus LiteRtGetNumModelSignatures(LiteRtModel model,
                                         LiteRtParamIndex* num_signatures);
LiteRtStatus LiteRtGetModelSignature(LiteRtModel model,
                                     LiteRtParamIndex signature_index,
                                     LiteRtSignature* signature);
LiteRtStatus LiteRtGetSignatureKey(LiteRtSignature signature,
                                   const char** signature_key);
LiteRtStatus LiteRtGetNumSignatureInputs(LiteRtSignature signature,
                                         LiteRtParamIndex* num_inputs);
LiteRtStatus LiteRtGetNumSignatureOutputs(LiteRtSignature signature,
                                          LiteRtParamIndex* num_outputs);
LiteRtStatus LiteRtGetSignatureInputName(LiteRtSignature signature,
                                         LiteRtParamIndex input_idx,
                                         const char** input_name);
LiteRtStatus LiteRtGetSignatureOutputName(LiteRtSignature signature,
                                          LiteRtParamIndex output_idx,
                                          const char** output_name);
LiteRtStatus LiteRtGetSignatureInputTensorByIndex(LiteRtSignature signature,
                                                  LiteRtParamIndex input_idx,
                                                  LiteRtTensor* tensor);
LiteRtStatus LiteRtGetSignatureOutputTensorByIndex(LiteRtSignature signature,
                                                   LiteRtParamIndex output_idx,
                                                   LiteRtTensor* tensor);
LiteRtStatus LiteRtGetRankedTensorType(LiteRtTensor tensor,
                                       LiteRtRankedTensorType* tensor_type);

/* Options.  The caller keeps ownership of LiteRtOptions (destroy it after
 * the compiled model); LiteRtAddOpaqueOptions takes ownership of the
 * opaque options.  CPU options are the opaque options with identifier
 * "xnnpack" whose payload is a NUL-terminated TOML string, e.g.
 * "num_threads = 2\n". */
LiteRtStatus LiteRtCreateOptions(LiteRtOptions* options);
void LiteRtDestroyOptions(LiteRtOptions options);
LiteRtStatus LiteRtSetOptionsHardwareAccelerators(
    LiteRtOptions options, LiteRtHwAcceleratorSet hardware_accelerators);
LiteRtStatus LiteRtCreateOpaqueOptions(const char* payload_identifier,
                                       void* payload_data,
                                       void (*payload_destructor)(void*),
                                       LiteRtOpaqueOptions* options);
LiteRtStatus LiteRtAddOpaqueOptions(LiteRtOptions options,
                                    LiteRtOpaqueOptions opaque_options);
LiteRtStatus LiteRtAddCustomOpKernelOption(
    LiteRtOptions options, const char* custom_op_name, int custom_op_version,
    const LiteRtCustomOpKernel* custom_op_kernel,
    void* custom_op_kernel_user_data);

/* Compiled model. */
LiteRtStatus LiteRtCreateCompiledModel(LiteRtEnvironment environment,
                                       LiteRtModel model,
                                       LiteRtOptions compilation_options,
                                       LiteRtCompiledModel* compiled_model);
void LiteRtDestroyCompiledModel(LiteRtCompiledModel compiled_model);
/* Current shapes (after resizes); update_allocation=true also re-allocates
 * outputs for new input shapes. */
LiteRtStatus LiteRtGetCompiledModelInputTensorLayout(
    LiteRtCompiledModel compiled_model, LiteRtParamIndex signature_index,
    LiteRtParamIndex input_index, LiteRtLayout* layout);
LiteRtStatus LiteRtGetCompiledModelOutputTensorLayouts(
    LiteRtCompiledModel compiled_model, LiteRtParamIndex signature_index,
    size_t num_layouts, LiteRtLayout* layouts, bool update_allocation);
LiteRtStatus LiteRtRunCompiledModel(LiteRtCompiledModel compiled_model,
                                    LiteRtParamIndex signature_index,
                                    size_t num_input_buffers,
                                    LiteRtTensorBuffer* input_buffers,
                                    size_t num_output_buffers,
                                    LiteRtTensorBuffer* output_buffers);

/* Tensor buffers. */
LiteRtStatus LiteRtCreateManagedTensorBuffer(
    LiteRtEnvironment env, LiteRtTensorBufferType buffer_type,
    const LiteRtRankedTensorType* tensor_type, size_t buffer_size,
    LiteRtTensorBuffer* buffer);
void LiteRtDestroyTensorBuffer(LiteRtTensorBuffer buffer);
LiteRtStatus LiteRtGetTensorBufferTensorType(
    LiteRtTensorBuffer tensor_buffer, LiteRtRankedTensorType* tensor_type);
LiteRtStatus LiteRtGetTensorBufferSize(LiteRtTensorBuffer tensor_buffer,
                                       size_t* size);
LiteRtStatus LiteRtLockTensorBuffer(LiteRtTensorBuffer tensor_buffer,
                                    void** host_mem_addr,
                                    LiteRtTensorBufferLockMode lock_mode);
LiteRtStatus LiteRtUnlockTensorBuffer(LiteRtTensorBuffer buffer);

#ifdef __cplusplus
}  /* extern "C" */
#endif

/* The layouts the headers pin (LP64). */
#if defined(__cplusplus)
static_assert(sizeof(LiteRtLayout) == 68, "LiteRtLayout size");
static_assert(offsetof(LiteRtLayout, dimensions) == 4, "LiteRtLayout.dimensions");
static_assert(offsetof(LiteRtLayout, strides) == 36, "LiteRtLayout.strides");
static_assert(sizeof(LiteRtRankedTensorType) == 72, "LiteRtRankedTensorType size");
static_assert(offsetof(LiteRtRankedTensorType, layout) == 4,
              "LiteRtRankedTensorType.layout");
static_assert(sizeof(LiteRtCustomOpKernel) == 4 * sizeof(void*),
              "LiteRtCustomOpKernel size");
#else
_Static_assert(sizeof(LiteRtLayout) == 68, "LiteRtLayout size");
_Static_assert(sizeof(LiteRtRankedTensorType) == 72, "LiteRtRankedTensorType size");
#endif

#endif /* FUSEKIT_USE_LITERT_HEADERS */
#endif /* FUSEKIT_LITERT_ABI_H_ */
