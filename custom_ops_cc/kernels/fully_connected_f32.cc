// fusekit_fully_connected_f32: TFLite's float FULLY_CONNECTED for the few
// activation rows of a decode step (a matrix-vector product), streaming the
// float32 weights closer to the memory's read rate than a GEMM tiled for
// many rows does.
//
// Inputs: x [..., K] float32; w [N, K] float32; bias [N] float32
// (optional).  Attr: activation ("none", "relu", "relu6", "relu_n1_to_1").
// Output: x's shape with the last dim N.  y = clamp(x . w[n] + bias[n]).
//
// Constant weights are read from a copy in 2 MiB pages (HugePageCopy, made
// at the first invoke), the way XNNPACK reads a repacked copy: streamed
// through 4 KiB pages the same bytes measured ~1.15x slower over a whole
// decode step (TLB misses, and the hardware prefetchers stop at every 4 KiB
// boundary).  Weights the runtime does not mark constant are read in place.
//
// Memory bound for few rows: each group of kStreamRows weight rows is read
// from memory once, as that many independent streams (more loads in flight
// than one stream gets from the hardware prefetcher), with a software
// prefetch a group ahead, and serves every activation row while it is in
// L1.  The dots are float32 sums in lane order (not the reference's
// sequential order: within a few ulps of K terms of it); every output
// depends only on its rows, so the bits are the same for any thread count.
#include <cstdint>

#include "hwy/cache_control.h"
#include "kernels/fully_connected_rules.h"

#ifndef FUSEKIT_KERNELS_FULLY_CONNECTED_F32_ARGS_
#define FUSEKIT_KERNELS_FULLY_CONNECTED_F32_ARGS_
namespace fusekit {

struct FcF32Args {
  const float* x;     // m rows of k
  const float* w;     // n rows of k
  const float* bias;  // nullptr: none
  float* y;           // m rows of n
  int64_t m, k, n;
  float lo, hi;  // the activation as a clamp (-inf, inf: none)
};
}  // namespace fusekit
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fully_connected_f32.cc"
#include "fusekit/simd_begin.h"

// Output rows [begin, end) for every activation row.
void FullyConnectedF32Rows(const FcF32Args& a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t k = a.k;
  // The same column of the next group: kStreamRows rows further on.
  const int64_t ahead = kStreamRows * k;
  const float* const w_end = a.w + a.n * k;
  for (int64_t n0 = begin; n0 < end; n0 += kStreamRows) {
    const int rows = static_cast<int>(end - n0 < kStreamRows ? end - n0 : kStreamRows);
    // A short last group repeats its last row (read from L1, never stored).
    const float* w[kStreamRows];
    for (int r = 0; r < kStreamRows; ++r) w[r] = a.w + (n0 + (r < rows ? r : rows - 1)) * k;
    const bool prefetch = w[0] + ahead < w_end;
    for (int64_t i = 0; i < a.m; ++i) {
      const float* HWY_RESTRICT x = a.x + i * k;
      auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
      int64_t j = 0;
      for (; j + lanes <= k; j += lanes) {
        if (i == 0 && prefetch) {
          for (int r = 0; r < kStreamRows; ++r) hwy::Prefetch(w[r] + j + ahead);
        }
        const auto u = hn::LoadU(d, x + j);
        s0 = hn::MulAdd(u, hn::LoadU(d, w[0] + j), s0);
        s1 = hn::MulAdd(u, hn::LoadU(d, w[1] + j), s1);
        s2 = hn::MulAdd(u, hn::LoadU(d, w[2] + j), s2);
        s3 = hn::MulAdd(u, hn::LoadU(d, w[3] + j), s3);
        s4 = hn::MulAdd(u, hn::LoadU(d, w[4] + j), s4);
        s5 = hn::MulAdd(u, hn::LoadU(d, w[5] + j), s5);
        s6 = hn::MulAdd(u, hn::LoadU(d, w[6] + j), s6);
        s7 = hn::MulAdd(u, hn::LoadU(d, w[7] + j), s7);
      }
      if (j < k) {
        // Lanes past k load as zero (x's too): they add nothing.
        const size_t rest = static_cast<size_t>(k - j);
        const auto u = LoadTail(d, x + j, rest);
        s0 = hn::MulAdd(u, LoadTail(d, w[0] + j, rest), s0);
        s1 = hn::MulAdd(u, LoadTail(d, w[1] + j, rest), s1);
        s2 = hn::MulAdd(u, LoadTail(d, w[2] + j, rest), s2);
        s3 = hn::MulAdd(u, LoadTail(d, w[3] + j, rest), s3);
        s4 = hn::MulAdd(u, LoadTail(d, w[4] + j, rest), s4);
        s5 = hn::MulAdd(u, LoadTail(d, w[5] + j, rest), s5);
        s6 = hn::MulAdd(u, LoadTail(d, w[6] + j, rest), s6);
        s7 = hn::MulAdd(u, LoadTail(d, w[7] + j, rest), s7);
      }
      const float dot[kStreamRows] = {
          hn::GetLane(hn::SumOfLanes(d, s0)), hn::GetLane(hn::SumOfLanes(d, s1)), hn::GetLane(hn::SumOfLanes(d, s2)),
          hn::GetLane(hn::SumOfLanes(d, s3)), hn::GetLane(hn::SumOfLanes(d, s4)), hn::GetLane(hn::SumOfLanes(d, s5)),
          hn::GetLane(hn::SumOfLanes(d, s6)), hn::GetLane(hn::SumOfLanes(d, s7))};
      float* y = a.y + i * a.n + n0;
      for (int r = 0; r < rows; ++r) {
        float v = dot[r];
        if (a.bias != nullptr) v += a.bias[n0 + r];
        v = v < a.lo ? a.lo : v;
        y[r] = v > a.hi ? a.hi : v;
      }
    }
  }
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <limits>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"
#include "kernels/huge_page_copy.h"

namespace fusekit {
namespace {

using RowsF32Fn = void (*)(const FcF32Args&, int64_t, int64_t);

class FullyConnectedF32 {
 public:
  FullyConnectedF32(const Attrs& attrs, std::string* error)
      : compute_(FUSEKIT_SIMD_CHOOSE(FullyConnectedF32Rows)) {
    ActivationClamp(attrs.String("activation"), &lo_, &hi_, error);
  }

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<float> w, Opt<float> bias,
                       Out<float> y) {
    return PrepareFullyConnected(ctx, x, w, bias, y);
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<float> w, Opt<float> bias,
                      Out<float> y) {
    const int64_t k = w.dim(1);
    const int64_t n = w.dim(0);
    if (n == 0 || x.num_elements() == 0) return kTfLiteOk;
    const float* weights = w.data();
    if (w.is_constant()) weights = copy_.Of(weights, static_cast<size_t>(n * k));
    const FcF32Args a{x.data(), weights, bias.data(), y.data(),
                      x.num_elements() / k, k, n, lo_, hi_};
    // Chunks of whole row groups with at least ~64 KB of weights each.
    const int64_t groups = (n + kStreamRows - 1) / kStreamRows;
    const int64_t grain = 1 + (1 << 14) / (kStreamRows * k);
    ctx.ParallelFor(groups, grain, [&](int64_t begin, int64_t end) {
      const int64_t hi = end * kStreamRows < n ? end * kStreamRows : n;
      compute_(a, begin * kStreamRows, hi);
    });
    return kTfLiteOk;
  }

 private:
  HugePageCopy copy_;
  RowsF32Fn compute_;
  float lo_ = 0.0f, hi_ = 0.0f;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_fully_connected_f32", FullyConnectedF32,
                        Inputs(OperandSpec("x").MinRank(1), OperandSpec("weights").Rank(2, 2),
                               "bias"),
                        Outputs("y"), AttrSchema(attr::String("activation", "none")));

}  // namespace fusekit

#endif  // HWY_ONCE
