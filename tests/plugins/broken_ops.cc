// Two kernels with the kinds of bug fusekit.testing.opcheck exists to catch
// (tests/test_opcheck.py).  Both are right on the cases a first test would
// try: one thread, ordinary shapes.
//
// global_rms: y = x / sqrt(mean(x^2) + 1e-6) over all elements.  The sum
// is split into one part per thread and the parts are added at the end, so
// with 2 threads the float additions happen in another order: close, but
// not the bits of 1 thread.
//
// row_scale: y[r, i] = x[r, i] * depth / (1 + sum_i |x[r, i]|).  It divides
// the element count by the last dim without checking it: an input whose
// last dim is 0 is an integer division by zero (SIGFPE).
#include <cmath>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::OpContext;
using fusekit::Out;

class GlobalRms {
 public:
  GlobalRms(const fusekit::Attrs&, std::string*) {}

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, Out<float> y) {
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, Out<float> y) {
    const int64_t n = x.num_elements();
    const float* in = x.data();
    const int parts = ctx.num_threads();
    std::vector<float> partial(parts, 0.0f);
    ctx.ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        for (int64_t i = p * n / parts; i < (p + 1) * n / parts; ++i) partial[p] += in[i] * in[i];
      }
    });
    float sum = 0.0f;
    for (float p : partial) sum += p;
    const float scale = 1.0f / std::sqrt((n > 0 ? sum / static_cast<float>(n) : 0.0f) + 1e-6f);
    float* out = y.data();
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
    return kTfLiteOk;
  }
};

class RowScale {
 public:
  RowScale(const fusekit::Attrs&, std::string*) {}

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, Out<float> y) {
    FUSEKIT_ENSURE(ctx, x.rank() >= 1, "x must have rank >= 1, got rank %d", x.rank());
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(OpContext&, In<float> x, Out<float> y) {
    // The bug: a last dim of 0 is not refused in Prepare.
    const int64_t depth = x.dim(-1);
    const int64_t rows = x.num_elements() / depth;
    const float* in = x.data();
    float* out = y.data();
    for (int64_t r = 0; r < rows; ++r) {
      float norm = 1.0f;
      for (int64_t i = 0; i < depth; ++i) norm += std::fabs(in[r * depth + i]);
      for (int64_t i = 0; i < depth; ++i) {
        out[r * depth + i] = in[r * depth + i] * static_cast<float>(depth) / norm;
      }
    }
    return kTfLiteOk;
  }
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("global_rms", GlobalRms, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema());
FUSEKIT_REGISTER_KERNEL("row_scale", RowScale, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema());
