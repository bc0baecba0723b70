// fusekit_fully_connected: TFLite's hybrid FULLY_CONNECTED (float
// activations, int8 weights) for the few activation rows of a decode step,
// reading the weights as the model stores them.
//
// Inputs: x [..., K] float32; w [N, K] int8 (symmetric: the model's own
// weight tensor); scales [N] float32, one per row (the fusion writes the
// weights' per-channel or per-tensor scales there: a side table of 4 bytes
// per row, since LiteRT's CompiledModel gives custom ops no quantization);
// bias [N] float32 (optional).  Attr: activation ("none", "relu", "relu6",
// "relu_n1_to_1").  Output: x's shape with the last dim N.
//
// The arithmetic is the hybrid op's: each row of x is quantized to int8
// symmetrically (s = max|x| / 127, q = round(x / s)), the dot products with
// w's integers are exact int32 sums, and y = dot * s * scale[n] + bias[n].
// So the result differs from the float product with the dequantized weights
// by the activation quantization the model's own op has (XNNPACK's form of
// it quantizes asymmetrically: the two differ by at most both errors).
//
// Why not float against the dequantized weights: that is exact, but costs
// three vector instructions per 16 weights (sign-extend, convert, FMA) and
// measured 2.1-2.4x the read floor here, at 0.55x XNNPACK's dynamic-int8
// GEMM (benchmarks/results/fully_connected.md); the integer dot takes one
// (AVX-512 VNNI's vpdpbusd) per 64 weights.
//
// Memory bound for few rows: each group of weight rows (kStreamRows on the
// VNNI path, as independent streams with a software prefetch two groups
// ahead; four on the portable path) is read from memory once and serves
// every activation row from L1.  Constant weights are read from a copy in
// 2 MiB pages (HugePageCopy, made at the first invoke): through 4 KiB pages
// the same kernel measured ~1.1x slower over a whole decode step.  Every
// output depends only on its rows of w and x, so the bits are the same for
// any thread count; the dots are exact integers at every SIMD level (only
// the float epilogue may round differently where the compiler fuses a
// multiply-add).
#include <cmath>
#include <cstdint>

#include "kernels/fully_connected_rules.h"

// Shared by every target (the file is compiled once per SIMD target).
#ifndef FUSEKIT_KERNELS_FULLY_CONNECTED_ARGS_
#define FUSEKIT_KERNELS_FULLY_CONNECTED_ARGS_
namespace fusekit {
// Weight rows the portable path reads together (the VNNI path reads
// kStreamRows).
inline constexpr int kRows = 4;
// Quantized activation rows are padded to this many bytes (zeros).
inline constexpr int64_t kPad = 64;

struct FcArgs {
  const int8_t* xq;       // m rows of kp int8 activations (zero padded)
  const float* xscale;    // m activation scales
  const int8_t* w;        // n rows of k int8 weights
  const int32_t* rowsum;  // n sums of w's rows (VNNI's unsigned offset)
  const float* scales;    // n weight scales
  const float* bias;      // nullptr: none
  float* y;
  int64_t m, k, kp, n;
  float lo, hi;  // the activation as a clamp (-inf, inf: none)
};

// Scales, bias and the activation's clamp of one output.
inline float FinishOutput(const FcArgs& a, int32_t dot, int64_t i, int64_t row) {
  float v = static_cast<float>(dot) * a.xscale[i] * a.scales[row];
  if (a.bias != nullptr) v += a.bias[row];
  v = v < a.lo ? a.lo : v;
  return v > a.hi ? a.hi : v;
}
}  // namespace fusekit
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fully_connected.cc"
#include "fusekit/simd_begin.h"

#if HWY_ARCH_ARM
// On ARM the opt-in hybrid op runs plain loops (the compiler vectorizes
// them): Highway's widening of a partial int8 vector gave wrong sums on
// SVE and crashed at 2048-bit vectors under emulation.  The op is bound by
// reading the weights, not by these multiplies.
HWY_INLINE void Dot4(const FcArgs& a, int64_t i, const int8_t* const* w, int32_t* out) {
  const int8_t* HWY_RESTRICT x = a.xq + i * a.kp;
  int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t j = 0; j < a.k; ++j) {
    const int32_t u = x[j];
    s0 += u * w[0][j];
    s1 += u * w[1][j];
    s2 += u * w[2][j];
    s3 += u * w[3][j];
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}
#else
// Exact int32 dot products of four weight rows with one activation row,
// widened lane by lane (the portable path: any SIMD level, NEON, SVE).
HWY_INLINE void Dot4(const FcArgs& a, int64_t i, const int8_t* const* w, int32_t* out) {
  const hn::ScalableTag<int32_t> d;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int8_t* HWY_RESTRICT x = a.xq + i * a.kp;
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  // Past k the activations are zero (padding), but w's rows end at k.
  int64_t j = 0;
  for (; j + lanes <= a.k; j += lanes) {
    const auto u = hn::PromoteTo(d, hn::LoadU(d8, x + j));
    s0 = hn::Add(s0, hn::Mul(u, hn::PromoteTo(d, hn::LoadU(d8, w[0] + j))));
    s1 = hn::Add(s1, hn::Mul(u, hn::PromoteTo(d, hn::LoadU(d8, w[1] + j))));
    s2 = hn::Add(s2, hn::Mul(u, hn::PromoteTo(d, hn::LoadU(d8, w[2] + j))));
    s3 = hn::Add(s3, hn::Mul(u, hn::PromoteTo(d, hn::LoadU(d8, w[3] + j))));
  }
  if (j < a.k) {
    const size_t rest = static_cast<size_t>(a.k - j);
    const auto u = hn::PromoteTo(d, LoadTail(d8, x + j, rest));
    s0 = hn::Add(s0, hn::Mul(u, hn::PromoteTo(d, LoadTail(d8, w[0] + j, rest))));
    s1 = hn::Add(s1, hn::Mul(u, hn::PromoteTo(d, LoadTail(d8, w[1] + j, rest))));
    s2 = hn::Add(s2, hn::Mul(u, hn::PromoteTo(d, LoadTail(d8, w[2] + j, rest))));
    s3 = hn::Add(s3, hn::Mul(u, hn::PromoteTo(d, LoadTail(d8, w[3] + j, rest))));
  }
  out[0] = hn::GetLane(hn::SumOfLanes(d, s0));
  out[1] = hn::GetLane(hn::SumOfLanes(d, s1));
  out[2] = hn::GetLane(hn::SumOfLanes(d, s2));
  out[3] = hn::GetLane(hn::SumOfLanes(d, s3));
}

#endif  // HWY_ARCH_ARM

// Output rows [begin, end) for every activation row.
void FullyConnectedRows(const FcArgs& a, int64_t begin, int64_t end) {
  for (int64_t n0 = begin; n0 < end; n0 += kRows) {
    const int rows = static_cast<int>(end - n0 < kRows ? end - n0 : kRows);
    const int8_t* w[kRows];
    for (int r = 0; r < kRows; ++r) w[r] = a.w + (n0 + (r < rows ? r : rows - 1)) * a.k;
    for (int64_t i = 0; i < a.m; ++i) {
      int32_t dot[kRows];
      Dot4(a, i, w, dot);
      float* y = a.y + i * a.n + n0;
      for (int r = 0; r < rows; ++r) y[r] = FinishOutput(a, dot[r], i, n0 + r);
    }
  }
}

// The hybrid op's symmetric quantization of one row: s = max|x| / 127 and
// q = round(x * (127 / max|x|)) to nearest, ties to even (the vector
// convert's rounding); zeros past k up to kp.  A row of zeros gives s = 0;
// a row with NaN or inf gives s = NaN (the hybrid op has no meaningful
// result there either), which the outputs then carry.
#if HWY_ARCH_ARM
void QuantizeRow(const float* HWY_RESTRICT x, int64_t k, int64_t kp, int8_t* HWY_RESTRICT q,
                 float* s) {
  float amax = 0.0f, flag = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    amax = std::fmax(amax, std::fabs(x[j]));
    flag += x[j] * 0.0f;
  }
  for (int64_t i = 0; i < kp; ++i) q[i] = 0;
  if (flag != 0.0f) {
    *s = flag;  // NaN
    return;
  }
  if (!(amax > 0.0f)) {
    *s = 0.0f;
    return;
  }
  *s = amax / 127.0f;
  const float inv = 127.0f / amax;
  // Ties to even, as the vector convert rounds (the default rounding mode).
  for (int64_t j = 0; j < k; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] * inv));
}
#else
void QuantizeRow(const float* HWY_RESTRICT x, int64_t k, int64_t kp, int8_t* HWY_RESTRICT q,
                 float* s) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // x * 0 is 0 for finite x and NaN otherwise: its sum flags the row.
  auto vmax = hn::Zero(d), flag = hn::Zero(d);
  const auto zero = hn::Zero(d);
  int64_t j = 0;
  for (; j + lanes <= k; j += lanes) {
    const auto v = hn::LoadU(d, x + j);
    vmax = hn::Max(vmax, hn::Abs(v));
    flag = hn::Add(flag, hn::Mul(v, zero));
  }
  if (j < k) {
    const auto v = LoadTail(d, x + j, static_cast<size_t>(k - j));
    vmax = hn::Max(vmax, hn::Abs(v));
    flag = hn::Add(flag, hn::Mul(v, zero));
  }
  const float amax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float finite = hn::GetLane(hn::SumOfLanes(d, flag));
  for (int64_t i = 0; i < kp; ++i) q[i] = 0;
  if (finite != 0.0f) {
    *s = finite;  // NaN
    return;
  }
  if (!(amax > 0.0f)) {
    *s = 0.0f;
    return;
  }
  *s = amax / 127.0f;
  const auto inv = hn::Set(d, 127.0f / amax);
  for (j = 0; j + lanes <= k; j += lanes) {
    const auto v = hn::NearestInt(hn::Mul(hn::LoadU(d, x + j), inv));
    hn::StoreU(hn::DemoteTo(d8, v), d8, q + j);
  }
  if (j < k) {
    const size_t rest = static_cast<size_t>(k - j);
    const auto v = hn::NearestInt(hn::Mul(LoadTail(d, x + j, rest), inv));
    StoreTail(hn::DemoteTo(d8, v), d8, q + j, rest);
  }
}
#endif  // HWY_ARCH_ARM

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <limits>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"
#include "kernels/huge_page_copy.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fusekit {
namespace {

using RowsFn = void (*)(const FcArgs&, int64_t, int64_t);
using QuantizeFn = void (*)(const float*, int64_t, int64_t, int8_t*, float*);

#if defined(__x86_64__)
// AVX-512 VNNI: vpdpbusd multiplies 64 unsigned by 64 signed bytes and adds
// groups of four into 16 int32 lanes.  The activations are stored signed;
// flipping their top bit (x + 128 as unsigned) makes them unsigned, and
// 128 * sum(w row) taken off the sum makes the dot exact again.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void VnniRows(const FcArgs& a,
                                                                     int64_t begin,
                                                                     int64_t end) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t full = a.k / 64 * 64;
  const __mmask64 tail = a.k > full ? (~0ULL >> (64 - (a.k - full))) : 0;
  // The same column two groups on: a group of int8 rows is a quarter of a
  // float32 group's bytes, and two groups ahead measured ~4% faster over a
  // whole decode step than one (benchmarks/results/fully_connected.md).
  const int64_t ahead = 2 * kStreamRows * a.k;
  const int8_t* const w_end = a.w + a.n * a.k;
  for (int64_t n0 = begin; n0 < end; n0 += kStreamRows) {
    const int rows = static_cast<int>(end - n0 < kStreamRows ? end - n0 : kStreamRows);
    // A short last group repeats its last row (read from L1, never stored).
    const int8_t* w[kStreamRows];
    for (int r = 0; r < kStreamRows; ++r) w[r] = a.w + (n0 + (r < rows ? r : rows - 1)) * a.k;
    const bool prefetch = w[0] + ahead < w_end;
    for (int64_t i = 0; i < a.m; ++i) {
      const int8_t* x = a.xq + i * a.kp;
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
              s7 = s0;
      int64_t j = 0;
      for (; j < full; j += 64) {
        if (i == 0 && prefetch) {
          for (int r = 0; r < kStreamRows; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(w[r] + j + ahead), _MM_HINT_T0);
          }
        }
        const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(x + j), flip);
        s0 = _mm512_dpbusd_epi32(s0, u, _mm512_loadu_si512(w[0] + j));
        s1 = _mm512_dpbusd_epi32(s1, u, _mm512_loadu_si512(w[1] + j));
        s2 = _mm512_dpbusd_epi32(s2, u, _mm512_loadu_si512(w[2] + j));
        s3 = _mm512_dpbusd_epi32(s3, u, _mm512_loadu_si512(w[3] + j));
        s4 = _mm512_dpbusd_epi32(s4, u, _mm512_loadu_si512(w[4] + j));
        s5 = _mm512_dpbusd_epi32(s5, u, _mm512_loadu_si512(w[5] + j));
        s6 = _mm512_dpbusd_epi32(s6, u, _mm512_loadu_si512(w[6] + j));
        s7 = _mm512_dpbusd_epi32(s7, u, _mm512_loadu_si512(w[7] + j));
      }
      if (tail) {
        // Masked-off weight bytes load as zero: they add nothing.
        const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(x + j), flip);
        s0 = _mm512_dpbusd_epi32(s0, u, _mm512_maskz_loadu_epi8(tail, w[0] + j));
        s1 = _mm512_dpbusd_epi32(s1, u, _mm512_maskz_loadu_epi8(tail, w[1] + j));
        s2 = _mm512_dpbusd_epi32(s2, u, _mm512_maskz_loadu_epi8(tail, w[2] + j));
        s3 = _mm512_dpbusd_epi32(s3, u, _mm512_maskz_loadu_epi8(tail, w[3] + j));
        s4 = _mm512_dpbusd_epi32(s4, u, _mm512_maskz_loadu_epi8(tail, w[4] + j));
        s5 = _mm512_dpbusd_epi32(s5, u, _mm512_maskz_loadu_epi8(tail, w[5] + j));
        s6 = _mm512_dpbusd_epi32(s6, u, _mm512_maskz_loadu_epi8(tail, w[6] + j));
        s7 = _mm512_dpbusd_epi32(s7, u, _mm512_maskz_loadu_epi8(tail, w[7] + j));
      }
      const int32_t dot[kStreamRows] = {
          _mm512_reduce_add_epi32(s0), _mm512_reduce_add_epi32(s1), _mm512_reduce_add_epi32(s2),
          _mm512_reduce_add_epi32(s3), _mm512_reduce_add_epi32(s4), _mm512_reduce_add_epi32(s5),
          _mm512_reduce_add_epi32(s6), _mm512_reduce_add_epi32(s7)};
      float* y = a.y + i * a.n + n0;
      for (int r = 0; r < rows; ++r) {
        y[r] = FinishOutput(a, dot[r] - 128 * a.rowsum[n0 + r], i, n0 + r);
      }
    }
  }
}

bool HasVnni() {
  __builtin_cpu_init();
  return CurrentSimdLevel() >= SimdLevel::kAvx512 && __builtin_cpu_supports("avx512vnni");
}
#endif

RowsFn ChooseRows() {
#if defined(__x86_64__)
  if (HasVnni()) return &VnniRows;
#endif
  return FUSEKIT_SIMD_CHOOSE(FullyConnectedRows);
}

class FullyConnectedInt8 {
 public:
  FullyConnectedInt8(const Attrs& attrs, std::string* error) : compute_(ChooseRows()), quantize_(FUSEKIT_SIMD_CHOOSE(QuantizeRow)) {
    ActivationClamp(attrs.String("activation"), &lo_, &hi_, error);
  }

  // The SDK checked that scales is a vector of w's rows.
  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<int8_t> w, In<float> /*scales*/,
                       Opt<float> bias, Out<float> y) {
    return PrepareFullyConnected(ctx, x, w, bias, y);
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<int8_t> w, In<float> scales,
                      Opt<float> bias, Out<float> y) {
    const int64_t k = w.dim(1);
    const int64_t n = w.dim(0);
    if (n == 0 || x.num_elements() == 0) return kTfLiteOk;
    const int64_t m = x.num_elements() / k;
    const int64_t kp = (k + kPad - 1) / kPad * kPad;
    RowSums(w.data(), n, k, w.is_constant());
    const int8_t* weights = w.data();
    if (w.is_constant()) weights = copy_.Of(weights, static_cast<size_t>(n * k));
    ScratchLayout layout;
    const auto xq_at = layout.Add<int8_t>(m * kp);
    const auto xs_at = layout.Add<float>(m);
    void* base = ctx.Scratch(layout);
    FUSEKIT_ENSURE(ctx, base != nullptr, "out of memory for %lld quantized activations",
                   static_cast<long long>(m * kp));
    int8_t* xq = xq_at(base);
    float* xs = xs_at(base);
    for (int64_t i = 0; i < m; ++i) quantize_(x.data() + i * k, k, kp, xq + i * kp, xs + i);
    FcArgs a{xq, xs, weights, rowsum_.data(), scales.data(), bias.data(), y.data(),
             m, k, kp, n, lo_, hi_};
    // Chunks of whole row groups with at least ~32 KB of weights each.
    const int64_t groups = (n + kStreamRows - 1) / kStreamRows;
    const int64_t grain = 1 + (1 << 15) / (kStreamRows * k);
    ctx.ParallelFor(groups, grain, [&](int64_t begin, int64_t end) {
      const int64_t hi = end * kStreamRows < n ? end * kStreamRows : n;
      compute_(a, begin * kStreamRows, hi);
    });
    return kTfLiteOk;
  }

 private:
  // The side table: w's row sums, computed once for constant weights (the
  // fusion's case); weights the runtime does not mark constant (LiteRT's
  // CompiledModel marks none) could change between invokes at the same
  // address, so they are summed every time.
  void RowSums(const int8_t* w, int64_t n, int64_t k, bool constant) {
    if (constant && rowsum_w_ == w && static_cast<int64_t>(rowsum_.size()) == n) return;
    rowsum_.assign(static_cast<size_t>(n), 0);
    for (int64_t r = 0; r < n; ++r) {
      int32_t sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += w[r * k + j];
      rowsum_[static_cast<size_t>(r)] = sum;
    }
    rowsum_w_ = w;
  }

  HugePageCopy copy_;
  RowsFn compute_;
  QuantizeFn quantize_;
  float lo_ = 0.0f, hi_ = 0.0f;
  std::vector<int32_t> rowsum_;
  const int8_t* rowsum_w_ = nullptr;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_fully_connected", FullyConnectedInt8,
                        Inputs(OperandSpec("x").MinRank(1), OperandSpec("weights").Rank(2, 2),
                               OperandSpec("scales").VectorOf("weights", 0), "bias"),
                        Outputs("y"), AttrSchema(attr::String("activation", "none")));

}  // namespace fusekit

#endif  // HWY_ONCE
