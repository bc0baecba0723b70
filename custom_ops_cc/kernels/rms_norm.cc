// fusekit_rms_norm: y = x * rsqrt(mean(x^2) + epsilon) * gamma over the last
// axis of x.  Inputs: x [..., D] float32, gamma [D] float32.  Attrs: epsilon
// (float, 1e-6), y_shape (ints, absent or empty: x's dims): y's dims,
// holding x's elements (declared_dims.h).  Output: x's shape, or y_shape.
//
// Memory bound: one pass reads the row for its sum of squares, a second pass
// (the row is still in L1/L2 for any usual D) writes y, so x crosses the
// memory bus once.  Rows are independent, so the result does not depend on
// how ParallelFor splits them (bitwise the same for any thread count).
//
// Accuracy: four vector accumulators give every float lane a short sum
// (D / (4 * lanes) terms per block), and blocks of kBlock elements are
// added in double, so even very long rows keep float32's own error instead
// of the O(D * eps) of one running float sum.  rsqrt is taken in double.
#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rms_norm.cc"
#include "fusekit/simd_begin.h"

// Sum of squares of p[0, n) in float, four accumulators deep.  The masked
// tail loads zeros past n, whose squares add nothing.
template <class D>
HWY_INLINE float SumSquares(D d, const float* HWY_RESTRICT p, int64_t n) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto v0 = hn::LoadU(d, p + i);
    const auto v1 = hn::LoadU(d, p + i + lanes);
    const auto v2 = hn::LoadU(d, p + i + 2 * lanes);
    const auto v3 = hn::LoadU(d, p + i + 3 * lanes);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
    a2 = hn::MulAdd(v2, v2, a2);
    a3 = hn::MulAdd(v3, v3, a3);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, p + i);
    a0 = hn::MulAdd(v, v, a0);
  }
  if (i < n) {
    const auto v = LoadTail(d, p + i, static_cast<size_t>(n - i));
    a1 = hn::MulAdd(v, v, a1);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

void RmsNormRows(const float* HWY_RESTRICT x, const float* HWY_RESTRICT gamma,
                 float* HWY_RESTRICT y, int64_t rows, int64_t depth, float epsilon) {
  // Elements summed in float before the partial sum goes to double: with
  // four accumulators of 16 lanes, 64 terms per lane at most.
  constexpr int64_t kBlock = 4096;
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT xr = x + r * depth;
    float* HWY_RESTRICT yr = y + r * depth;
    double sum = 0.0;
    for (int64_t b = 0; b < depth; b += kBlock) {
      sum += SumSquares(d, xr + b, depth - b < kBlock ? depth - b : kBlock);
    }
    const double mean_square = sum / static_cast<double>(depth);
    const auto vr =
        hn::Set(d, static_cast<float>(1.0 / std::sqrt(mean_square + epsilon)));
    int64_t i = 0;
    for (; i + lanes <= depth; i += lanes) {
      // (x * r) * gamma: the composite's order of the two products.
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, xr + i), vr), hn::LoadU(d, gamma + i)), d,
                 yr + i);
    }
    if (i < depth) {
      const size_t n = static_cast<size_t>(depth - i);
      StoreTail(hn::Mul(hn::Mul(LoadTail(d, xr + i, n), vr), LoadTail(d, gamma + i, n)), d,
                yr + i, n);
    }
  }
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <string>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"
#include "kernels/declared_dims.h"

namespace fusekit {
namespace {

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, float);

class RmsNorm {
 public:
  RmsNorm(const Attrs& attrs, std::string* error)
      : epsilon_(static_cast<float>(attrs.Float("epsilon"))),
        y_shape_(ParseDeclaredDims(attrs, "y_shape", error)),
        compute_(FUSEKIT_SIMD_CHOOSE(RmsNormRows)) {}

  // The SDK checked x's rank and that gamma is a vector of x's last dim.
  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<float>, Out<float> y) {
    return ResizeDeclared(ctx, y, x.shape(), y_shape_, "y_shape");
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<float> gamma, Out<float> y) {
    const int64_t depth = x.dim(-1);
    const int64_t count = x.num_elements();
    if (depth == 0 || count == 0) return kTfLiteOk;
    const float* xs = x.data();
    const float* g = gamma.data();
    float* ys = y.data();
    const int64_t rows = count / depth;
    // About 16 KB of x per chunk keeps the hand-off cost well under the work.
    const int64_t grain = depth >= 4096 ? 1 : 4096 / depth + 1;
    ctx.ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
      compute_(xs + begin * depth, g, ys + begin * depth, end - begin, depth, epsilon_);
    });
    return kTfLiteOk;
  }

 private:
  float epsilon_;
  std::vector<int64_t> y_shape_;
  RowsFn compute_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_rms_norm", RmsNorm,
                        Inputs(OperandSpec("x").MinRank(1), OperandSpec("gamma").VectorOf("x", -1)),
                        Outputs("y"),
                        AttrSchema(attr::Float("epsilon", 1e-6).Min(0), attr::Ints("y_shape")));

}  // namespace fusekit

#endif  // HWY_ONCE
