// fusekit_attention: out = softmax(q @ k^T * scale + mask) @ v per head.
// Inputs: q [B, Sq, H, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv], all
// float32 or all float16, optional mask (float32 additive or bool keep)
// broadcastable to [B, H, Sq, Skv].  Attrs: causal (bool, bottom-right
// aligned), scale (float, absent: 1/sqrt(D)).  Output [B, Sq, H, Dv] of q's
// dtype.  Query head h reads kv head h / (H / Hkv).
//
// float16 is storage only: loads promote to float32, every sum, max and
// exp is float32, and the output rows are rounded to float16 once.  The
// decode path reads float16 K and V in place (half the bytes of a
// memory-bound step); prefill items, compute bound, convert each block of
// K and V into float32 scratch and run the float32 microkernels on it.
//
// Streaming ("online") softmax: keys go by in blocks; each block's scores
// for the item's queries are computed, turned into weights against the
// running max, and folded into running unnormalized outputs.  No
// [B, H, Sq, Skv] buffer exists (per thread: one block of scores).  A query
// whose every key is dropped (bool mask, causality, -inf mask entries)
// gives zeros, as the composite defines.
//
// Prefill (AttentionQueries): an item is one head and 2 SIMD vectors of
// queries, held transposed so that the vector lanes are queries.  Q.K^T
// broadcasts K elements (read in place) against Q^T, P.V broadcasts V
// elements (in place) against P^T, both register-tiled microkernels with an
// MR x 2-vector tile of accumulators (MR = 8 with 32 vector registers, 6
// with 16), and the softmax runs down the key axis with vector max/add only.
// Causal blocks above the diagonal are never computed.
//
// Decode (AttentionItem, Sq <= 4): an item is every query head of one kv
// head, so K and V stream from memory once (dot products per key row, with
// software prefetch); long caches are split into kSplitKeys pieces whose
// partial results are merged afterwards in a fixed order.
//
// Items depend only on the shapes, never on the thread count: every thread
// count gives the same bits.
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "fusekit/simd_tail.h"

namespace att = ::fusekit::attention;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Rows of a register tile: 2 x kMaxTile accumulators, 2 vectors of the
// panel and a broadcast fit in 32 vector registers (AVX-512, NEON, SVE) or
// 16 (AVX2 and the x86 baseline).
#if HWY_TARGET == HWY_AVX3 || HWY_ARCH_ARM_A64
constexpr int kMaxTile = 8;
#else
constexpr int kMaxTile = 6;
#endif

constexpr int64_t kPvKeys = 64;
// Keys per step of a streamed decode item's P.V.
constexpr int64_t kDecodePvKeys = 32;
// Keys per block of a prefill item (its S^T block: kKeysT x 2 vectors).
constexpr int64_t kKeysT = 128;

int64_t AttentionPanel() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }
// A prefill block's S^T (kKeysT keys x one panel) fits the decode scores'
// buffer even at SVE's longest vectors (2048 bits: a panel of 128).
static_assert(kKeysT * 2 * hn::MaxLanes(DF()) <= att::kRows * att::kKeys,
              "S^T outgrows its buffer");

// ------------------------------------------------------ storage types
//
// q, k, v and out are float or F16 (raw IEEE half bits, as
// fusekit::Half); every computation is float32.  A vector of DF's lanes
// is loaded from either as float32 and stored back to either.

using F16 = hwy::float16_t;
using DH = hn::Rebind<F16, DF>;  // as many halves as DF has floats

// float16 lanes to float32.  AVX2 and AVX-512 use the F16C instruction
// through Highway.  On the baseline target (no F16C) Highway 1.0's
// emulation turns infinities and NaNs into finite numbers, so the
// conversion is done here, exactly (subnormals, inf and NaN included).
HWY_INLINE VF PromoteHalf(DF d, hn::Vec<DH> h) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                                                  hn::BitCast(du16, h)));
  const auto shifted_exp = hn::Set(di, 0x7c00 << 13);
  auto o = hn::ShiftLeft<13>(hn::And(bits, hn::Set(di, 0x7fff)));
  const auto exp = hn::And(o, shifted_exp);
  o = hn::Add(o, hn::Set(di, (127 - 15) << 23));  // rebias the exponent
  // inf / NaN: the exponent goes to 255.
  o = hn::IfThenElse(hn::Eq(exp, shifted_exp), hn::Add(o, hn::Set(di, (128 - 16) << 23)), o);
  // Zero / subnormal: renormalized by a float subtraction of 2^-14.
  const auto sub = hn::BitCast(
      di, hn::Sub(hn::BitCast(d, hn::Add(o, hn::Set(di, 1 << 23))),
                  hn::BitCast(d, hn::Set(di, 113 << 23))));
  o = hn::IfThenElse(hn::Eq(exp, hn::Zero(di)), sub, o);
  o = hn::Or(o, hn::ShiftLeft<16>(hn::And(bits, hn::Set(di, 0x8000))));
  return hn::BitCast(d, o);
#else
  return hn::PromoteTo(d, h);
#endif
}

// float32 lanes to float16, rounded to nearest even (TensorFlow's cast).
// Highway 1.0's baseline emulation truncates instead, hence the own code
// there; overflow gives inf, NaN stays NaN.
HWY_INLINE hn::Vec<DH> DemoteHalf(DF d, VF v) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  (void)d;
  const hn::RebindToSigned<DF> di;
  const auto raw = hn::BitCast(di, v);
  const auto sign = hn::And(raw, hn::Set(di, static_cast<int32_t>(0x80000000u)));
  const auto f = hn::Xor(raw, sign);  // |v|, as bits
  // Too large for a half (or inf / NaN).
  const auto special = hn::IfThenElse(hn::Gt(f, hn::Set(di, 0x7f800000)),
                                      hn::Set(di, 0x7e00), hn::Set(di, 0x7c00));
  // Subnormal halves: adding 0.5f rounds the mantissa at the right place.
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(d, f), hn::Set(d, 0.5f))),
                           hn::Set(di, 126 << 23));
  // Normal: rebias, round to nearest even, drop 13 mantissa bits.
  const auto odd = hn::And(hn::ShiftRight<13>(f), hn::Set(di, 1));
  const auto normal = hn::ShiftRight<13>(
      hn::Add(hn::Add(f, hn::Set(di, -((127 - 15) << 23) + 0xfff)), odd));
  auto o = hn::IfThenElse(hn::Lt(f, hn::Set(di, 113 << 23)), sub, normal);
  o = hn::IfThenElse(hn::Lt(f, hn::Set(di, (127 + 16) << 23)), o, special);
  const hn::RebindToUnsigned<DF> du;
  o = hn::Or(o, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, sign))));
  return hn::BitCast(DH(), hn::DemoteTo(hn::Rebind<uint16_t, DF>(), o));
#else
  return hn::DemoteTo(DH(), v);
#endif
}

// A vector (LoadF / StoreF) or the first `count` lanes (LoadTailF /
// StoreTailF, which touch no element past them) of storage type T.
HWY_INLINE VF LoadF(DF d, const float* HWY_RESTRICT p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadF(DF d, const F16* HWY_RESTRICT p) {
  return PromoteHalf(d, hn::LoadU(DH(), p));
}
HWY_INLINE VF LoadTailF(DF d, const float* HWY_RESTRICT p, size_t count) {
  return LoadTail(d, p, count);
}
HWY_INLINE VF LoadTailF(DF d, const F16* HWY_RESTRICT p, size_t count) {
  // Through a buffer: AVX2 has no masked 16-bit load (Highway's MaskedLoad
  // there reads the whole vector).
  HWY_ALIGN F16 buffer[hn::MaxLanes(DH())] = {};
  std::memcpy(buffer, p, count * sizeof(F16));
  return PromoteHalf(d, hn::Load(DH(), buffer));
}
HWY_INLINE void StoreF(VF v, DF d, float* HWY_RESTRICT p) { hn::StoreU(v, d, p); }
HWY_INLINE void StoreF(VF v, DF d, F16* HWY_RESTRICT p) {
  hn::StoreU(DemoteHalf(d, v), DH(), p);
}
HWY_INLINE void StoreTailF(VF v, DF d, float* HWY_RESTRICT p, size_t count) {
  StoreTail(v, d, p, count);
}
HWY_INLINE void StoreTailF(VF v, DF d, F16* HWY_RESTRICT p, size_t count) {
  HWY_ALIGN F16 buffer[hn::MaxLanes(DH())];
  hn::Store(DemoteHalf(d, v), DH(), buffer);
  std::memcpy(p, buffer, count * sizeof(F16));
}

// dst[0, n) = src[0, n) * factor, from storage type S to storage type D.
template <typename S, typename D>
HWY_INLINE void ConvertRow(const S* HWY_RESTRICT src, int64_t n, float factor,
                           D* HWY_RESTRICT dst) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF f = hn::Set(d, factor);
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) StoreF(hn::Mul(LoadF(d, src + c), f), d, dst + c);
  if (c < n) {
    const size_t rest = static_cast<size_t>(n - c);
    StoreTailF(hn::Mul(LoadTailF(d, src + c, rest), f), d, dst + c, rest);
  }
}

// n rows of `cols` elements, src rows src_stride apart, to float32 rows
// dst_stride apart.
template <typename T>
HWY_INLINE void ConvertRows(const T* HWY_RESTRICT src, int64_t src_stride, int64_t n,
                            int64_t cols, float* HWY_RESTRICT dst, int64_t dst_stride) {
  for (int64_t j = 0; j < n; ++j) {
    ConvertRow(src + j * src_stride, cols, 1.0f, dst + j * dst_stride);
  }
}

// ------------------------------------------------ register tiles
//
// acc[r] (2 vectors) = init(r), then for j < n: acc[r] += a(r, j) * panel(j),
// for the MR <= 8 rows of a tile, then store(r, acc[r]).  The accumulators
// are named variables, not an array: SVE's vectors are sizeless types,
// which cannot be array elements or struct members.  Each statement is
// written once for 8 rows and discarded past MR (if constexpr), so the
// compiler sees the same straight-line code as from an unrolled loop over
// an array.
#define FUSEKIT_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <int MR, class Init, class Scalar, class Panel, class Store>
HWY_INLINE void TileMulAdd(int64_t n, const Init& init, const Scalar& a, const Panel& panel,
                           const Store& store) {
  static_assert(MR >= 1 && MR <= 8, "a tile has 1 to 8 rows");
  const DF d;
#define FUSEKIT_TILE_INIT(r)                                     \
  [[maybe_unused]] VF acc##r##_0 = hn::Zero(d), acc##r##_1 = acc##r##_0; \
  if constexpr ((r) < MR) {                                      \
    acc##r##_0 = init(r, 0);                                     \
    acc##r##_1 = init(r, 1);                                     \
  }
  FUSEKIT_TILE_ROWS(FUSEKIT_TILE_INIT)
#undef FUSEKIT_TILE_INIT
  for (int64_t j = 0; j < n; ++j) {
    const VF b0 = panel(j, 0);
    const VF b1 = panel(j, 1);
#define FUSEKIT_TILE_STEP(r)                           \
  if constexpr ((r) < MR) {                            \
    const VF x = hn::Set(d, a(r, j));                  \
    acc##r##_0 = hn::MulAdd(x, b0, acc##r##_0);        \
    acc##r##_1 = hn::MulAdd(x, b1, acc##r##_1);        \
  }
    FUSEKIT_TILE_ROWS(FUSEKIT_TILE_STEP)
#undef FUSEKIT_TILE_STEP
  }
#define FUSEKIT_TILE_STORE(r) \
  if constexpr ((r) < MR) store(r, acc##r##_0, acc##r##_1);
  FUSEKIT_TILE_ROWS(FUSEKIT_TILE_STORE)
#undef FUSEKIT_TILE_STORE
}
#undef FUSEKIT_TILE_ROWS

// S[r][0, panel) = Q[r] . Kpanel for MR rows; Q rows are `depth` apart.
template <int MR>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, int64_t depth,
                       const float* HWY_RESTRICT kp, float* HWY_RESTRICT s,
                       int64_t s_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      depth, [&](int, int) { return hn::Zero(d); },
      [&](int r, int64_t k) { return q[r * depth + k]; },
      [&](int64_t k, int half) { return hn::Load(d, kp + (2 * k + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::StoreU(a0, d, s + r * s_stride);
        hn::StoreU(a1, d, s + r * s_stride + lanes);
      });
}

// O[r][0, 2 vectors) += sum_j P[r][j] * V[j][0, 2 vectors) for MR rows
// (V of storage type TV, promoted as it is loaded).
template <int MR, typename TV>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, int64_t p_stride, int64_t n,
                       const TV* HWY_RESTRICT v, int64_t v_stride,
                       float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      n, [&](int r, int half) { return hn::LoadU(d, o + r * o_stride + half * lanes); },
      [&](int r, int64_t j) { return p[r * p_stride + j]; },
      [&](int64_t j, int half) { return LoadF(d, v + j * v_stride + half * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::StoreU(a0, d, o + r * o_stride);
        hn::StoreU(a1, d, o + r * o_stride + lanes);
      });
}

template <int MR>
HWY_INLINE void QkRows(const float* q, int64_t depth, const float* kp, float* s,
                       int64_t s_stride, int64_t rows) {
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    QkTile<MR>(q + r * depth, depth, kp, s + r * s_stride, s_stride);
  }
  if constexpr (MR > 1) {
    if (r < rows) QkRows<MR - 1>(q + r * depth, depth, kp, s + r * s_stride, s_stride, rows - r);
  }
}

template <int MR, typename TV>
HWY_INLINE void PvRows(const float* p, int64_t p_stride, int64_t n, const TV* v,
                       int64_t v_stride, float* o, int64_t o_stride, int64_t rows) {
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    PvTile<MR>(p + r * p_stride, p_stride, n, v, v_stride, o + r * o_stride, o_stride);
  }
  if constexpr (MR > 1) {
    if (r < rows) {
      PvRows<MR - 1>(p + r * p_stride, p_stride, n, v, v_stride, o + r * o_stride, o_stride,
                     rows - r);
    }
  }
}

// Keys [j0, j0 + n) of one (b, kv head) into panels [D][panel] (zeros past n).
template <typename T>
void AttentionPackK(const att::Problem<T>& p, int64_t b, int64_t kv_head, int64_t j0,
                    int64_t n, float* HWY_RESTRICT kp) {
  const int64_t panel = AttentionPanel();
  const int64_t depth = p.depth;
  const int64_t row_stride = p.kv_heads * depth;
  const T* base = p.k + ((b * p.kv_len + j0) * p.kv_heads + kv_head) * depth;
  const int64_t padded = att::RoundUp(n, panel);
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t pj = 0; pj < padded; pj += panel) {
    float* HWY_RESTRICT dst = kp + pj * depth;
    const int64_t count = n - pj < panel ? n - pj : panel;
    if (count < panel) std::memset(dst, 0, sizeof(float) * depth * panel);
    const T* HWY_RESTRICT src = base + pj * row_stride;
    if constexpr (std::is_same_v<T, float>) {
      // Writes in order (the panel's rows are few cache lines, read from L1).
      for (int64_t k = 0; k < depth; ++k) {
        for (int64_t c = 0; c < count; ++c) dst[k * panel + c] = src[c * row_stride + k];
      }
    } else {
      // A vector of each row converted at a time, then scattered.
      HWY_ALIGN float row[hn::MaxLanes(DF())];
      for (int64_t c = 0; c < count; ++c) {
        const T* HWY_RESTRICT from = src + c * row_stride;
        for (int64_t k0 = 0; k0 < depth; k0 += lanes) {
          const int64_t m = depth - k0 < lanes ? depth - k0 : lanes;
          hn::Store(m == lanes ? LoadF(d, from + k0)
                               : LoadTailF(d, from + k0, static_cast<size_t>(m)),
                    d, row);
          for (int64_t k = 0; k < m; ++k) dst[(k0 + k) * panel + c] = row[k];
        }
      }
    }
  }
}

// Rows j0.. (n of them) of V for one (b, kv head), padded to value_pad.
template <typename T>
void AttentionPackV(const att::Problem<T>& p, int64_t value_pad, int64_t b, int64_t kv_head,
                    int64_t j0, int64_t n, float* HWY_RESTRICT vp) {
  const int64_t dv = p.value_depth;
  for (int64_t j = 0; j < n; ++j) {
    const T* src = p.v + ((b * p.kv_len + j0 + j) * p.kv_heads + kv_head) * dv;
    float* dst = vp + j * value_pad;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(dst, src, sizeof(float) * dv);
    } else {
      ConvertRow(src, dv, 1.0f, dst);
    }
    std::memset(dst + dv, 0, sizeof(float) * (value_pad - dv));
  }
}

// Largest of s[0, n).
HWY_INLINE float RowMax(const float* HWY_RESTRICT s, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF m = neg_inf;
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) m = hn::Max(m, hn::LoadU(d, s + c));
  if (c < n) {
    const size_t rest = static_cast<size_t>(n - c);
    m = hn::Max(m, hn::IfThenElse(hn::FirstN(d, rest), LoadTail(d, s + c, rest), neg_inf));
  }
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// exp(x) for the softmax's x = s - max <= 0, as 2^y with y = x / ln 2 =
// k + f (k integer, |f| <= 1/2): 2^f from a degree-5 polynomial fitted at
// Chebyshev nodes (relative error 1.1e-7), times 2^k.  Below 2^-126 (and
// at -inf) it clamps to about 1e-38 instead of 0: no weight that small
// moves a float32 output.  About 10 vector ops where a general exp needs 20.
HWY_INLINE VF SoftmaxExp(DF d, VF x) {
  const VF y = hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -126.0f));
  const VF k = hn::Round(y);
  const VF f = hn::Sub(y, k);
  VF p = hn::Set(d, 0.0013400432164886263f);
  p = hn::MulAdd(p, f, hn::Set(d, 0.009676037097852109f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.05550327214210872f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24022107355830596f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931472067106195f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.000000075495349f));
#if HWY_TARGET == HWY_AVX3
  return VF{_mm512_scalef_ps(p.raw, k.raw)};
#else
  // k + 127, the biased exponent of 2^k, lands in the low mantissa bits
  // of k + 1.5 * 2^23 + 127.
  const hn::RebindToSigned<DF> di;
  const VF biased = hn::Add(k, hn::Set(d, 12582912.0f + 127.0f));
  return hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, biased))));
#endif
}

// s[0, n) = exp(s - max); returns their sum.
HWY_INLINE float ExpRow(float* HWY_RESTRICT s, int64_t n, float max) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF vm = hn::Set(d, max);
  VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * lanes <= n; c += 2 * lanes) {
    const VF e0 = SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + c), vm));
    const VF e1 = SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + c + lanes), vm));
    hn::StoreU(e0, d, s + c);
    hn::StoreU(e1, d, s + c + lanes);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  for (; c < n; c += lanes) {
    const size_t rest = static_cast<size_t>(n - c < lanes ? n - c : lanes);
    const VF e = hn::IfThenElseZero(hn::FirstN(d, rest),
                                    SoftmaxExp(d, hn::Sub(LoadTail(d, s + c, rest), vm)));
    StoreTail(e, d, s + c, rest);
    sum0 = hn::Add(sum0, e);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT o, int64_t n, float factor) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF f = hn::Set(d, factor);
  for (int64_t c = 0; c < n; c += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, o + c), f), d, o + c);
}

// Adds the float mask (or drops the keys a bool mask drops) of one score row.
template <typename T>
HWY_INLINE void MaskRow(const att::Problem<T>& p, int64_t b, int64_t h, int64_t i, int64_t j0,
                        int64_t n, float* HWY_RESTRICT s) {
  const int64_t* st = p.mask_stride;
  const int64_t offset = b * st[0] + h * st[1] + i * st[2] + j0 * st[3];
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (p.mask_add != nullptr) {
    const float* m = p.mask_add + offset;
    if (st[3] == 0) {
      for (int64_t c = 0; c < n; ++c) s[c] += m[0];
      return;
    }
    const DF d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    int64_t c = 0;
    for (; c + lanes <= n; c += lanes) {
      hn::StoreU(hn::Add(hn::LoadU(d, s + c), hn::LoadU(d, m + c)), d, s + c);
    }
    for (; c < n; ++c) s[c] += m[c];
  } else if (p.mask_keep != nullptr) {
    const uint8_t* m = p.mask_keep + offset;
    if (st[3] == 0) {
      if (!m[0]) {
        for (int64_t c = 0; c < n; ++c) s[c] = kNegInf;
      }
      return;
    }
    for (int64_t c = 0; c < n; ++c) {
      if (!m[c]) s[c] = kNegInf;
    }
  }
}

// A decode item reads the rows of its kv heads, Hkv * D elements apart;
// when the item has fewer heads than the tensor, each row starts a new
// stretch (a new page once Hkv * D * sizeof(T) >= 4096), where the hardware
// prefetchers stop, so the item asks for the rows it reads a few rows ahead
// itself.  (A prefetch past the end of a tensor is harmless: it never
// faults.)
constexpr int64_t kPrefetchRows = 8;
template <typename T>
HWY_INLINE void PrefetchRow(const T* row, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line
  for (int64_t c = 0; c < count; c += kLine) __builtin_prefetch(row + c, 0, 3);
}

// Few query rows per kv head against keys read in place (a decode step):
// key row j of every kv head of the item (consecutive heads, one
// contiguous stretch of memory) is loaded once and dotted with that head's
// query rows, so K streams from memory once, in address order, with no
// transposed copy.  Row r belongs to the item's head r / per_head.
// s[r][j] for r < rows, j < n.
template <typename T>
void DotScores(const float* HWY_RESTRICT q, int64_t rows, int64_t per_head, int64_t depth,
               const T* HWY_RESTRICT k, int64_t k_stride, int64_t n,
               float* HWY_RESTRICT s, int64_t s_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t heads = rows / per_head;
  for (int64_t j = 0; j < n; ++j) {
    const T* HWY_RESTRICT k_row = k + j * k_stride;
    PrefetchRow(k_row + kPrefetchRows * k_stride, heads * depth);
    for (int64_t g = 0; g < heads; ++g) {
      const T* HWY_RESTRICT kr = k_row + g * depth;
      int64_t r = g * per_head;
      const int64_t r_end = r + per_head;
      for (; r + 4 <= r_end; r += 4) {
        const float* q0 = q + r * depth;
        VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        int64_t c = 0;
        for (; c + lanes <= depth; c += lanes) {
          const VF kv = LoadF(d, kr + c);
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), kv, a0);
          a1 = hn::MulAdd(hn::LoadU(d, q0 + depth + c), kv, a1);
          a2 = hn::MulAdd(hn::LoadU(d, q0 + 2 * depth + c), kv, a2);
          a3 = hn::MulAdd(hn::LoadU(d, q0 + 3 * depth + c), kv, a3);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          const VF kv = LoadTailF(d, kr + c, rest);
          a0 = hn::MulAdd(LoadTail(d, q0 + c, rest), kv, a0);
          a1 = hn::MulAdd(LoadTail(d, q0 + depth + c, rest), kv, a1);
          a2 = hn::MulAdd(LoadTail(d, q0 + 2 * depth + c, rest), kv, a2);
          a3 = hn::MulAdd(LoadTail(d, q0 + 3 * depth + c, rest), kv, a3);
        }
        s[r * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a0));
        s[(r + 1) * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a1));
        s[(r + 2) * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a2));
        s[(r + 3) * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a3));
      }
      for (; r < r_end; ++r) {
        const float* q0 = q + r * depth;
        VF a0 = hn::Zero(d);
        int64_t c = 0;
        for (; c + lanes <= depth; c += lanes) {
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), LoadF(d, kr + c), a0);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          a0 = hn::MulAdd(LoadTail(d, q0 + c, rest), LoadTailF(d, kr + c, rest), a0);
        }
        s[r * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a0));
      }
    }
  }
}

// o[r][0, dv) += sum_j p[r][j] * v[j][0, dv) with V rows read in place,
// each once, in address order: the decode step's P.V (row r reads the V of
// the item's head r / per_head; o rows are value_pad floats apart).
template <typename T>
void StreamPv(const float* HWY_RESTRICT p, int64_t p_stride, int64_t rows, int64_t per_head,
              int64_t n, const T* HWY_RESTRICT v, int64_t v_stride, int64_t dv,
              float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < n; ++j) {
    const T* HWY_RESTRICT v_row = v + j * v_stride;
    PrefetchRow(v_row + kPrefetchRows * v_stride, rows / per_head * dv);
    for (int64_t r = 0; r < rows; ++r) {
      const T* HWY_RESTRICT vr = v_row + (r / per_head) * dv;
      const float w = p[r * p_stride + j];
      if (w == 0.0f) continue;  // dropped keys
      const VF vw = hn::Set(d, w);
      float* HWY_RESTRICT orow = o + r * o_stride;
      int64_t c = 0;
      for (; c + lanes <= dv; c += lanes) {
        hn::StoreU(hn::MulAdd(vw, LoadF(d, vr + c), hn::LoadU(d, orow + c)), d, orow + c);
      }
      if (c < dv) {
        // o has value_pad >= dv columns: the padding lanes take v's zeros.
        const size_t rest = static_cast<size_t>(dv - c);
        hn::StoreU(hn::MulAdd(vw, LoadTailF(d, vr + c, rest), hn::LoadU(d, orow + c)), d,
                   orow + c);
      }
    }
  }
}

// O += P . V for the rows of a packed decode item, two vectors of output
// columns at a time, in steps of kPvKeys keys, so that the weights and V
// rows one step touches (kRows x kPvKeys and kPvKeys x value_pad elements)
// stay in L1 while every row tile and column chunk passes over them.
template <typename TV>
HWY_INLINE void PvSteps(const float* HWY_RESTRICT s, int64_t n, const TV* HWY_RESTRICT v,
                        int64_t v_stride, float* HWY_RESTRICT o, int64_t vpad, int64_t rows,
                        int64_t panel) {
  for (int64_t js = 0; js < n; js += kPvKeys) {
    const int64_t m = n - js < kPvKeys ? n - js : kPvKeys;
    for (int64_t c = 0; c < vpad; c += panel) {
      PvRows<kMaxTile>(s + js, att::kKeys, m, v + js * v_stride + c, v_stride, o + c, vpad,
                       rows);
    }
  }
}

// Buffers of one thread, carved from its share of the scratch.
// (Prefill: q holds Q^T [D][panel], s S^T [kKeysT][panel], o O^T
// [Dv][panel]; att::QueryFloats and OutFloats make room for the widest
// panel.)
struct Buffers {
  float* q;      // [kRows][D], scaled queries
  float* s;      // [kRows][kKeys], scores then weights
  float* o;      // [kRows][value_pad], unnormalized output rows
  float* max;    // [kRows]
  float* sum;    // [kRows]
  float* kblock; // [D][kKeys] K panels of one block (decode)
  float* vblock; // [kKeys][value_pad] V rows of one block (decode, ragged Dv)
};

template <typename T>
HWY_INLINE Buffers Carve(const att::Problem<T>& p, const att::Layout& l, float* base) {
  // Sizes as att::ThreadFloats counts them.
  Buffers buf;
  buf.q = base;
  base += att::QueryFloats(p, l);
  buf.s = base;
  base += att::kRows * att::kKeys;
  buf.o = base;
  base += att::OutFloats(l);
  buf.max = base;
  base += att::kRows;
  buf.sum = base;
  base += att::kRows;
  buf.kblock = base;
  base += att::KBlockFloats(p, l);
  buf.vblock = base;
  return buf;
}

// One decode item: the rows of `it` (every query head of one kv head times
// a few queries) against keys [key_begin, key_end).  At most kStreamRows
// rows read K and V in place; more pack each block of K into panels for
// the register-tiled kernels.  The result goes to p.out, or to `partial`
// when non-null.  K and V are read in place in their storage type T.
template <typename T>
void AttentionItemT(const att::Problem<T>& p, const att::Layout& l, const att::Item& it,
                    float* scratch, const att::Partial* partial) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const Buffers buf = Carve(p, l, scratch);
  const int64_t depth = p.depth, dv = p.value_depth, vpad = l.value_pad;
  const int64_t per_head = it.group_count * it.query_count;
  const int64_t rows = it.kv_head_count * per_head;
  const int64_t offset = p.kv_len - p.q_len;  // causal: key j <= i + offset
  auto head_of = [&](int64_t r) {
    return (it.kv_head + r / per_head) * p.group + it.group_begin +
           (r % per_head) / it.query_count;
  };
  auto query_of = [&](int64_t r) { return it.query_begin + (r % per_head) % it.query_count; };

  for (int64_t r = 0; r < rows; ++r) {
    const T* src = p.q + ((it.b * p.q_len + query_of(r)) * p.heads + head_of(r)) * depth;
    ConvertRow(src, depth, p.scale, buf.q + r * depth);
    buf.max[r] = kNegInf;
    buf.sum[r] = 0.0f;
  }
  std::memset(buf.o, 0, sizeof(float) * rows * vpad);

  int64_t key_end = it.key_end;
  const int64_t last_query = it.query_begin + it.query_count - 1;
  if (p.causal && last_query + offset + 1 < key_end) key_end = last_query + offset + 1;
  const int64_t panel = l.panel;
  const int64_t v_row = p.kv_heads * dv;
  const T* v_head = p.v + (it.b * p.kv_len * p.kv_heads + it.kv_head) * dv;
  const int64_t k_row = p.kv_heads * depth;
  const T* k_head = p.k + (it.b * p.kv_len * p.kv_heads + it.kv_head) * depth;
  // Few rows per kv head: read K and V in place, once (see DotScores).
  // Otherwise the item has one kv head and packs its K blocks.
  const bool stream = per_head <= att::kStreamRows;

  for (int64_t j0 = it.key_begin; j0 < key_end; j0 += att::kKeys) {
    const int64_t n = key_end - j0 < att::kKeys ? key_end - j0 : att::kKeys;
    if (stream) {
      DotScores(buf.q, rows, per_head, depth, k_head + j0 * k_row, k_row, n, buf.s, att::kKeys);
    } else {
      AttentionPackK(p, it.b, it.kv_head, j0, n, buf.kblock);
      const float* kp = buf.kblock;
      // Scores of every row against the block, panel by panel (a panel
      // stays in L1 while every row tile passes over it).
      for (int64_t pj = 0; pj < n; pj += panel) {
        QkRows<kMaxTile>(buf.q, depth, kp + pj * depth, buf.s + pj, att::kKeys, rows);
      }
    }
    // Masks, causality, then the online softmax update of each row.
    for (int64_t r = 0; r < rows; ++r) {
      float* s = buf.s + r * att::kKeys;
      const int64_t i = query_of(r);
      MaskRow(p, it.b, head_of(r), i, j0, n, s);
      if (p.causal) {
        const int64_t first_dropped = i + offset + 1 - j0;
        for (int64_t c = first_dropped < 0 ? 0 : first_dropped; c < n; ++c) s[c] = kNegInf;
      }
      const float block_max = RowMax(s, n);
      const float old_max = buf.max[r];
      const float new_max = block_max > old_max ? block_max : old_max;
      if (new_max == kNegInf) {
        // No admissible key so far: weights zero, nothing to rescale.
        std::memset(s, 0, sizeof(float) * n);
        continue;
      }
      const float block_sum = ExpRow(s, n, new_max);
      if (new_max != old_max) {
        const float alpha = std::exp(old_max - new_max);  // 0 when old_max is -inf
        buf.sum[r] *= alpha;
        ScaleRow(buf.o + r * vpad, vpad, alpha);
        buf.max[r] = new_max;
      }
      buf.sum[r] += block_sum;
    }
    if (stream && l.value_direct) {
      // Register tiles of each kv head's rows against its V columns in
      // place, in steps of kDecodePvKeys keys: the step's V rows of every
      // head (kDecodePvKeys x Hkv * Dv floats) stay in L2 while the heads
      // and column chunks pass over them.
      for (int64_t js = 0; js < n; js += kDecodePvKeys) {
        const int64_t m = n - js < kDecodePvKeys ? n - js : kDecodePvKeys;
        // The next step's rows, while this one computes.
        const T* next = v_head + (j0 + js + kDecodePvKeys) * v_row;
        for (int64_t j = 0; j < kDecodePvKeys; ++j) {
          PrefetchRow(next + j * v_row, it.kv_head_count * dv);
        }
        for (int64_t g = 0; g < it.kv_head_count; ++g) {
          const T* vg = v_head + (j0 + js) * v_row + g * dv;
          for (int64_t c = 0; c < dv; c += panel) {
            PvRows<kMaxTile>(buf.s + g * per_head * att::kKeys + js, att::kKeys, m, vg + c,
                             v_row, buf.o + g * per_head * vpad + c, vpad, per_head);
          }
        }
      }
      continue;
    }
    if (stream) {
      StreamPv(buf.s, att::kKeys, rows, per_head, n, v_head + j0 * v_row, v_row, dv, buf.o,
               vpad);
      continue;
    }
    // O += P . V: V in place, or its padded float copy.
    if (l.value_direct) {
      PvSteps(buf.s, n, v_head + j0 * v_row, v_row, buf.o, vpad, rows, panel);
    } else {
      AttentionPackV(p, vpad, it.b, it.kv_head, j0, n, buf.vblock);
      PvSteps(buf.s, n, static_cast<const float*>(buf.vblock), vpad, buf.o, vpad, rows, panel);
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float* o = buf.o + r * vpad;
    if (partial != nullptr) {
      partial->max[r] = buf.max[r];
      partial->sum[r] = buf.sum[r];
      std::memcpy(partial->rows + r * vpad, o, sizeof(float) * vpad);
      continue;
    }
    T* dst = p.out + ((it.b * p.q_len + query_of(r)) * p.heads + head_of(r)) * dv;
    const float inv = buf.sum[r] > 0.0f ? 1.0f / buf.sum[r] : 0.0f;
    ConvertRow(o, dv, inv, dst);
  }
}

void AttentionItemF32(const att::Problem<float>& p, const att::Layout& l, const att::Item& it,
                      float* scratch, const att::Partial* partial) {
  AttentionItemT(p, l, it, scratch, partial);
}
void AttentionItemF16(const att::Problem<F16>& p, const att::Layout& l, const att::Item& it,
                      float* scratch, const att::Partial* partial) {
  AttentionItemT(p, l, it, scratch, partial);
}


// ----------------------------------------------------------------- prefill
//
// Prefill items run transposed: the lanes of a vector are queries.  A
// block of 2 vectors of queries (one head) meets the keys block by block:
// S^T[j][queries] = K[j] . Q^T (K rows broadcast in place, Q^T packed once
// per item), the online softmax runs down the key axis with plain vector
// max/add (no horizontal reduction, no per-row scalar work), and
// O^T[c][queries] += V[j][c] * P^T[j] broadcasts V in place.  Neither K nor
// V is copied, and the only transpose is of the item's output.

// S^T[r][0, 2 vectors) = K[r] . Q^T for MR key rows (K rows k_stride apart).
template <int MR>
HWY_INLINE void KqTile(const float* HWY_RESTRICT k, int64_t k_stride, int64_t depth,
                       const float* HWY_RESTRICT qt, float* HWY_RESTRICT st) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      depth, [&](int, int) { return hn::Zero(d); },
      [&](int r, int64_t c) { return k[r * k_stride + c]; },
      [&](int64_t c, int half) { return hn::Load(d, qt + (2 * c + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::Store(a0, d, st + r * 2 * lanes);
        hn::Store(a1, d, st + r * 2 * lanes + lanes);
      });
}

template <int MR>
HWY_INLINE void KqRows(const float* k, int64_t k_stride, int64_t depth, const float* qt,
                       float* st, int64_t rows) {
  const int64_t width = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    KqTile<MR>(k + r * k_stride, k_stride, depth, qt, st + r * width);
  }
  if constexpr (MR > 1) {
    if (r < rows) KqRows<MR - 1>(k + r * k_stride, k_stride, depth, qt, st + r * width, rows - r);
  }
}

// O^T[r][0, 2 vectors) += sum_j V[j][r] * P^T[j] for MR value columns r.
template <int MR>
HWY_INLINE void VpTile(const float* HWY_RESTRICT v, int64_t v_stride, int64_t n,
                       const float* HWY_RESTRICT pt, float* HWY_RESTRICT ot) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      n, [&](int r, int half) { return hn::Load(d, ot + (2 * r + half) * lanes); },
      [&](int r, int64_t j) { return v[j * v_stride + r]; },
      [&](int64_t j, int half) { return hn::Load(d, pt + (2 * j + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::Store(a0, d, ot + r * 2 * lanes);
        hn::Store(a1, d, ot + r * 2 * lanes + lanes);
      });
}

template <int MR>
HWY_INLINE void VpRows(const float* v, int64_t v_stride, int64_t n, const float* pt,
                       float* ot, int64_t cols) {
  const int64_t width = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  int64_t r = 0;
  for (; r + MR <= cols; r += MR) VpTile<MR>(v + r, v_stride, n, pt, ot + r * width);
  if constexpr (MR > 1) {
    if (r < cols) VpRows<MR - 1>(v + r, v_stride, n, pt, ot + r * width, cols - r);
  }
}

// The same exp with exact zeros at -inf (and below 2^-126): a lane whose
// running max is still -inf subtracts 0, and its -inf scores must weigh 0.
HWY_INLINE VF SoftmaxExpZero(DF d, VF x) {
  return hn::IfThenElseZero(hn::Gt(x, hn::Set(d, -87.0f)), SoftmaxExp(d, x));
}

// One prefill item: head h of batch b, queries [i0, i0 + nq) with nq at
// most 2 vectors.  Scratch: see Buffers (q holds Q^T, s holds S^T, o O^T;
// with float16 storage kblock and vblock hold a block of K and V as float).
template <typename T>
void AttentionQueriesT(const att::Problem<T>& p, int64_t b, int64_t h, int64_t i0, int64_t nq,
                       float* scratch, const att::Layout& l) {
  constexpr bool kInPlace = std::is_same_v<T, float>;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = 2 * lanes;
  const Buffers buf = Carve(p, l, scratch);
  const int64_t depth = p.depth, dv = p.value_depth;
  // float32 K and V rows are read in place.  (A contiguous copy per head,
  // which keeps rows Hkv * D floats apart off a few L1 sets, measured
  // slower: the copy costs more than the conflicts.)  float16 blocks are
  // converted once per block, a vector at a time: about 1/16 of the FMAs
  // that then read them.
  const int64_t kv_head = h / p.group;
  const int64_t k_row = p.kv_heads * depth, v_row = p.kv_heads * dv;
  const T* k_head = p.k + (b * p.kv_len * p.kv_heads + kv_head) * depth;
  const T* v_head = p.v + (b * p.kv_len * p.kv_heads + kv_head) * dv;
  const int64_t offset = p.kv_len - p.q_len;  // causal: key j <= i + offset

  // Q^T, scaled; lanes past nq are zero (their columns are never written).
  // A full panel is gathered a vector of queries at a time.
  float* qt = buf.q;
  const T* q_rows = p.q + ((b * p.q_len + i0) * p.heads + h) * depth;
  const int64_t q_stride = p.heads * depth;
  const hn::RebindToSigned<DF> di;
  if constexpr (!kInPlace) {
    // No 16-bit gather: each query row a vector at a time, then scattered.
    std::memset(qt, 0, sizeof(float) * depth * width);
    HWY_ALIGN float row[hn::MaxLanes(DF())];
    const VF scale = hn::Set(d, p.scale);
    for (int64_t i = 0; i < nq; ++i) {
      const T* src = q_rows + i * q_stride;
      for (int64_t c0 = 0; c0 < depth; c0 += lanes) {
        const int64_t m = depth - c0 < lanes ? depth - c0 : lanes;
        const VF x =
            m == lanes ? LoadF(d, src + c0) : LoadTailF(d, src + c0, static_cast<size_t>(m));
        hn::Store(hn::Mul(x, scale), d, row);
        for (int64_t c = 0; c < m; ++c) qt[(c0 + c) * width + i] = row[c];
      }
    }
  } else if (nq == width && width * q_stride <= INT32_MAX) {
    const auto index = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(q_stride)));
    const VF scale = hn::Set(d, p.scale);
    for (int64_t half = 0; half < 2; ++half) {
      const float* src = q_rows + half * lanes * q_stride;
      for (int64_t c = 0; c < depth; ++c) {
        hn::Store(hn::Mul(hn::GatherIndex(d, src + c, index), scale), d,
                  qt + c * width + half * lanes);
      }
    }
  } else {
    std::memset(qt, 0, sizeof(float) * depth * width);
    for (int64_t i = 0; i < nq; ++i) {
      const float* src = q_rows + i * q_stride;
      for (int64_t c = 0; c < depth; ++c) qt[c * width + i] = src[c] * p.scale;
    }
  }
  float* ot = buf.o;
  std::memset(ot, 0, sizeof(float) * dv * width);
  VF max0 = hn::Set(d, kNegInf), max1 = max0;
  VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);

  int64_t key_end = p.kv_len;
  if (p.causal && i0 + nq - 1 + offset + 1 < key_end) key_end = i0 + nq - 1 + offset + 1;
  float* st = buf.s;
  const int64_t* ms = p.mask_stride;
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeysT) {
    const int64_t n = key_end - j0 < kKeysT ? key_end - j0 : kKeysT;
    if constexpr (kInPlace) {
      KqRows<kMaxTile>(k_head + j0 * k_row, k_row, depth, qt, st, n);
    } else {
      ConvertRows(k_head + j0 * k_row, k_row, n, depth, buf.kblock, depth);
      KqRows<kMaxTile>(buf.kblock, depth, depth, qt, st, n);
    }
    if (p.mask_add != nullptr || p.mask_keep != nullptr) {
      const int64_t base = b * ms[0] + h * ms[1] + i0 * ms[2];
      for (int64_t j = 0; j < n; ++j) {
        float* row = st + j * width;
        const int64_t at = base + (j0 + j) * ms[3];
        for (int64_t i = 0; i < nq; ++i) {
          if (p.mask_add != nullptr) {
            row[i] += p.mask_add[at + i * ms[2]];
          } else if (!p.mask_keep[at + i * ms[2]]) {
            row[i] = kNegInf;
          }
        }
      }
    }
    if (p.causal && j0 + n - 1 > i0 + offset) {
      // Key j is dropped for the queries i < j - offset.
      for (int64_t j = 0; j < n; ++j) {
        const int64_t first_kept = j0 + j - offset - i0;
        float* row = st + j * width;
        for (int64_t i = 0; i < first_kept && i < width; ++i) row[i] = kNegInf;
      }
    }
    VF bmax0 = max0, bmax1 = max1;
    for (int64_t j = 0; j < n; ++j) {
      bmax0 = hn::Max(bmax0, hn::Load(d, st + j * width));
      bmax1 = hn::Max(bmax1, hn::Load(d, st + j * width + lanes));
    }
    // Lanes without an admissible key so far subtract 0 (their weights are
    // exact zeros either way).
    const VF neg_inf = hn::Set(d, kNegInf);
    const VF sub0 = hn::IfThenZeroElse(hn::Eq(bmax0, neg_inf), bmax0);
    const VF sub1 = hn::IfThenZeroElse(hn::Eq(bmax1, neg_inf), bmax1);
    const VF alpha0 = SoftmaxExpZero(d, hn::Sub(max0, sub0));
    const VF alpha1 = SoftmaxExpZero(d, hn::Sub(max1, sub1));
    max0 = bmax0;
    max1 = bmax1;
    VF add0 = hn::Zero(d), add1 = hn::Zero(d);
    for (int64_t j = 0; j < n; ++j) {
      const VF e0 = SoftmaxExpZero(d, hn::Sub(hn::Load(d, st + j * width), sub0));
      const VF e1 = SoftmaxExpZero(d, hn::Sub(hn::Load(d, st + j * width + lanes), sub1));
      hn::Store(e0, d, st + j * width);
      hn::Store(e1, d, st + j * width + lanes);
      add0 = hn::Add(add0, e0);
      add1 = hn::Add(add1, e1);
    }
    sum0 = hn::MulAdd(sum0, alpha0, add0);
    sum1 = hn::MulAdd(sum1, alpha1, add1);
    for (int64_t c = 0; c < dv; ++c) {
      hn::Store(hn::Mul(hn::Load(d, ot + c * width), alpha0), d, ot + c * width);
      hn::Store(hn::Mul(hn::Load(d, ot + c * width + lanes), alpha1), d, ot + c * width + lanes);
    }
    if constexpr (kInPlace) {
      VpRows<kMaxTile>(v_head + j0 * v_row, v_row, n, st, ot, dv);
    } else {
      ConvertRows(v_head + j0 * v_row, v_row, n, dv, buf.vblock, dv);
      VpRows<kMaxTile>(buf.vblock, dv, n, st, ot, dv);
    }
  }

  // out[b, i0 + i, h, c] = O^T[c][i] / sum[i]; no admissible key: zeros.
  HWY_ALIGN float inv[2 * hn::MaxLanes(DF())];
  const VF zero = hn::Zero(d);
  hn::Store(hn::IfThenElseZero(hn::Gt(sum0, zero), hn::Div(hn::Set(d, 1.0f), sum0)), d, inv);
  hn::Store(hn::IfThenElseZero(hn::Gt(sum1, zero), hn::Div(hn::Set(d, 1.0f), sum1)), d,
            inv + lanes);
  // Column i of O^T gathered a vector of value columns at a time.
  const auto column = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(width)));
  for (int64_t i = 0; i < nq; ++i) {
    T* dst = p.out + ((b * p.q_len + i0 + i) * p.heads + h) * dv;
    const VF factor = hn::Set(d, inv[i]);
    int64_t c = 0;
    for (; c + lanes <= dv; c += lanes) {
      StoreF(hn::Mul(hn::GatherIndex(d, ot + c * width + i, column), factor), d, dst + c);
    }
    if (c < dv) {
      HWY_ALIGN float rest[hn::MaxLanes(DF())] = {};
      for (int64_t t = 0; c + t < dv; ++t) rest[t] = ot[(c + t) * width + i] * inv[i];
      StoreTailF(hn::Load(d, rest), d, dst + c, static_cast<size_t>(dv - c));
    }
  }
}

// out[0, n) = row[0, n) * factor rounded to float16 (the decode merge).
void AttentionStoreHalf(const float* row, int64_t n, float factor, F16* out) {
  ConvertRow(row, n, factor, out);
}

void AttentionQueriesF32(const att::Problem<float>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesT(p, b, h, i0, nq, scratch, l);
}
void AttentionQueriesF16(const att::Problem<F16>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesT(p, b, h, i0, nq, scratch, l);
}

}  // namespace HWY_NAMESPACE
}  // namespace fusekit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <algorithm>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

namespace att = ::fusekit::attention;

using PanelFn = int64_t (*)();

// The tensors' element type (float or fusekit::Half) -> the storage type
// the SIMD code reads (float or Highway's float16_t: the same bits) and its
// dispatched entry points.
template <typename T>
struct Storage;
template <>
struct Storage<float> {
  using type = float;
  using ItemFn = void (*)(const att::Problem<float>&, const att::Layout&, const att::Item&,
                          float*, const att::Partial*);
  using QueriesFn = void (*)(const att::Problem<float>&, int64_t, int64_t, int64_t, int64_t,
                             float*, const att::Layout&);
  static ItemFn Item() { return FUSEKIT_SIMD_CHOOSE(AttentionItemF32); }
  static QueriesFn Queries() { return FUSEKIT_SIMD_CHOOSE(AttentionQueriesF32); }
};
template <>
struct Storage<Half> {
  using type = hwy::float16_t;
  static_assert(sizeof(Half) == sizeof(type), "float16 storage must be 2 bytes");
  using ItemFn = void (*)(const att::Problem<type>&, const att::Layout&, const att::Item&,
                          float*, const att::Partial*);
  using QueriesFn = void (*)(const att::Problem<type>&, int64_t, int64_t, int64_t, int64_t,
                             float*, const att::Layout&);
  static ItemFn Item() { return FUSEKIT_SIMD_CHOOSE(AttentionItemF16); }
  static QueriesFn Queries() { return FUSEKIT_SIMD_CHOOSE(AttentionQueriesF16); }
};

// Decode steps: at most this many query positions, and at most kRows rows
// (query heads of one kv head times positions) per item.
constexpr int64_t kDecodeQueries = 4;

// Everything Invoke needs besides the tensors, decided from the shapes.
struct Plan {
  att::Layout layout;
  bool decode = false;
  int64_t splits = 1;       // key splits per (b, kv heads), decode only
  int64_t decode_heads = 1;  // kv heads per decode item
  int64_t thread_floats = 0;
  int64_t partial_floats = 0;  // decode with splits: partial results
  size_t Bytes(int threads) const {
    return sizeof(float) *
           static_cast<size_t>(partial_floats + thread_floats * threads);
  }
};

// T: the storage type of q, k, v and out (float or Half); MaskT: the
// mask's (float or bool; an additive mask is float32 for either T).
template <typename T, typename MaskT>
class Attention {
  using S = typename Storage<T>::type;
  using Problem = att::Problem<S>;

 public:
  Attention(const Attrs& attrs, std::string* error)
      : causal_(attrs.Bool("causal")),
        has_scale_(attrs.Has("scale")),
        scale_(static_cast<float>(attrs.Float("scale"))),
        panel_(FUSEKIT_SIMD_CHOOSE(AttentionPanel)),
        item_(Storage<T>::Item()),
        queries_(Storage<T>::Queries()),
        store_half_(FUSEKIT_SIMD_CHOOSE(AttentionStoreHalf)) {
    if (!std::isfinite(scale_)) {
      *error = "attr 'scale' must be a finite number, got " + std::to_string(scale_);
    }
    // Score rows are kKeys wide and filled a panel at a time: true for every
    // power-of-two vector length (all SVE hardware; the architecture no
    // longer allows others), refused for the rest rather than overrun.
    if (att::kKeys % panel_() != 0) {
      *error = "SIMD vectors of " + std::to_string(panel_() / 2) +
               " floats (not a power of two) are not supported; run with FUSEKIT_SIMD=neon";
    }
  }

  TfLiteStatus Prepare(OpContext& ctx, In<T> q, In<T> k, In<T> v, Opt<MaskT> mask,
                       Out<T> out) {
    FUSEKIT_ENSURE(ctx, q.rank() == 4, "q must have rank 4 [batch, seq, heads, head_dim], got rank %d",
                   q.rank());
    FUSEKIT_ENSURE(ctx, k.rank() == 4, "k must have rank 4 [batch, seq, kv_heads, head_dim], got rank %d",
                   k.rank());
    FUSEKIT_ENSURE(ctx, v.rank() == 4, "v must have rank 4 [batch, seq, kv_heads, value_dim], got rank %d",
                   v.rank());
    FUSEKIT_ENSURE(ctx, k.dim(0) == q.dim(0) && v.dim(0) == q.dim(0),
                   "q, k and v must have one batch size, got %d, %d and %d", q.dim(0), k.dim(0),
                   v.dim(0));
    FUSEKIT_ENSURE(ctx, k.dim(3) == q.dim(3),
                   "k's head_dim (%d) must equal q's (%d)", k.dim(3), q.dim(3));
    FUSEKIT_ENSURE(ctx, q.dim(3) >= 1, "head_dim must be >= 1, got %d", q.dim(3));
    FUSEKIT_ENSURE(ctx, v.dim(1) == k.dim(1),
                   "k and v must have one sequence length, got %d and %d", k.dim(1), v.dim(1));
    FUSEKIT_ENSURE(ctx, v.dim(2) == k.dim(2),
                   "k and v must have one number of heads, got %d and %d", k.dim(2), v.dim(2));
    FUSEKIT_ENSURE(ctx, k.dim(2) >= 1 && q.dim(2) % k.dim(2) == 0,
                   "q's heads (%d) must be a multiple of k's and v's heads (%d)", q.dim(2),
                   k.dim(2));
    if (mask.present()) {
      FUSEKIT_ENSURE(ctx, mask.rank() <= 4,
                     "mask must have rank <= 4 (broadcastable to [B, H, Sq, Skv]), got rank %d",
                     mask.rank());
      const int scores[4] = {q.dim(0), q.dim(2), q.dim(1), k.dim(1)};
      for (int i = 0; i < mask.rank(); ++i) {
        const int want = scores[4 - mask.rank() + i];
        const int got = mask.dim(i);
        FUSEKIT_ENSURE(ctx, got == 1 || got == want,
                       "mask dim %d is %d, must be 1 or %d to broadcast to the scores "
                       "[B, H, Sq, Skv] = [%d, %d, %d, %d]",
                       i, got, want, scores[0], scores[1], scores[2], scores[3]);
      }
    }
    const Problem p = Describe(q, k, v, mask, out);
    plan_ = MakePlan(p);
    // Reserve the scratch now rather than in the first Invoke.
    FUSEKIT_ENSURE(ctx, ctx.Scratch(plan_.Bytes(ctx.num_threads())) != nullptr,
                   "out of memory for %zu bytes of scratch", plan_.Bytes(ctx.num_threads()));
    return ctx.ResizeOutput(out, {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  }

  TfLiteStatus Invoke(OpContext& ctx, In<T> q, In<T> k, In<T> v, Opt<MaskT> mask,
                      Out<T> out) {
    Problem p = Describe(q, k, v, mask, out);
    if (out.num_elements() == 0) return kTfLiteOk;
    if (p.kv_len == 0) {  // no key at all: every row is fully masked (+0.0 bits)
      std::memset(p.out, 0, sizeof(T) * static_cast<size_t>(out.num_elements()));
      return kTfLiteOk;
    }
    const int threads = ctx.num_threads();
    auto* scratch = static_cast<float*>(ctx.Scratch(plan_.Bytes(threads)));
    FUSEKIT_ENSURE(ctx, scratch != nullptr, "out of memory for %zu bytes of scratch",
                   plan_.Bytes(threads));
    return plan_.decode ? Decode(ctx, p, scratch) : Prefill(ctx, p, scratch);
  }

 private:
  Problem Describe(const In<T>& q, const In<T>& k, const In<T>& v, const Opt<MaskT>& mask,
                   const Out<T>& out) const {
    Problem p{};
    p.batch = q.dim(0);
    p.q_len = q.dim(1);
    p.heads = q.dim(2);
    p.depth = q.dim(3);
    p.kv_len = k.dim(1);
    p.kv_heads = k.dim(2);
    p.value_depth = v.dim(3);
    p.group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;
    p.scale = has_scale_ ? scale_ : static_cast<float>(1.0 / std::sqrt(double(p.depth)));
    p.causal = causal_;
    p.q = reinterpret_cast<const S*>(q.data());
    p.k = reinterpret_cast<const S*>(k.data());
    p.v = reinterpret_cast<const S*>(v.data());
    p.out = reinterpret_cast<S*>(out.data());
    if (mask.present()) {
      // Strides of the mask seen as [B, H, Sq, Skv]: absent leading dims and
      // dims of size 1 repeat (stride 0).
      int64_t stride = 1;
      for (int i = 3; i >= 0; --i) {
        const int m = i - (4 - mask.rank());
        const int64_t dim = m >= 0 ? mask.dim(m) : 1;
        p.mask_stride[i] = dim == 1 ? 0 : stride;
        stride *= dim;
      }
      if constexpr (std::is_same_v<MaskT, bool>) {
        p.mask_keep = reinterpret_cast<const uint8_t*>(mask.data());
      } else {
        p.mask_add = mask.data();
      }
    }
    return p;
  }

  Plan MakePlan(const Problem& p) const {
    Plan plan;
    att::Layout& l = plan.layout;
    l.panel = panel_();
    l.value_pad = att::RoundUp(std::max<int64_t>(p.value_depth, 1), l.panel);
    plan.decode = p.q_len <= kDecodeQueries && p.group * p.q_len <= att::kRows;
    // The decode path's packed kernels (more than kStreamRows rows) read V
    // in place when Dv fills whole 2-vector chunks, else a padded copy.
    l.value_direct = plan.decode && p.value_depth % l.panel == 0;
    plan.thread_floats = att::RoundUp(att::ThreadFloats(p, l), 16);
    if (plan.decode) {
      plan.splits = std::max<int64_t>(1, (p.kv_len + att::kSplitKeys - 1) / att::kSplitKeys);
      // Streamed items take as many kv heads as their rows allow: a key's
      // rows of consecutive kv heads are one stretch of memory.
      const int64_t per_head = p.group * p.q_len;
      // No query rows (Sq = 0) is an empty output: nothing to share out.
      if (per_head > 0 && per_head <= att::kStreamRows) {
        plan.decode_heads = std::max<int64_t>(1, std::min(p.kv_heads, att::kRows / per_head));
      }
      if (plan.splits > 1) {
        const int64_t groups = (p.kv_heads + plan.decode_heads - 1) / plan.decode_heads;
        plan.partial_floats = att::RoundUp(p.batch * groups * plan.splits * plan.decode_heads *
                                               per_head * (l.value_pad + 2),
                                           16);
      }
    }
    return plan;
  }

  TfLiteStatus Prefill(OpContext& ctx, const Problem& p, float* scratch) {
    const att::Layout& l = plan_.layout;
    // Items of one panel of queries (2 vectors) of one head; consecutive
    // items share the head's K and V in cache.
    const int64_t width = l.panel;
    const int64_t blocks = (p.q_len + width - 1) / width;
    const int64_t items = p.batch * p.heads * blocks;
    // Causal items differ in cost; the pool hands out items dynamically.
    ctx.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int worker) {
      float* mine = scratch + worker * plan_.thread_floats;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t blk = t % blocks, bh = t / blocks;
        const int64_t i0 = blk * width;
        queries_(p, bh / p.heads, bh % p.heads, i0, std::min(width, p.q_len - i0), mine, l);
      }
    });
    return kTfLiteOk;
  }

  TfLiteStatus Decode(OpContext& ctx, const Problem& p, float* scratch) {
    const att::Layout& l = plan_.layout;
    const int64_t splits = plan_.splits;
    const int64_t per_head = p.group * p.q_len;  // rows of one kv head
    const int64_t group_heads = plan_.decode_heads;  // kv heads per item
    const int64_t groups = (p.kv_heads + group_heads - 1) / group_heads;
    const int64_t item_rows = group_heads * per_head;
    float* partials = scratch;
    float* threads_base = scratch + plan_.partial_floats;
    const int64_t row_floats = l.value_pad + 2;
    const int64_t items = p.batch * groups * splits;
    ctx.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int worker) {
      float* mine = threads_base + worker * plan_.thread_floats;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t split = t % splits, bg = t / splits;
        att::Item it{};
        it.b = bg / groups;
        it.kv_head = (bg % groups) * group_heads;
        it.kv_head_count = std::min(group_heads, p.kv_heads - it.kv_head);
        it.group_begin = 0;
        it.group_count = p.group;
        it.query_begin = 0;
        it.query_count = p.q_len;
        it.key_begin = split * att::kSplitKeys;
        it.key_end = std::min(p.kv_len, it.key_begin + att::kSplitKeys);
        if (splits == 1) {
          item_(p, l, it, mine, nullptr);
          continue;
        }
        float* base = partials + t * item_rows * row_floats;
        const att::Partial part{base, base + item_rows, base + 2 * item_rows};
        item_(p, l, it, mine, &part);
      }
    });
    if (splits == 1) return kTfLiteOk;
    // Merge the splits of each row in split order (float16 output: in a
    // float row of the worker's scratch, rounded once at the end).
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int64_t heads = p.batch * p.kv_heads;
    ctx.ParallelFor(heads * per_head, 16, [&](int64_t begin, int64_t end, int worker) {
      float* row = threads_base + worker * plan_.thread_floats;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t head = t / per_head, r = t % per_head;
        const int64_t b = head / p.kv_heads, kvh = head % p.kv_heads;
        // The row's place in its item and the item's partials per split.
        const int64_t at = (kvh % group_heads) * per_head + r;
        const int64_t first = (b * groups + kvh / group_heads) * splits;
        auto part = [&](int64_t s) { return partials + (first + s) * item_rows * row_floats; };
        float max = kNegInf;
        for (int64_t s = 0; s < splits; ++s) max = std::max(max, part(s)[at]);
        const int64_t h = kvh * p.group + r / p.q_len, i = r % p.q_len;
        S* out = p.out + ((b * p.q_len + i) * p.heads + h) * p.value_depth;
        float* dst;
        if constexpr (std::is_same_v<S, float>) {
          dst = out;
        } else {
          dst = row;
        }
        std::fill(dst, dst + p.value_depth, 0.0f);
        if (max == kNegInf) {
          if constexpr (!std::is_same_v<S, float>) {
            std::memset(out, 0, sizeof(S) * static_cast<size_t>(p.value_depth));
          }
          continue;
        }
        float sum = 0.0f;
        for (int64_t s = 0; s < splits; ++s) {
          const float* base = part(s);
          if (base[at] == kNegInf) continue;
          const float w = std::exp(base[at] - max);
          sum += base[item_rows + at] * w;
          const float* o = base + 2 * item_rows + at * l.value_pad;
          for (int64_t c = 0; c < p.value_depth; ++c) dst[c] += o[c] * w;
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        if constexpr (std::is_same_v<S, float>) {
          for (int64_t c = 0; c < p.value_depth; ++c) dst[c] *= inv;
        } else {
          store_half_(dst, p.value_depth, inv, out);
        }
      }
    });
    return kTfLiteOk;
  }

  bool causal_;
  bool has_scale_;
  float scale_;
  PanelFn panel_;
  typename Storage<T>::ItemFn item_;
  typename Storage<T>::QueriesFn queries_;
  void (*store_half_)(const float*, int64_t, float, hwy::float16_t*);
  Plan plan_;
};

}  // namespace

#define FUSEKIT_ATTENTION_OPERANDS \
  Inputs("q", "k", "v", "mask"), Outputs("out"), \
      AttrSchema(attr::Bool("causal", false), attr::Float("scale", 0.0))
// q, k, v and out share one dtype (float32 or float16); mixed dtypes match
// no variant and fail in the SDK with the operands' dtypes named.
using AttentionF32 = Attention<float, float>;
using AttentionF32Bool = Attention<float, bool>;
using AttentionF16 = Attention<Half, float>;
using AttentionF16Bool = Attention<Half, bool>;
FUSEKIT_REGISTER_KERNEL("fusekit_attention", AttentionF32, FUSEKIT_ATTENTION_OPERANDS);
FUSEKIT_REGISTER_KERNEL("fusekit_attention", AttentionF32Bool, FUSEKIT_ATTENTION_OPERANDS);
FUSEKIT_REGISTER_KERNEL("fusekit_attention", AttentionF16, FUSEKIT_ATTENTION_OPERANDS);
FUSEKIT_REGISTER_KERNEL("fusekit_attention", AttentionF16Bool, FUSEKIT_ATTENTION_OPERANDS);
#undef FUSEKIT_ATTENTION_OPERANDS

}  // namespace fusekit

#endif  // HWY_ONCE
