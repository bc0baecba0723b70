// fusekit_fully_connected: y = act(x @ dequantize(w)^T + bias) for float
// activations and int8 weights stored as the model stores them, for the few
// activation rows of a decode step.
//
// Inputs: x [..., K] float32; w [N, K] int8 (symmetric: the stored integers,
// the model's own weight tensor); scales [N] float32, one per row (the
// fusion writes the weights' per-channel or per-tensor scales there: a side
// table of 4 bytes per row); bias [N] float32 (optional).  Attr:
// activation ("none", "relu", "relu6", "relu_n1_to_1": the fused activation
// of TFLite's FULLY_CONNECTED).  Output: x's shape with the last dim N.
//
// Exact to the dequantized weights: each output is computed in float
// against w's integers (sign-extended, converted, multiplied-added), and the
// row's scale is applied once to the sum, so the only error is float32's
// own rounding of the dot product.  There is no activation quantization, so
// the result differs from TFLite's hybrid FULLY_CONNECTED (which quantizes x
// to int8 per row) by exactly that op's own quantization error.
//
// Memory bound for few rows: the weights are read once per tile of up to
// four activation rows, four weight rows at a time, so a decode step (one
// row) reads each weight byte once.  Every output depends only on its row
// of w and of x, so the bits are the same for any thread count.
#include <cstdint>

// Shared by every target (the file is compiled once per SIMD target).
#ifndef FUSEKIT_KERNELS_FULLY_CONNECTED_ARGS_
#define FUSEKIT_KERNELS_FULLY_CONNECTED_ARGS_
namespace fusekit {
// Weight rows read together; activation rows read together (at most).
inline constexpr int kRows = 4;
inline constexpr int kMaxTile = 4;

struct FcArgs {
  const float* x;
  const int8_t* w;
  const float* scales;  // one per output row
  const float* bias;    // nullptr: none
  float* y;
  int64_t m, k, n;
  float lo, hi;  // the activation as a clamp (-inf, inf: none)
};

}  // namespace fusekit
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fully_connected.cc"
#include "fusekit/simd_begin.h"

// Outputs [n0, n0 + rows) (rows <= kRows) for activation rows [m0, m0 + M).
template <int M>
HWY_INLINE void Tile(const FcArgs& a, int64_t m0, int64_t n0, int rows) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t k = a.k;
  const int8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = a.w + (n0 + (r < rows ? r : rows - 1)) * k;
  const float* x[M];
  for (int i = 0; i < M; ++i) x[i] = a.x + (m0 + i) * k;
  hn::Vec<decltype(d)> acc[M][kRows];
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < kRows; ++r) acc[i][r] = hn::Zero(d);
  }
  int64_t j = 0;
  for (; j + lanes <= k; j += lanes) {
    hn::Vec<decltype(d)> wv[kRows];
    for (int r = 0; r < kRows; ++r) {
      wv[r] = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, w[r] + j)));
    }
    for (int i = 0; i < M; ++i) {
      const auto xv = hn::LoadU(d, x[i] + j);
      for (int r = 0; r < kRows; ++r) acc[i][r] = hn::MulAdd(wv[r], xv, acc[i][r]);
    }
  }
  if (j < k) {
    const size_t rest = static_cast<size_t>(k - j);
    hn::Vec<decltype(d)> wv[kRows];
    for (int r = 0; r < kRows; ++r) {
      wv[r] = hn::ConvertTo(d, hn::PromoteTo(di, LoadTail(d8, w[r] + j, rest)));
    }
    for (int i = 0; i < M; ++i) {
      const auto xv = LoadTail(d, x[i] + j, rest);
      for (int r = 0; r < kRows; ++r) acc[i][r] = hn::MulAdd(wv[r], xv, acc[i][r]);
    }
  }
  for (int i = 0; i < M; ++i) {
    float* y = a.y + (m0 + i) * a.n + n0;
    for (int r = 0; r < rows; ++r) {
      float v = hn::GetLane(hn::SumOfLanes(d, acc[i][r])) * a.scales[n0 + r];
      if (a.bias != nullptr) v += a.bias[n0 + r];
      v = v < a.lo ? a.lo : v;
      y[r] = v > a.hi ? a.hi : v;
    }
  }
}

// Output rows [begin, end) for every activation row.
void FullyConnectedRows(const FcArgs& a, int64_t begin, int64_t end) {
  for (int64_t n0 = begin; n0 < end; n0 += kRows) {
    const int rows = static_cast<int>(end - n0 < kRows ? end - n0 : kRows);
    int64_t m0 = 0;
    for (; m0 + kMaxTile <= a.m; m0 += kMaxTile) Tile<kMaxTile>(a, m0, n0, rows);
    switch (a.m - m0) {
      case 3:
        Tile<3>(a, m0, n0, rows);
        break;
      case 2:
        Tile<2>(a, m0, n0, rows);
        break;
      case 1:
        Tile<1>(a, m0, n0, rows);
        break;
      default:
        break;
    }
  }
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <limits>
#include <string>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

using RowsFn = void (*)(const FcArgs&, int64_t, int64_t);

class FullyConnectedInt8 {
 public:
  FullyConnectedInt8(const Attrs& attrs, std::string* error)
      : compute_(FUSEKIT_SIMD_CHOOSE(FullyConnectedRows)) {
    const std::string act = attrs.String("activation");
    const float inf = std::numeric_limits<float>::infinity();
    if (act == "none") {
      lo_ = -inf, hi_ = inf;
    } else if (act == "relu") {
      lo_ = 0.0f, hi_ = inf;
    } else if (act == "relu6") {
      lo_ = 0.0f, hi_ = 6.0f;
    } else if (act == "relu_n1_to_1") {
      lo_ = -1.0f, hi_ = 1.0f;
    } else {
      *error = "attr 'activation' must be none, relu, relu6 or relu_n1_to_1, got '" + act + "'";
    }
  }

  // The SDK checked that scales is a vector of w's rows.  The scales come
  // as an operand, not from w's quantization, because LiteRT's
  // CompiledModel gives a custom op its tensors without quantization.
  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<int8_t> w, In<float> /*scales*/,
                       Opt<float> bias, Out<float> y) {
    const int64_t n = w.dim(0);
    FUSEKIT_ENSURE_EQ(ctx, x.dim(-1), w.dim(1), "x's last dim and the weights' columns");
    FUSEKIT_ENSURE(ctx, w.dim(1) > 0, "the weights must have at least one column");
    if (bias.present()) {
      FUSEKIT_ENSURE(ctx, bias.rank() == 1 && bias.dim(0) == n,
                     "bias must be a vector of %d elements (the weights' rows)",
                     static_cast<int>(n));
    }
    std::vector<int> shape = x.shape();
    shape.back() = static_cast<int>(n);
    return ctx.ResizeOutput(y, shape);
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<int8_t> w, In<float> scales,
                      Opt<float> bias, Out<float> y) {
    const int64_t k = w.dim(1);
    const int64_t n = w.dim(0);
    if (n == 0 || x.num_elements() == 0) return kTfLiteOk;
    FcArgs a{x.data(), w.data(), scales.data(), bias.data(), y.data(),
             x.num_elements() / k, k, n, lo_, hi_};
    // Chunks of whole 4-row groups with at least ~32 KB of weights each.
    const int64_t groups = (n + kRows - 1) / kRows;
    const int64_t grain = 1 + (1 << 15) / (kRows * k);
    ctx.ParallelFor(groups, grain, [&](int64_t begin, int64_t end) {
      const int64_t hi = end * kRows < n ? end * kRows : n;
      compute_(a, begin * kRows, hi);
    });
    return kTfLiteOk;
  }

 private:
  RowsFn compute_;
  float lo_ = 0.0f, hi_ = 0.0f;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_fully_connected", FullyConnectedInt8,
                        Inputs(OperandSpec("x").MinRank(1), OperandSpec("weights").Rank(2, 2),
                               OperandSpec("scales").VectorOf("weights", 0), "bias"),
                        Outputs("y"), AttrSchema(attr::String("activation", "none")));

}  // namespace fusekit

#endif  // HWY_ONCE
