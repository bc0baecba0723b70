// Test kernel for the SDK's quantization accessors: y = scale * (x - zero_point)
// for an int8 input quantized per tensor or per channel (any axis), read
// through Tensor::quantization() from the runtime's own TfLiteTensor.
#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::Out;

class DequantizeProbe {
 public:
  DequantizeProbe(const fusekit::Attrs&, std::string*) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<int8_t> x, Out<float> y) {
    const fusekit::QuantParams q = x.quantization();
    FUSEKIT_ENSURE(ctx, q.count > 0, "x is not affine-quantized");
    if (q.count > 1) {
      FUSEKIT_ENSURE(ctx, q.axis >= 0 && q.axis < x.rank() && x.dim(q.axis) == q.count,
                     "x has %d scales on axis %d, dim %d", q.count, q.axis, x.dim(q.axis));
    }
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<int8_t> x, Out<float> y) {
    const fusekit::QuantParams q = x.quantization();
    // Elements between consecutive indices of the quantized axis.
    int64_t inner = 1;
    for (int d = q.axis + 1; q.count > 1 && d < x.rank(); ++d) inner *= x.dim(d);
    const int64_t n = x.num_elements();
    for (int64_t i = 0; i < n; ++i) {
      const int c = q.count > 1 ? static_cast<int>((i / inner) % q.count) : 0;
      const int32_t zp = q.zero_points ? q.zero_points[c] : 0;
      y.data()[i] = q.scales[c] * static_cast<float>(x.data()[i] - zp);
    }
    return kTfLiteOk;
  }
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("dequantize_probe", DequantizeProbe, fusekit::Inputs("x"),
                        fusekit::Outputs("y"));
