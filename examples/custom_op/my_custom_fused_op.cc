// my_custom_fused_op: the op of the TFLite operation-fusion guide, with a
// real computation.  Given two float32 tensors of the same shape it returns
//   output_1 = input_1 * sigmoid(input_2)              (a gated unit)
//   output_2 = clip(input_1 + input_2, -limit, limit)  (a clipped residual)
// where limit is the int attr `example_option` (default 10).
//
// Written only against fusekit's kernel SDK and Highway (header-only, from
// libhwy-dev): build it with
//   fusekit.build_plugin("my_ops", ["my_custom_fused_op.cc"])
//
// The file is compiled once per SIMD target: hwy/foreach_target.h includes
// it again for each (HWY_TARGET_INCLUDE names it; build_plugin puts its
// folder on the include path), and FUSEKIT_SIMD_CHOOSE picks the target the
// CPU has at run time.  The kernel class is compiled once (HWY_ONCE).
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "my_custom_fused_op.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace my_ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "fusekit/simd_tail.h"

// One vector of both outputs.  Highway's Exp is defined up to 104; past 88
// it is inf in float anyway, so -y is clamped there (sigmoid is 0 in float).
template <class D, class V>
HWY_INLINE void GateAndClip(D d, V x, V y, V limit, V& gated, V& clipped) {
  const V one = hn::Set(d, 1.0f);
  const V e = hn::Exp(d, hn::Min(hn::Neg(y), hn::Set(d, 88.0f)));
  gated = hn::Div(x, hn::Add(one, e));
  clipped = hn::Min(hn::Max(hn::Add(x, y), hn::Neg(limit)), limit);
}

// Elements [0, n) of the four arrays; the last partial vector through
// masked loads and stores (fusekit/simd_tail.h), so no scalar tail loop.
void GateAndClipRange(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                      float* HWY_RESTRICT gated, float* HWY_RESTRICT clipped, int64_t n,
                      float limit) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vlimit = hn::Set(d, limit);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::Vec<decltype(d)> g, c;
    GateAndClip(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i), vlimit, g, c);
    hn::StoreU(g, d, gated + i);
    hn::StoreU(c, d, clipped + i);
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    hn::Vec<decltype(d)> g, c;
    GateAndClip(d, LoadTail(d, a + i, rest), LoadTail(d, b + i, rest), vlimit, g, c);
    StoreTail(g, d, gated + i, rest);
    StoreTail(c, d, clipped + i, rest);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace my_ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <string>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace my_ops {
namespace {

using fusekit::In;
using fusekit::OpContext;
using fusekit::Out;
using RangeFn = void (*)(const float*, const float*, float*, float*, int64_t, float);

class MyCustomFusedOp {
 public:
  // Attrs were checked against the schema below before this runs; a value
  // the schema cannot express (a negative limit) is refused here, and the
  // SDK reports it as "my_custom_fused_op: <error>".
  MyCustomFusedOp(const fusekit::Attrs& attrs, std::string* error)
      : limit_(static_cast<float>(attrs.Int("example_option"))),
        range_(FUSEKIT_SIMD_CHOOSE(GateAndClipRange)) {
    if (limit_ < 0) *error = "attr 'example_option' must be >= 0";
  }

  // The parameter lists are the schema: two float32 inputs, two float32
  // outputs.  The SDK has checked arity and dtypes before either runs.
  // Prepare checks shapes and sizes the outputs.
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
    // Elementwise: chunks of 16K elements on the interpreter's threads.  A
    // chunk's result does not depend on where it starts, so any thread
    // count gives the same bits.
    ctx.ParallelFor(a.num_elements(), 1 << 14, [&](int64_t begin, int64_t end) {
      range_(x + begin, y + begin, g + begin, c + begin, end - begin, limit_);
    });
    return kTfLiteOk;
  }

 private:
  float limit_;
  RangeFn range_;
};

}  // namespace
}  // namespace my_ops

FUSEKIT_REGISTER_KERNEL("my_custom_fused_op", my_ops::MyCustomFusedOp,
                        fusekit::Inputs("input_1", "input_2"),
                        fusekit::Outputs("output_1", "output_2"),
                        fusekit::AttrSchema(fusekit::attr::Int("example_option", 10)));

#endif  // HWY_ONCE
