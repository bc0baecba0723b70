// Test kernels for the SDK's own checks: reading an attr the schema does not
// declare, and the FUSEKIT_ENSURE_EQ family's messages.
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::Out;

// Reads "epsilom" where the schema declares "epsilon": a typo the SDK must
// refuse at node init instead of reading 0.
class TypoAttr {
 public:
  TypoAttr(const fusekit::Attrs& attrs, std::string*)
      : epsilon_(static_cast<float>(attrs.Float("epsilom"))) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> x, Out<float> y) {
    for (int64_t i = 0; i < x.num_elements(); ++i) y.data()[i] = x.data()[i] * epsilon_;
    return kTfLiteOk;
  }

 private:
  float epsilon_;
};

FUSEKIT_REGISTER_KERNEL("sdk_typo", TypoAttr, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Float("epsilon", 0.5)));

// y = x * scale, with x's last dim equal to `size`, scale > 0 and x not of
// shape [1, 1]: each check a comparison macro.
class Checked {
 public:
  Checked(const fusekit::Attrs& attrs, std::string*)
      : size_(attrs.Int("size")), scale_(attrs.Float("scale")) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    FUSEKIT_ENSURE_EQ(ctx, x.rank(), 2);
    FUSEKIT_ENSURE_EQ(ctx, x.dim(-1), size_, "x's last dim against attr '%s'", "size");
    FUSEKIT_ENSURE_GT(ctx, scale_, 0.0);
    FUSEKIT_ENSURE_NE(ctx, x.shape(), std::vector<int>({1, 1}), "x's shape");
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> x, Out<float> y) {
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      y.data()[i] = x.data()[i] * static_cast<float>(scale_);
    }
    return kTfLiteOk;
  }

 private:
  int64_t size_;
  double scale_;
};

FUSEKIT_REGISTER_KERNEL("sdk_checked", Checked, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Int("size", 3),
                                            fusekit::attr::Float("scale", 1.0)));

}  // namespace
