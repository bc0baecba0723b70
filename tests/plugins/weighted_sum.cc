// Test kernel with list attrs: y[...] = sum_i x[..., i] * weights[i] * enabled[i]
// over the last axis of x.  Attrs: weights (list of floats), enabled (list
// of bools), both as long as x's last dim; bias (float, default 0).
#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::Out;

class WeightedSum {
 public:
  WeightedSum(const fusekit::Attrs& attrs, std::string* error)
      : weights_(attrs.Floats("weights")),
        enabled_(attrs.Bools("enabled")),
        bias_(attrs.Float("bias")) {
    if (weights_.empty() || weights_.size() != enabled_.size()) {
      *error = "attrs 'weights' and 'enabled' must be non-empty lists of one length";
    }
  }

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    FUSEKIT_ENSURE(ctx, x.rank() >= 1, "x must have rank >= 1, got rank %d", x.rank());
    FUSEKIT_ENSURE(ctx, x.dim(-1) == static_cast<int>(weights_.size()),
                   "x's last dim is %d but 'weights' has %zu entries", x.dim(-1),
                   weights_.size());
    std::vector<int> shape = x.shape();
    shape.pop_back();
    return ctx.ResizeOutput(y, shape);
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> x, Out<float> y) {
    const int64_t depth = x.dim(-1);
    const int64_t rows = x.num_elements() / depth;
    const float* in = x.data();
    float* out = y.data();
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

FUSEKIT_REGISTER_KERNEL("weighted_sum", WeightedSum, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Required(fusekit::attr::Floats("weights")),
                                            fusekit::attr::Required(fusekit::attr::Bools("enabled")),
                                            fusekit::attr::Float("bias", 0.0)));
