// Test kernel with list attrs: y[...] = sum_i x[..., i] * weights[i] * enabled[i]
// over the last axis of x.  Attrs: weights (list of floats), enabled (list
// of bools), both as long as x's last dim; bias (float, default 0).
#include "fusekit/kernel_sdk.h"

namespace {

class WeightedSum : public fusekit::Kernel {
 public:
  WeightedSum(const fusekit::Attrs& attrs, std::string* error)
      : weights_(attrs.GetFloats("weights")),
        enabled_(attrs.GetBools("enabled")),
        bias_(attrs.GetFloat("bias", 0.0)) {
    if (!attrs.ok()) {
      *error = attrs.error();
    } else if (weights_.empty() || weights_.size() != enabled_.size()) {
      *error = "attrs 'weights' and 'enabled' must be non-empty lists of one length";
    }
  }

  TfLiteStatus Prepare(fusekit::OpContext& ctx) override {
    const fusekit::Tensor x = ctx.input(0);
    if (ctx.ExpectType(x, "x", kTfLiteFloat32) != kTfLiteOk ||
        ctx.ExpectRankAtLeast(x, "x", 1) != kTfLiteOk) {
      return kTfLiteError;
    }
    if (x.dim(-1) != static_cast<int>(weights_.size())) {
      return ctx.Fail("x's last dim is %d but 'weights' has %zu entries", x.dim(-1),
                      weights_.size());
    }
    std::vector<int> shape = x.shape();
    shape.pop_back();
    return ctx.ResizeOutput(0, shape);
  }

  TfLiteStatus Invoke(fusekit::OpContext& ctx) override {
    const fusekit::Tensor x = ctx.input(0);
    const int64_t depth = x.dim(-1);
    const int64_t rows = x.num_elements() / depth;
    const float* in = x.data<float>();
    float* out = ctx.output(0).data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double acc = bias_;
      for (int64_t i = 0; i < depth; ++i) {
        if (enabled_[i]) acc += in[r * depth + i] * weights_[i];
      }
      out[r] = static_cast<float>(acc);
    }
    return kTfLiteOk;
  }

 private:
  std::vector<double> weights_;
  std::vector<bool> enabled_;
  double bias_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("weighted_sum", WeightedSum, 1, 1, 1);
