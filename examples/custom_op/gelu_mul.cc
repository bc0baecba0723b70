// gelu_mul: gelu_tanh(x) * y, the gate of a GeGLU feed-forward block, as
// one op.  Given two float32 tensors of the same shape it returns
//   out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) * y
// (PyTorch's gelu(approximate="tanh"), TensorFlow's gelu(approximate=True)).
//
// docs/custom_op.md measures it against the unfused ops XNNPACK runs (GELU
// and MUL): the example of a fused kernel that does NOT beat them.
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gelu_mul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace gelu_ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "fusekit/simd_tail.h"

template <class D, class V>
HWY_INLINE V GeluMul(D d, V x, V y) {
  const V inner = hn::Mul(hn::Set(d, 0.7978845608f),
                          hn::MulAdd(hn::Mul(hn::Set(d, 0.044715f), hn::Mul(x, x)), x, x));
  const V half_x = hn::Mul(hn::Set(d, 0.5f), x);
  return hn::Mul(hn::MulAdd(half_x, hn::Tanh(d, inner), half_x), y);
}

void GeluMulRange(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                  float* HWY_RESTRICT out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(GeluMul(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(GeluMul(d, LoadTail(d, a + i, rest), LoadTail(d, b + i, rest)), d, out + i, rest);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace gelu_ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <string>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace gelu_ops {
namespace {

using fusekit::In;
using fusekit::OpContext;
using fusekit::Out;
using RangeFn = void (*)(const float*, const float*, float*, int64_t);

class GeluMulOp {
 public:
  GeluMulOp(const fusekit::Attrs&, std::string*) : range_(FUSEKIT_SIMD_CHOOSE(GeluMulRange)) {}

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<float> y, Out<float> out) {
    FUSEKIT_ENSURE(ctx, x.shape() == y.shape(), "x and y must have the same shape");
    return ctx.ResizeOutput(out, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<float> y, Out<float> out) {
    const float* a = x.data();
    const float* b = y.data();
    float* o = out.data();
    ctx.ParallelFor(x.num_elements(), 1 << 14, [&](int64_t begin, int64_t end) {
      range_(a + begin, b + begin, o + begin, end - begin);
    });
    return kTfLiteOk;
  }

 private:
  RangeFn range_;
};

}  // namespace
}  // namespace gelu_ops

FUSEKIT_REGISTER_KERNEL("gelu_mul", gelu_ops::GeluMulOp, fusekit::Inputs("x", "y"),
                        fusekit::Outputs("out"), fusekit::AttrSchema());

#endif  // HWY_ONCE
