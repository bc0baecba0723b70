// fusekit_layer_norm: y = (x - mean) / sqrt(var + epsilon) * gamma + beta
// over the last axis of x.  Inputs: x [..., D] float32 or float16 (all
// operands one dtype; float16 is computed in float32), gamma [D] and beta
// [D], each optional (absent: tensor index -1; Keras' scale=False /
// center=False).  Attrs: epsilon (float >= 0, 1e-5), y_shape (ints, absent
// or empty: x's dims): y's dims, holding x's elements (declared_dims.h).
// Options version 2; version 1 packed the present ones after x, named by
// bool attrs `scale` and `center` (the SDK maps such nodes).
//
// One read pass gathers the row's statistics and one pass writes the output
// (the row is still in L1).  The sums are taken around a first estimate of
// the mean: plain sum / sum-of-squares loses several digits when the mean is
// large against the spread (inputs around 1e4), shifted sums stay within
// TensorFlow's own float32 error at no cost.
#include <cmath>
#include <cstdint>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/layer_norm.cc"
#include "fusekit/simd_begin.h"

// Loads `count` (< a full vector when partial) elements of storage type T
// as float32 lanes.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF(DF df, const T* HWY_RESTRICT p, size_t count,
                                bool full) {
  if constexpr (std::is_same_v<T, float>) {
    return full ? hn::LoadU(df, p) : LoadTail(df, p, count);
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, full ? hn::LoadU(dh, p) : LoadTail(dh, p, count));
  }
}

template <class DF, typename T>
HWY_INLINE void StoreF(hn::VFromD<DF> v, DF df, T* HWY_RESTRICT p, size_t count,
                       bool full) {
  if constexpr (std::is_same_v<T, float>) {
    if (full) {
      hn::StoreU(v, df, p);
    } else {
      StoreTail(v, df, p, count);
    }
  } else {
    const hn::Rebind<T, DF> dh;
    const auto h = hn::DemoteTo(dh, v);
    if (full) {
      hn::StoreU(h, dh, p);
    } else {
      StoreTail(h, dh, p, count);
    }
  }
}

// gamma / beta may be null (no scale / no center).
template <typename T>
void LayerNormRowsT(const T* HWY_RESTRICT x, const T* HWY_RESTRICT gamma,
                    const T* HWY_RESTRICT beta, T* HWY_RESTRICT y, int64_t rows,
                    int64_t depth, float epsilon) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // The first vector of the row estimates the mean (the shift).
  const size_t probe = static_cast<size_t>(depth < lanes ? depth : lanes);
  const auto one = hn::Set(d, 1.0f);
  const auto zero = hn::Zero(d);
  for (int64_t r = 0; r < rows; ++r) {
    const T* HWY_RESTRICT xr = x + r * depth;
    T* HWY_RESTRICT yr = y + r * depth;

    const auto head = hn::IfThenElseZero(
        hn::FirstN(d, probe), LoadF(d, xr, probe, probe == static_cast<size_t>(lanes)));
    const float shift =
        hn::GetLane(hn::SumOfLanes(d, head)) / static_cast<float>(probe);

    const auto vshift = hn::Set(d, shift);
    auto s1a = hn::Zero(d), s1b = hn::Zero(d);
    auto s2a = hn::Zero(d), s2b = hn::Zero(d);
    int64_t i = 0;
    for (; i + 2 * lanes <= depth; i += 2 * lanes) {
      const auto a = hn::Sub(LoadF(d, xr + i, lanes, true), vshift);
      const auto b = hn::Sub(LoadF(d, xr + i + lanes, lanes, true), vshift);
      s1a = hn::Add(s1a, a);
      s1b = hn::Add(s1b, b);
      s2a = hn::MulAdd(a, a, s2a);
      s2b = hn::MulAdd(b, b, s2b);
    }
    for (; i < depth; i += lanes) {
      const size_t n = static_cast<size_t>(depth - i < lanes ? depth - i : lanes);
      // Masked-off lanes load 0 and would count as -shift: mask them again.
      const auto m = hn::FirstN(d, n);
      const auto a = hn::IfThenElseZero(
          m, hn::Sub(LoadF(d, xr + i, n, n == static_cast<size_t>(lanes)), vshift));
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
      const auto xv = LoadF(d, xr + i, n, full);
      const auto g = gamma ? LoadF(d, gamma + i, n, full) : one;
      const auto b = beta ? LoadF(d, beta + i, n, full) : zero;
      StoreF(hn::MulAdd(hn::Mul(hn::Sub(xv, vmean), vrstd), g, b), d, yr + i, n, full);
    }
  }
}

void LayerNormRowsF32(const float* x, const float* gamma, const float* beta, float* y,
                      int64_t rows, int64_t depth, float epsilon) {
  LayerNormRowsT(x, gamma, beta, y, rows, depth, epsilon);
}

// fusekit::Half and hwy::float16_t are both the raw IEEE half bits.
void LayerNormRowsF16(const void* x, const void* gamma, const void* beta, void* y,
                      int64_t rows, int64_t depth, float epsilon) {
  using H = hwy::float16_t;
  LayerNormRowsT(static_cast<const H*>(x), static_cast<const H*>(gamma),
                 static_cast<const H*>(beta), static_cast<H*>(y), rows, depth, epsilon);
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"
#include "kernels/declared_dims.h"

namespace fusekit {
namespace {

// Storage type -> the dispatched row function.
template <typename T>
struct RowsFn;
template <>
struct RowsFn<float> {
  using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t,
                      float);
  static Fn Choose() { return FUSEKIT_SIMD_CHOOSE(LayerNormRowsF32); }
};
template <>
struct RowsFn<Half> {
  using Fn = void (*)(const void*, const void*, const void*, void*, int64_t, int64_t,
                      float);
  static Fn Choose() { return FUSEKIT_SIMD_CHOOSE(LayerNormRowsF16); }
};

template <typename T>
class LayerNorm {
 public:
  LayerNorm(const Attrs& attrs, std::string* error)
      : epsilon_(static_cast<float>(attrs.Float("epsilon"))),
        y_shape_(ParseDeclaredDims(attrs, "y_shape", error)),
        compute_(RowsFn<T>::Choose()) {}

  // The SDK checked x's rank and that gamma and beta, where present, are
  // vectors of x's last dim.
  TfLiteStatus Prepare(OpContext& ctx, In<T> x, Opt<T>, Opt<T>, Out<T> y) {
    return ResizeDeclared(ctx, y, x.shape(), y_shape_, "y_shape");
  }

  TfLiteStatus Invoke(OpContext& ctx, In<T> x, Opt<T> gamma_in, Opt<T> beta_in, Out<T> y) {
    const int64_t depth = x.dim(-1);
    if (depth == 0 || x.num_elements() == 0) return kTfLiteOk;
    const T* gamma = gamma_in.data();
    const T* beta = beta_in.data();
    const T* xs = x.data();
    T* ys = y.data();
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
  std::vector<int64_t> y_shape_;
  typename RowsFn<T>::Fn compute_;
};

using LayerNormF32 = LayerNorm<float>;
using LayerNormF16 = LayerNorm<Half>;

}  // namespace

#define FUSEKIT_LAYER_NORM_SCHEMA                                              \
  Inputs(OperandSpec("x").MinRank(1), OperandSpec("gamma").VectorOf("x", -1).AbsentIs(1), \
         OperandSpec("beta").VectorOf("x", -1).AbsentIs(0)),                     \
      Outputs("y"), AttrSchema(attr::Float("epsilon", 1e-5).Min(0), attr::Ints("y_shape")), \
      OptionsFormat(2).V1Presence("gamma", "scale").V1Presence("beta", "center")
FUSEKIT_REGISTER_KERNEL("fusekit_layer_norm", LayerNormF32, FUSEKIT_LAYER_NORM_SCHEMA);
FUSEKIT_REGISTER_KERNEL("fusekit_layer_norm", LayerNormF16, FUSEKIT_LAYER_NORM_SCHEMA);

}  // namespace fusekit

#endif  // HWY_ONCE
