/* fusekit's kernels in LiteRT's CompiledModel API, for C and C++ apps.
 *
 *   if (fusekit_litert_check_model(data, size) != kLiteRtStatusOk) {
 *     puts(fusekit_litert_last_error(NULL)); ...   (before compiling: see below)
 *   }
 *   LiteRtOptions options;
 *   LiteRtCreateOptions(&options);
 *   LiteRtSetOptionsHardwareAccelerators(options, kLiteRtHwAcceleratorCpu);
 *   FusekitLiteRt* fusekit = fusekit_litert_add_kernels(options, NULL, 2);
 *   if (!fusekit) { puts(fusekit_litert_last_error(NULL)); ... }
 *   LiteRtCreateCompiledModel(env, model, options, &compiled);
 *   ... LiteRtRunCompiledModel(...);
 *   if (fusekit_litert_last_error(fusekit)) { the run failed: say why }
 *   LiteRtDestroyCompiledModel(compiled);
 *   fusekit_litert_release(fusekit);
 *   LiteRtDestroyOptions(options);
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

/* Registers this library's kernels (all of them when `ops_or_null` is NULL,
 * else the NULL-terminated list of op names) as custom-op kernels on
 * `options`.  Kernels run on `num_threads` threads (< 1: one); pass the
 * same count as the CPU options.  Use one handle for one compiled model.
 * Returns NULL on failure (fusekit_litert_last_error(NULL) says why). */
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

/* Releases the handle; call it after LiteRtDestroyCompiledModel. */
FUSEKIT_LITERT_API void fusekit_litert_release(FusekitLiteRt* handle);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FUSEKIT_LITERT_H_ */
