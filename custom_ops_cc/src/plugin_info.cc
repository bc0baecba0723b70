// Introspection exports: which kernels this library holds with their
// schemas, its SDK ABI version, whether its registry is usable, and the SIMD
// target chosen on this CPU.
#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"
#include "plugin_exports.h"

extern "C" {

FUSEKIT_EXPORT int fusekit_abi_version(void) { return FUSEKIT_ABI_VERSION; }

FUSEKIT_EXPORT int fusekit_num_kernels(void) {
  return static_cast<int>(fusekit::KernelRegistry().size());
}

FUSEKIT_EXPORT const char* fusekit_kernel_name(int i) {
  const auto& registry = fusekit::KernelRegistry();
  if (i < 0 || i >= static_cast<int>(registry.size())) return nullptr;
  return registry[i].name.c_str();
}

FUSEKIT_EXPORT const char* fusekit_kernel_schema(int i) {
  const auto& registry = fusekit::KernelRegistry();
  if (i < 0 || i >= static_cast<int>(registry.size())) return nullptr;
  return registry[i].schema_json.c_str();
}

FUSEKIT_EXPORT const char* fusekit_plugin_error(void) {
  const std::string& error = fusekit::RegistryError();
  return error.empty() ? nullptr : error.c_str();
}

FUSEKIT_EXPORT const char* fusekit_simd_target(void) {
  return fusekit::SimdTargetName();
}

}  // extern "C"
