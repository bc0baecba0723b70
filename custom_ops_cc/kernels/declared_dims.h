// Dims an op declares for an output (attr `<output>_shape`): the result is
// written row-major as ever, into a tensor of these dims holding the same
// elements, as a RESHAPE after the op would have made it (the reshapes pass
// drops the RESHAPE, which the runtime would have run as a copy).
#ifndef FUSEKIT_KERNELS_DECLARED_DIMS_H_
#define FUSEKIT_KERNELS_DECLARED_DIMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace fusekit {

// The dims attr `key` (absent or empty: none); sets *error when malformed.
inline std::vector<int64_t> ParseDeclaredDims(const Attrs& attrs, const char* key,
                                              std::string* error) {
  if (!attrs.Has(key)) return {};
  std::vector<int64_t> v = attrs.Ints(key);
  bool ok = v.size() <= 8;
  for (int64_t d : v) ok = ok && d >= 0 && d <= INT32_MAX;
  if (!ok) {
    *error = std::string("attr '") + key + "' must be at most 8 dims, each in [0, 2^31)";
    return {};
  }
  return v;
}

// Resizes `out` to `declared` when given (checked to hold as many elements
// as `dims`, the result's own dims), else to `dims`.
inline TfLiteStatus ResizeDeclared(OpContext& ctx, const Tensor& out, const std::vector<int>& dims,
                                   const std::vector<int64_t>& declared, const char* key) {
  if (declared.empty()) return ctx.ResizeOutput(out, dims);
  int64_t want = 1, got = 1;
  for (int d : dims) want *= d;
  for (int64_t d : declared) got *= d;
  FUSEKIT_ENSURE(ctx, got == want, "%s holds %lld elements, the result %lld", key,
                 static_cast<long long>(got), static_cast<long long>(want));
  return ctx.ResizeOutput(out, std::vector<int>(declared.begin(), declared.end()));
}

}  // namespace fusekit

#endif  // FUSEKIT_KERNELS_DECLARED_DIMS_H_
