// fusekit_layer_norm: y = (x - mean) / sqrt(var + epsilon) * gamma + beta
// over the last axis of x.  Inputs: x [..., D] float32, then gamma [D] when
// attr `scale`, then beta [D] when attr `center` (Keras' scale=False /
// center=False drop them).  Attrs: epsilon (float, 1e-5), scale, center.
//
// One read pass gathers the row's statistics and one pass writes the output
// (the row is still in L1).  The sums are taken around a first estimate of
// the mean: plain sum / sum-of-squares loses several digits when the mean is
// large against the spread (inputs around 1e4), shifted sums stay within
// TensorFlow's own float32 error at no cost.
#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/layer_norm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "fusekit/simd_tail.h"

// gamma / beta may be null (no scale / no center).
void LayerNormRows(const float* HWY_RESTRICT x, const float* HWY_RESTRICT gamma,
                   const float* HWY_RESTRICT beta, float* HWY_RESTRICT y,
                   int64_t rows, int64_t depth, float epsilon) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t probe = depth < 16 ? depth : 16;
  const auto one = hn::Set(d, 1.0f);
  const auto zero = hn::Zero(d);
  for (int64_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT xr = x + r * depth;
    float* HWY_RESTRICT yr = y + r * depth;

    float shift = 0.0f;
    for (int64_t i = 0; i < probe; ++i) shift += xr[i];
    shift /= static_cast<float>(probe);

    const auto vshift = hn::Set(d, shift);
    auto s1a = hn::Zero(d), s1b = hn::Zero(d);
    auto s2a = hn::Zero(d), s2b = hn::Zero(d);
    int64_t i = 0;
    for (; i + 2 * lanes <= depth; i += 2 * lanes) {
      const auto a = hn::Sub(hn::LoadU(d, xr + i), vshift);
      const auto b = hn::Sub(hn::LoadU(d, xr + i + lanes), vshift);
      s1a = hn::Add(s1a, a);
      s1b = hn::Add(s1b, b);
      s2a = hn::MulAdd(a, a, s2a);
      s2b = hn::MulAdd(b, b, s2b);
    }
    for (; i < depth; i += lanes) {
      const size_t n = static_cast<size_t>(depth - i < lanes ? depth - i : lanes);
      // Masked-off lanes load 0 and would count as -shift: mask them again.
      const auto m = hn::FirstN(d, n);
      const auto a = hn::IfThenElseZero(m, hn::Sub(LoadTail(d, xr + i, n), vshift));
      s1a = hn::Add(s1a, a);
      s2a = hn::MulAdd(a, a, s2a);
    }
    const float s1 = hn::GetLane(hn::SumOfLanes(d, hn::Add(s1a, s1b)));
    const float s2 = hn::GetLane(hn::SumOfLanes(d, hn::Add(s2a, s2b)));

    const float inv_n = 1.0f / static_cast<float>(depth);
    const float mean_shifted = s1 * inv_n;
    float var = s2 * inv_n - mean_shifted * mean_shifted;
    if (var < 0.0f) var = 0.0f;
    const float mean = shift + mean_shifted;
    const float rstd = 1.0f / std::sqrt(var + epsilon);

    const auto vmean = hn::Set(d, mean);
    const auto vrstd = hn::Set(d, rstd);
    for (i = 0; i < depth; i += lanes) {
      const size_t n = static_cast<size_t>(depth - i < lanes ? depth - i : lanes);
      const bool full = n == static_cast<size_t>(lanes);
      const auto xv = full ? hn::LoadU(d, xr + i) : LoadTail(d, xr + i, n);
      const auto g = gamma ? (full ? hn::LoadU(d, gamma + i) : LoadTail(d, gamma + i, n)) : one;
      const auto b = beta ? (full ? hn::LoadU(d, beta + i) : LoadTail(d, beta + i, n)) : zero;
      const auto out = hn::MulAdd(hn::Mul(hn::Sub(xv, vmean), vrstd), g, b);
      if (full) {
        hn::StoreU(out, d, yr + i);
      } else {
        StoreTail(out, d, yr + i, n);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fusekit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

class LayerNorm {
 public:
  LayerNorm(const Attrs& attrs, std::string* error)
      : epsilon_(static_cast<float>(attrs.Float("epsilon"))),
        scale_(attrs.Bool("scale")),
        center_(attrs.Bool("center")),
        compute_(FUSEKIT_SIMD_CHOOSE(LayerNormRows)) {
    if (!(epsilon_ >= 0.0f) || !std::isfinite(epsilon_)) {
      *error = "attr 'epsilon' must be a finite number >= 0, got " +
               std::to_string(epsilon_);
    }
  }

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, Opt<float> in1, Opt<float> in2,
                       Out<float> y) {
    const int expected = 1 + scale_ + center_;
    FUSEKIT_ENSURE(ctx, ctx.num_inputs() == expected,
                   "expected %d inputs (x%s%s, from attrs scale=%d center=%d), got %d",
                   expected, scale_ ? ", gamma" : "", center_ ? ", beta" : "", scale_,
                   center_, ctx.num_inputs());
    FUSEKIT_ENSURE(ctx, x.rank() >= 1, "input x must have rank >= 1, got rank 0");
    const int depth = x.dim(-1);
    const Tensor params[2] = {in1, in2};
    const char* names[2] = {scale_ ? "gamma" : "beta", "beta"};
    for (int k = 0; k + 1 < expected; ++k) {
      const Tensor& p = params[k];
      FUSEKIT_ENSURE(ctx, p.num_elements() == depth && p.rank() <= 1,
                     "%s must be a vector of length %d (x's last dim), got %lld "
                     "elements in rank %d",
                     names[k], depth, static_cast<long long>(p.num_elements()), p.rank());
    }
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, Opt<float> in1, Opt<float> in2,
                      Out<float> y) {
    const int64_t depth = x.dim(-1);
    if (depth == 0 || x.num_elements() == 0) return kTfLiteOk;
    const float* gamma = scale_ ? in1.data() : nullptr;
    const float* beta = center_ ? (scale_ ? in2.data() : in1.data()) : nullptr;
    const float* xs = x.data();
    float* ys = y.data();
    const int64_t rows = x.num_elements() / depth;
    // About 16 KB of x per chunk keeps the hand-off cost well under the work.
    const int64_t grain = depth >= 4096 ? 1 : 4096 / depth + 1;
    ctx.ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
      compute_(xs + begin * depth, gamma, beta, ys + begin * depth, end - begin, depth,
               epsilon_);
    });
    return kTfLiteOk;
  }

 private:
  float epsilon_;
  bool scale_, center_;
  decltype(FUSEKIT_SIMD_CHOOSE(LayerNormRows)) compute_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_layer_norm", LayerNorm, Inputs("x", "gamma", "beta"),
                        Outputs("y"),
                        AttrSchema(attr::Float("epsilon", 1e-5), attr::Bool("scale", true),
                                   attr::Bool("center", true)));

}  // namespace fusekit

#endif  // HWY_ONCE
