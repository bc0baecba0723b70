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

class MyCustomFusedOp : public fusekit::Kernel {
 public:
  MyCustomFusedOp(const fusekit::Attrs& attrs, std::string* error)
      : limit_(static_cast<float>(attrs.GetInt("example_option", 10))) {
    if (limit_ < 0) *error = "attr 'example_option' must be >= 0";
  }

  TfLiteStatus Prepare(fusekit::OpContext& ctx) override {
    const fusekit::Tensor a = ctx.input(0), b = ctx.input(1);
    if (ctx.ExpectType(a, "input_1", kTfLiteFloat32) != kTfLiteOk ||
        ctx.ExpectType(b, "input_2", kTfLiteFloat32) != kTfLiteOk) {
      return kTfLiteError;
    }
    if (a.shape() != b.shape()) {
      return ctx.Fail("input_1 and input_2 must have the same shape");
    }
    if (ctx.ResizeOutput(0, a.shape()) != kTfLiteOk) return kTfLiteError;
    return ctx.ResizeOutput(1, a.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext& ctx) override {
    const float* a = ctx.input(0).data<float>();
    const float* b = ctx.input(1).data<float>();
    float* gated = ctx.output(0).data<float>();
    float* clipped = ctx.output(1).data<float>();
    const int64_t n = ctx.input(0).num_elements();
    for (int64_t i = 0; i < n; ++i) {
      gated[i] = a[i] / (1.0f + std::exp(-b[i]));
      clipped[i] = std::min(std::max(a[i] + b[i], -limit_), limit_);
    }
    return kTfLiteOk;
  }

 private:
  float limit_;
};

}  // namespace

// Name, kernel class, min and max inputs, outputs.
FUSEKIT_REGISTER_KERNEL("my_custom_fused_op", MyCustomFusedOp, 2, 2, 2);
