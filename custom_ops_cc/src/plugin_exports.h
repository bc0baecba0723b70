// The C entry points a fusekit plugin library exports besides the external
// delegate ABI.  Everything else stays hidden (-fvisibility=hidden), so two
// plugins in one process keep separate kernel registries.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusekit/tflite_abi.h"

#define FUSEKIT_EXPORT __attribute__((visibility("default")))

extern "C" {

// FUSEKIT_ABI_VERSION of the SDK the plugin was built with.
FUSEKIT_EXPORT int fusekit_abi_version(void);

// Number of kernels in this plugin, and the name of kernel i.
FUSEKIT_EXPORT int fusekit_num_kernels(void);
FUSEKIT_EXPORT const char* fusekit_kernel_name(int i);

// Kernel i's schema as JSON: {"name", "inputs": [{"name", "optional"}],
// "outputs": [{"name"}], "attrs": [{"name", "type", "required", "default"}],
// "signatures": [{"inputs": [dtype, ...], "outputs": [dtype, ...]}]}.
FUSEKIT_EXPORT const char* fusekit_kernel_schema(int i);

// NULL when the library's kernels registered cleanly, else why not (e.g. one
// op name registered twice with the same dtypes).  Such a library refuses
// to create its delegate.
FUSEKIT_EXPORT const char* fusekit_plugin_error(void);

// The SIMD target the kernels dispatch to on this CPU (e.g. "AVX2").
FUSEKIT_EXPORT const char* fusekit_simd_target(void);

// Registers every kernel with a tflite::MutableOpResolver through its
// AddCustom(const char*, const TfLiteRegistration*, int, int) member, passed
// as a plain function pointer resolved from the runtime library.  Returns the
// number of kernels registered, or -1.
typedef void (*FusekitAddCustomFn)(void* resolver, const char* name,
                                   const TfLiteRegistration* registration,
                                   int min_version, int max_version);
FUSEKIT_EXPORT int fusekit_register_ops_with(void* resolver,
                                             FusekitAddCustomFn add_custom);

// Reads `bytes` bytes at `data` once on `threads` threads with the widest
// vector loads this CPU has, and returns the XOR of its 8-byte words and
// trailing bytes (so the reads cannot be left out): a memory floor for
// benchmarks.  Only fusekit's own library
// exports it (read_floor.cc), not plugins built with fusekit.build_plugin.
FUSEKIT_EXPORT uint64_t fusekit_read_bytes(const void* data, size_t bytes, int threads);

}  // extern "C"
