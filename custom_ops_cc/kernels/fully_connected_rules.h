// What fusekit's two fully-connected kernels (int8 and float32 weights)
// share with TFLite's FULLY_CONNECTED: the fused activation as a clamp and
// the output's shape.  One place, so the two kernels cannot drift apart.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace fusekit {

// Weight rows a streaming kernel reads together, as that many independent
// streams (more loads in flight than one stream gets from the hardware
// prefetcher), with a software prefetch ahead (each kernel says how far);
// also the unit threads split the rows by.
inline constexpr int kStreamRows = 8;

// The `activation` attr as the clamp [*lo, *hi]; sets *error for a name
// TFLite's FULLY_CONNECTED does not fuse.
inline void ActivationClamp(const std::string& act, float* lo, float* hi, std::string* error) {
  const float inf = std::numeric_limits<float>::infinity();
  if (act == "none") {
    *lo = -inf, *hi = inf;
  } else if (act == "relu") {
    *lo = 0.0f, *hi = inf;
  } else if (act == "relu6") {
    *lo = 0.0f, *hi = 6.0f;
  } else if (act == "relu_n1_to_1") {
    *lo = -1.0f, *hi = 1.0f;
  } else {
    *error = "attr 'activation' must be none, relu, relu6 or relu_n1_to_1, got '" + act + "'";
  }
}

// y = x with its last dim the weights' rows; x's last dim must be the
// weights' columns, and a bias one value per weight row.
template <typename W>
TfLiteStatus PrepareFullyConnected(OpContext& ctx, const In<float>& x, const In<W>& w,
                                   const Opt<float>& bias, const Out<float>& y) {
  const int64_t n = w.dim(0);
  FUSEKIT_ENSURE_EQ(ctx, x.dim(-1), w.dim(1), "x's last dim and the weights' columns");
  FUSEKIT_ENSURE(ctx, w.dim(1) > 0, "the weights must have at least one column");
  if (bias.present()) {
    FUSEKIT_ENSURE(ctx, bias.rank() == 1 && bias.dim(0) == n,
                   "bias must be a vector of %d elements (the weights' rows)",
                   static_cast<int>(n));
  }
  std::vector<int> shape = x.shape();
  shape.back() = static_cast<int>(n);
  return ctx.ResizeOutput(y, shape);
}

}  // namespace fusekit
