// my_custom_fused_op: the op of the TFLite operation-fusion guide, with a
// real computation.  Given two tensors of the same shape it returns
//   output_1 = input_1 * sigmoid(input_2)              (a gated unit)
//   output_2 = clip(input_1 + input_2, -limit, limit)  (a clipped residual)
// where limit is the int attr `example_option` (default 10).
//
// Written only against fusekit's kernel SDK: build it with
//   fusekit.build_plugin("my_ops", ["my_custom_fused_op.cc"])
#include <algorithm>
#include <cmath>

#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::OpContext;
using fusekit::Out;

class MyCustomFusedOp {
 public:
  MyCustomFusedOp(const fusekit::Attrs& attrs, std::string* error)
      : limit_(static_cast<float>(attrs.Int("example_option"))) {
    if (limit_ < 0) *error = "attr 'example_option' must be >= 0";
  }

  // The parameter lists are the schema: two float32 inputs, two float32
  // outputs.  The SDK has checked arity and dtypes before either runs.
  TfLiteStatus Prepare(OpContext& ctx, In<float> a, In<float> b, Out<float> gated,
                       Out<float> clipped) {
    FUSEKIT_ENSURE(ctx, a.shape() == b.shape(),
                   "input_1 and input_2 must have the same shape");
    FUSEKIT_ENSURE_OK(ctx.ResizeOutput(gated, a.shape()));
    return ctx.ResizeOutput(clipped, a.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> a, In<float> b, Out<float> gated,
                      Out<float> clipped) {
    const float* x = a.data();
    const float* y = b.data();
    float* g = gated.data();
    float* c = clipped.data();
    // Elementwise: split across the interpreter's threads in chunks of 16K.
    ctx.ParallelFor(a.num_elements(), 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        g[i] = x[i] / (1.0f + std::exp(-y[i]));
        c[i] = std::min(std::max(x[i] + y[i], -limit_), limit_);
      }
    });
    return kTfLiteOk;
  }

 private:
  float limit_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("my_custom_fused_op", MyCustomFusedOp,
                        fusekit::Inputs("input_1", "input_2"),
                        fusekit::Outputs("output_1", "output_2"),
                        fusekit::AttrSchema(fusekit::attr::Int("example_option", 10)));
