/* fusekit's kernels in LiteRT's CompiledModel API, for C and C++ apps.
 *
 *   LiteRtOptions options;
 *   LiteRtCreateOptions(&options);
 *   LiteRtSetOptionsHardwareAccelerators(options, kLiteRtHwAcceleratorCpu);
 *   FusekitLiteRt* fusekit = fusekit_litert_add_model_kernels(options, data, size, 2);
 *   if (!fusekit) { puts(fusekit_litert_last_error(NULL)); ... }
 *   LiteRtCreateModelFromBuffer(env, fusekit_litert_model_data(fusekit),
 *                               fusekit_litert_model_size(fusekit), &model);
 *   LiteRtCreateCompiledModel(env, model, options, &compiled);
 *   ... LiteRtRunCompiledModel(...);
 *   if (fusekit_litert_last_error(fusekit)) { the run failed: say why }
 *   LiteRtDestroyCompiledModel(compiled);
 *   LiteRtDestroyModel(model);
 *   LiteRtDestroyOptions(options);
 *   fusekit_litert_release(fusekit);
 *
 * Why the model is rewritten: LiteRT calls a custom-op kernel per custom
 * code and never says which node a call is for, so nodes of one op (a norm
 * in every layer, prefill and decode signatures) could not be told apart.
 * fusekit_litert_add_model_kernels gives every node of this library's ops a
 * custom code of its own ("<op>@s<subgraph>.op<index>") in a copy of the
 * model that the handle owns, and registers one kernel per node: every call
 * is certain of its node, whatever the shapes and the order signatures run
 * in.  Create the LiteRtModel from that copy (64-byte aligned; weights keep
 * their alignment).  With several fusekit libraries (plugins), pass each the
 * previous one's copy.
 *
 * LiteRT ignores the statuses a custom-op kernel returns, so a node that
 * cannot run (malformed options, a dtype or shape its kernel refuses) leaves
 * its outputs unwritten and LiteRtRunCompiledModel still returns OK: check
 * fusekit_litert_last_error after creating the compiled model and after every
 * run.  A node whose shape inference fails also makes LiteRT's own output
 * resize fail, so creation usually fails too.
 *
 * The library resolves the LiteRT functions it calls at run time from the
 * libLiteRt.so already loaded in the process; it links against nothing. */
#ifndef FUSEKIT_LITERT_H_
#define FUSEKIT_LITERT_H_

#include "fusekit/litert_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FUSEKIT_LITERT_API __attribute__((visibility("default")))
#else
#define FUSEKIT_LITERT_API
#endif

/* The kernels of one library registered on one LiteRtOptions. */
typedef struct FusekitLiteRt FusekitLiteRt;

/* Registers this library's kernels on `options` for the .tflite at `model`
 * (`size` bytes; read, not kept): checks the model as
 * fusekit_litert_check_model does, makes the handle's own copy of it in
 * which every node of this library's ops has its own custom code, and
 * registers one custom-op kernel per such node.  Compile
 * fusekit_litert_model_data(handle), not `model`.  Kernels run on
 * `num_threads` threads (< 1: one); pass the same count as the CPU options.
 * Use one handle for one compiled model.  Returns NULL on failure
 * (fusekit_litert_last_error(NULL) says why). */
FUSEKIT_LITERT_API FusekitLiteRt* fusekit_litert_add_model_kernels(
    LiteRtOptions options, const void* model, size_t size, int num_threads);

/* The handle's copy of the model (64-byte aligned) and its size; it lives
 * until fusekit_litert_release, so destroy the LiteRtModel first.  NULL / 0
 * for a handle from fusekit_litert_add_kernels. */
FUSEKIT_LITERT_API const void* fusekit_litert_model_data(const FusekitLiteRt* handle);
FUSEKIT_LITERT_API size_t fusekit_litert_model_size(const FusekitLiteRt* handle);

/* Registers this library's kernels (all of them when `ops_or_null` is NULL,
 * else the NULL-terminated list of op names) under their op names, without
 * reading the model.  LiteRT then shares one kernel among all nodes of an
 * op and does not say which node a call is for, so this serves a model with
 * at most one node per op: a second node of an op is refused (recorded
 * before any run; nothing is computed for it).  Prefer
 * fusekit_litert_add_model_kernels. */
FUSEKIT_LITERT_API FusekitLiteRt* fusekit_litert_add_kernels(
    LiteRtOptions options, const char* const* ops_or_null, int num_threads);

/* Checks a model buffer for what LiteRT's CompiledModel crashes on instead
 * of refusing: a custom op that lists tensor index -1 (an input left out)
 * among its inputs.  LiteRT dereferences that missing tensor while it
 * prepares the node, before any kernel callback that could refuse it, so
 * call this on every model before LiteRtCreateCompiledModel.  Returns
 * kLiteRtStatusOk, or kLiteRtStatusErrorInvalidArgument with the op, the
 * node and the input in fusekit_litert_last_error(NULL); a buffer that is
 * not a valid .tflite flatbuffer is refused too.  Reads the `size` bytes at
 * `data` and nothing past them. */
FUSEKIT_LITERT_API LiteRtStatus fusekit_litert_check_model(const void* data,
                                                           size_t size);

/* The first error a node of this handle hit since the last clear ("<op>:
 * <message>"), or NULL; with NULL, the error of the last failed
 * fusekit_litert_add_kernels or fusekit_litert_check_model.  The string
 * lives until the next clear (or the next failure of those two). */
FUSEKIT_LITERT_API const char* fusekit_litert_last_error(
    const FusekitLiteRt* handle);
FUSEKIT_LITERT_API void fusekit_litert_clear_error(FusekitLiteRt* handle);

/* Releases the handle; call it after LiteRtDestroyCompiledModel and
 * LiteRtDestroyModel. */
FUSEKIT_LITERT_API void fusekit_litert_release(FusekitLiteRt* handle);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FUSEKIT_LITERT_H_ */
