// fusekit::RegisterOps for C++ apps built against the real TFLite headers
// (Bazel, or any build that links TFLite's op resolver).
#include "fusekit/register_ops.h"

#include "resolver_adapter.h"
#include "tensorflow/lite/mutable_op_resolver.h"

namespace fusekit {

bool RegisterOps(tflite::MutableOpResolver* resolver) {
  std::string error;
  auto regs = ResolverRegistrations(&error);
  if (!error.empty()) return false;
  for (const auto& [name, reg] : regs) resolver->AddCustom(name, &reg);
  return true;
}

}  // namespace fusekit
