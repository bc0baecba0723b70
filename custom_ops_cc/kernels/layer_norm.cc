// fusekit_layer_norm: y = (x - mean) / sqrt(var + epsilon) * gamma + beta
// over the last axis of x.  Inputs: x [..., D] float32, gamma [D], beta [D].
// Attr: epsilon (float, default 1e-5).
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

void LayerNormRows(const float* HWY_RESTRICT x, const float* HWY_RESTRICT gamma,
                   const float* HWY_RESTRICT beta, float* HWY_RESTRICT y,
                   int64_t rows, int64_t depth, float epsilon) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t probe = depth < 16 ? depth : 16;
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
    for (; i + lanes <= depth; i += lanes) {
      const auto a = hn::Sub(hn::LoadU(d, xr + i), vshift);
      s1a = hn::Add(s1a, a);
      s2a = hn::MulAdd(a, a, s2a);
    }
    float s1 = hn::GetLane(hn::SumOfLanes(d, hn::Add(s1a, s1b)));
    float s2 = hn::GetLane(hn::SumOfLanes(d, hn::Add(s2a, s2b)));
    for (; i < depth; ++i) {
      const float a = xr[i] - shift;
      s1 += a;
      s2 += a * a;
    }

    const float inv_n = 1.0f / static_cast<float>(depth);
    const float mean_shifted = s1 * inv_n;
    float var = s2 * inv_n - mean_shifted * mean_shifted;
    if (var < 0.0f) var = 0.0f;
    const float mean = shift + mean_shifted;
    const float rstd = 1.0f / std::sqrt(var + epsilon);

    const auto vmean = hn::Set(d, mean);
    const auto vrstd = hn::Set(d, rstd);
    i = 0;
    for (; i + lanes <= depth; i += lanes) {
      const auto t = hn::Mul(hn::Sub(hn::LoadU(d, xr + i), vmean), vrstd);
      hn::StoreU(hn::MulAdd(t, hn::LoadU(d, gamma + i), hn::LoadU(d, beta + i)),
                 d, yr + i);
    }
    for (; i < depth; ++i) {
      yr[i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace fusekit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <cmath>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

using LayerNormFn = void (*)(const float*, const float*, const float*, float*,
                             int64_t, int64_t, float);

class LayerNormKernel : public Kernel {
 public:
  LayerNormKernel(const Attrs& attrs, std::string* error)
      : epsilon_(static_cast<float>(attrs.GetFloat("epsilon", 1e-5))),
        compute_(FUSEKIT_SIMD_CHOOSE(LayerNormRows)) {
    if (!(epsilon_ >= 0.0f) || !std::isfinite(epsilon_)) {
      *error = "attr 'epsilon' must be a finite number >= 0, got " +
               std::to_string(epsilon_);
    }
  }

  TfLiteStatus Prepare(OpContext& ctx) override {
    const Tensor x = ctx.input(0), gamma = ctx.input(1), beta = ctx.input(2);
    if (ctx.ExpectType(x, "input x", kTfLiteFloat32) != kTfLiteOk ||
        ctx.ExpectType(gamma, "gamma", kTfLiteFloat32) != kTfLiteOk ||
        ctx.ExpectType(beta, "beta", kTfLiteFloat32) != kTfLiteOk ||
        ctx.ExpectRankAtLeast(x, "input x", 1) != kTfLiteOk) {
      return kTfLiteError;
    }
    const int depth = x.dim(-1);
    if (gamma.num_elements() != depth || gamma.rank() > 1) {
      return ctx.Fail("gamma must be a vector of length %d (x's last dim), "
                      "got %lld elements in rank %d",
                      depth, static_cast<long long>(gamma.num_elements()),
                      gamma.rank());
    }
    if (beta.num_elements() != depth || beta.rank() > 1) {
      return ctx.Fail("beta must be a vector of length %d (x's last dim), "
                      "got %lld elements in rank %d",
                      depth, static_cast<long long>(beta.num_elements()),
                      beta.rank());
    }
    if (ctx.ExpectType(ctx.output(0), "output", kTfLiteFloat32) != kTfLiteOk) {
      return kTfLiteError;
    }
    return ctx.ResizeOutput(0, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx) override {
    const Tensor x = ctx.input(0);
    const int64_t depth = x.dim(-1);
    if (depth == 0 || x.num_elements() == 0) return kTfLiteOk;
    compute_(x.data<float>(), ctx.input(1).data<float>(),
             ctx.input(2).data<float>(), ctx.output(0).data<float>(),
             x.num_elements() / depth, depth, epsilon_);
    return kTfLiteOk;
  }

 private:
  float epsilon_;
  LayerNormFn compute_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_layer_norm", LayerNormKernel, 3, 3, 1);

}  // namespace fusekit

#endif  // HWY_ONCE
