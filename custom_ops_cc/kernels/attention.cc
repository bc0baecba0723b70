// fusekit_attention: out = softmax(q @ k^T * scale + mask) @ v per head.
// Inputs: q [B, Sq, H, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv] float32,
// optional mask (float32 additive or bool keep) broadcastable to
// [B, H, Sq, Skv].  Attrs: causal (bool, bottom-right aligned), scale
// (float, absent: 1/sqrt(D)).  Output [B, Sq, H, Dv].  Query head h reads
// kv head h / (H / Hkv).
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

#if HWY_TARGET == HWY_AVX3
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

// S[r][0, panel) = Q[r] . Kpanel for MR rows; Q rows are `depth` apart.
template <int MR>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, int64_t depth,
                       const float* HWY_RESTRICT kp, float* HWY_RESTRICT s,
                       int64_t s_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  VF a0[MR], a1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) a0[r] = a1[r] = hn::Zero(d);
  for (int64_t k = 0; k < depth; ++k) {
    const VF b0 = hn::Load(d, kp + k * 2 * lanes);
    const VF b1 = hn::Load(d, kp + k * 2 * lanes + lanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const VF a = hn::Set(d, q[r * depth + k]);
      a0[r] = hn::MulAdd(a, b0, a0[r]);
      a1[r] = hn::MulAdd(a, b1, a1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    hn::StoreU(a0[r], d, s + r * s_stride);
    hn::StoreU(a1[r], d, s + r * s_stride + lanes);
  }
}

// O[r][0, 2 vectors) += sum_j P[r][j] * V[j][0, 2 vectors) for MR rows.
template <int MR>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, int64_t p_stride, int64_t n,
                       const float* HWY_RESTRICT v, int64_t v_stride,
                       float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  VF a0[MR], a1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    a0[r] = hn::LoadU(d, o + r * o_stride);
    a1[r] = hn::LoadU(d, o + r * o_stride + lanes);
  }
  for (int64_t j = 0; j < n; ++j) {
    const VF b0 = hn::LoadU(d, v + j * v_stride);
    const VF b1 = hn::LoadU(d, v + j * v_stride + lanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const VF a = hn::Set(d, p[r * p_stride + j]);
      a0[r] = hn::MulAdd(a, b0, a0[r]);
      a1[r] = hn::MulAdd(a, b1, a1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    hn::StoreU(a0[r], d, o + r * o_stride);
    hn::StoreU(a1[r], d, o + r * o_stride + lanes);
  }
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

template <int MR>
HWY_INLINE void PvRows(const float* p, int64_t p_stride, int64_t n, const float* v,
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
void AttentionPackK(const att::Problem& p, int64_t b, int64_t kv_head, int64_t j0,
                    int64_t n, float* HWY_RESTRICT kp) {
  const int64_t panel = AttentionPanel();
  const int64_t depth = p.depth;
  const int64_t row_stride = p.kv_heads * depth;
  const float* base = p.k + ((b * p.kv_len + j0) * p.kv_heads + kv_head) * depth;
  const int64_t padded = att::RoundUp(n, panel);
  for (int64_t pj = 0; pj < padded; pj += panel) {
    float* HWY_RESTRICT dst = kp + pj * depth;
    const int64_t count = n - pj < panel ? n - pj : panel;
    if (count < panel) std::memset(dst, 0, sizeof(float) * depth * panel);
    // Writes in order (the panel's rows are few cache lines, read from L1).
    const float* HWY_RESTRICT src = base + pj * row_stride;
    for (int64_t k = 0; k < depth; ++k) {
      for (int64_t c = 0; c < count; ++c) dst[k * panel + c] = src[c * row_stride + k];
    }
  }
}

// Rows j0.. (n of them) of V for one (b, kv head), padded to value_pad.
void AttentionPackV(const att::Problem& p, int64_t value_pad, int64_t b, int64_t kv_head,
                    int64_t j0, int64_t n, float* HWY_RESTRICT vp) {
  const int64_t dv = p.value_depth;
  for (int64_t j = 0; j < n; ++j) {
    const float* src = p.v + ((b * p.kv_len + j0 + j) * p.kv_heads + kv_head) * dv;
    float* dst = vp + j * value_pad;
    std::memcpy(dst, src, sizeof(float) * dv);
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
HWY_INLINE void MaskRow(const att::Problem& p, int64_t b, int64_t h, int64_t i, int64_t j0,
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

// A decode item reads the rows of its kv heads, Hkv * D floats apart; when
// the item has fewer heads than the tensor, each row starts a new stretch
// (a new page once Hkv * D * 4 >= 4096), where the hardware prefetchers
// stop, so the item asks for the rows it reads a few rows ahead itself.
// (A prefetch past the end of a tensor is harmless: it never faults.)
constexpr int64_t kPrefetchRows = 8;
HWY_INLINE void PrefetchRow(const float* row, int64_t count) {
  for (int64_t c = 0; c < count; c += 16) __builtin_prefetch(row + c, 0, 3);
}

// Few query rows per kv head against keys read in place (a decode step):
// key row j of every kv head of the item (consecutive heads, one
// contiguous stretch of memory) is loaded once and dotted with that head's
// query rows, so K streams from memory once, in address order, with no
// transposed copy.  Row r belongs to the item's head r / per_head.
// s[r][j] for r < rows, j < n.
void DotScores(const float* HWY_RESTRICT q, int64_t rows, int64_t per_head, int64_t depth,
               const float* HWY_RESTRICT k, int64_t k_stride, int64_t n,
               float* HWY_RESTRICT s, int64_t s_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t heads = rows / per_head;
  for (int64_t j = 0; j < n; ++j) {
    const float* HWY_RESTRICT k_row = k + j * k_stride;
    PrefetchRow(k_row + kPrefetchRows * k_stride, heads * depth);
    for (int64_t g = 0; g < heads; ++g) {
      const float* HWY_RESTRICT kr = k_row + g * depth;
      int64_t r = g * per_head;
      const int64_t r_end = r + per_head;
      for (; r + 4 <= r_end; r += 4) {
        const float* q0 = q + r * depth;
        VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        int64_t c = 0;
        for (; c + lanes <= depth; c += lanes) {
          const VF kv = hn::LoadU(d, kr + c);
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), kv, a0);
          a1 = hn::MulAdd(hn::LoadU(d, q0 + depth + c), kv, a1);
          a2 = hn::MulAdd(hn::LoadU(d, q0 + 2 * depth + c), kv, a2);
          a3 = hn::MulAdd(hn::LoadU(d, q0 + 3 * depth + c), kv, a3);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          const VF kv = LoadTail(d, kr + c, rest);
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
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), hn::LoadU(d, kr + c), a0);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          a0 = hn::MulAdd(LoadTail(d, q0 + c, rest), LoadTail(d, kr + c, rest), a0);
        }
        s[r * s_stride + j] = hn::GetLane(hn::SumOfLanes(d, a0));
      }
    }
  }
}

// o[r][0, dv) += sum_j p[r][j] * v[j][0, dv) with V rows read in place,
// each once, in address order: the decode step's P.V (row r reads the V of
// the item's head r / per_head; o rows are value_pad floats apart).
void StreamPv(const float* HWY_RESTRICT p, int64_t p_stride, int64_t rows, int64_t per_head,
              int64_t n, const float* HWY_RESTRICT v, int64_t v_stride, int64_t dv,
              float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < n; ++j) {
    const float* HWY_RESTRICT v_row = v + j * v_stride;
    PrefetchRow(v_row + kPrefetchRows * v_stride, rows / per_head * dv);
    for (int64_t r = 0; r < rows; ++r) {
      const float* HWY_RESTRICT vr = v_row + (r / per_head) * dv;
      const float w = p[r * p_stride + j];
      if (w == 0.0f) continue;  // dropped keys
      const VF vw = hn::Set(d, w);
      float* HWY_RESTRICT orow = o + r * o_stride;
      int64_t c = 0;
      for (; c + lanes <= dv; c += lanes) {
        hn::StoreU(hn::MulAdd(vw, hn::LoadU(d, vr + c), hn::LoadU(d, orow + c)), d, orow + c);
      }
      if (c < dv) {
        // o has value_pad >= dv columns: the padding lanes take v's zeros.
        const size_t rest = static_cast<size_t>(dv - c);
        hn::StoreU(hn::MulAdd(vw, LoadTail(d, vr + c, rest), hn::LoadU(d, orow + c)), d,
                   orow + c);
      }
    }
  }
}

// Buffers of one thread, carved from its share of the scratch.
struct Buffers {
  float* q;      // [kRows][D], scaled queries
  float* s;      // [kRows][kKeys], scores then weights
  float* o;      // [kRows][value_pad], unnormalized output rows
  float* max;    // [kRows]
  float* sum;    // [kRows]
  float* kblock; // [D][kKeys] K panels of one block (decode)
  float* vblock; // [kKeys][value_pad] V rows of one block (decode, ragged Dv)
};

HWY_INLINE Buffers Carve(const att::Problem& p, const att::Layout& l, float* base) {
  Buffers buf;
  buf.q = base;
  base += att::RoundUp(att::kRows * p.depth, 16);
  buf.s = base;
  base += att::kRows * att::kKeys;
  buf.o = base;
  base += att::kRows * l.value_pad;
  buf.max = base;
  base += att::kRows;
  buf.sum = base;
  base += att::kRows;
  buf.kblock = base;
  base += att::RoundUp(p.depth * att::kKeys, 16);
  buf.vblock = base;
  return buf;
}

// One decode item: the rows of `it` (every query head of one kv head times
// a few queries) against keys [key_begin, key_end).  At most kStreamRows
// rows read K and V in place; more pack each block of K into panels for
// the register-tiled kernels.  The result goes to p.out, or to `partial`
// when non-null.
void AttentionItem(const att::Problem& p, const att::Layout& l, const att::Item& it,
                   float* scratch,
                   const att::Partial* partial) {
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
    const float* src = p.q + ((it.b * p.q_len + query_of(r)) * p.heads + head_of(r)) * depth;
    float* dst = buf.q + r * depth;
    for (int64_t k = 0; k < depth; ++k) dst[k] = src[k] * p.scale;
    buf.max[r] = kNegInf;
    buf.sum[r] = 0.0f;
  }
  std::memset(buf.o, 0, sizeof(float) * rows * vpad);

  int64_t key_end = it.key_end;
  const int64_t last_query = it.query_begin + it.query_count - 1;
  if (p.causal && last_query + offset + 1 < key_end) key_end = last_query + offset + 1;
  const int64_t panel = l.panel;
  const int64_t v_row = p.kv_heads * dv;
  const float* v_head = p.v + (it.b * p.kv_len * p.kv_heads + it.kv_head) * dv;
  const int64_t k_row = p.kv_heads * depth;
  const float* k_head = p.k + (it.b * p.kv_len * p.kv_heads + it.kv_head) * depth;
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
        const float* next = v_head + (j0 + js + kDecodePvKeys) * v_row;
        for (int64_t j = 0; j < kDecodePvKeys; ++j) {
          PrefetchRow(next + j * v_row, it.kv_head_count * dv);
        }
        for (int64_t g = 0; g < it.kv_head_count; ++g) {
          const float* vg = v_head + (j0 + js) * v_row + g * dv;
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
    // O += P . V, two vectors of output columns at a time.
    const float* vsrc;
    int64_t vstride;
    if (l.value_direct) {
      vsrc = v_head + j0 * v_row;
      vstride = v_row;
    } else {
      AttentionPackV(p, vpad, it.b, it.kv_head, j0, n, buf.vblock);
      vsrc = buf.vblock;
      vstride = vpad;
    }
    // In steps of kPvKeys keys, so that the weights and V rows one step
    // touches (kRows x kPvKeys and kPvKeys x value_pad floats) stay in L1
    // while every row tile and column chunk passes over them.
    for (int64_t js = 0; js < n; js += kPvKeys) {
      const int64_t m = n - js < kPvKeys ? n - js : kPvKeys;
      for (int64_t c = 0; c < vpad; c += panel) {
        PvRows<kMaxTile>(buf.s + js, att::kKeys, m, vsrc + js * vstride + c, vstride,
                         buf.o + c, vpad, rows);
      }
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
    float* dst = p.out + ((it.b * p.q_len + query_of(r)) * p.heads + head_of(r)) * dv;
    const float inv = buf.sum[r] > 0.0f ? 1.0f / buf.sum[r] : 0.0f;
    for (int64_t c = 0; c < dv; ++c) dst[c] = o[c] * inv;
  }
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
  VF a0[MR], a1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) a0[r] = a1[r] = hn::Zero(d);
  for (int64_t c = 0; c < depth; ++c) {
    const VF b0 = hn::Load(d, qt + c * 2 * lanes);
    const VF b1 = hn::Load(d, qt + c * 2 * lanes + lanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const VF a = hn::Set(d, k[r * k_stride + c]);
      a0[r] = hn::MulAdd(a, b0, a0[r]);
      a1[r] = hn::MulAdd(a, b1, a1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    hn::Store(a0[r], d, st + r * 2 * lanes);
    hn::Store(a1[r], d, st + r * 2 * lanes + lanes);
  }
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
  VF a0[MR], a1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    a0[r] = hn::Load(d, ot + r * 2 * lanes);
    a1[r] = hn::Load(d, ot + r * 2 * lanes + lanes);
  }
  for (int64_t j = 0; j < n; ++j) {
    const VF b0 = hn::Load(d, pt + j * 2 * lanes);
    const VF b1 = hn::Load(d, pt + j * 2 * lanes + lanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const VF a = hn::Set(d, v[j * v_stride + r]);
      a0[r] = hn::MulAdd(a, b0, a0[r]);
      a1[r] = hn::MulAdd(a, b1, a1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    hn::Store(a0[r], d, ot + r * 2 * lanes);
    hn::Store(a1[r], d, ot + r * 2 * lanes + lanes);
  }
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
// most 2 vectors.  Scratch: see Buffers (q holds Q^T, s holds S^T, o O^T).
void AttentionQueries(const att::Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq,
                      float* scratch, const att::Layout& l) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = 2 * lanes;
  const Buffers buf = Carve(p, l, scratch);
  const int64_t depth = p.depth, dv = p.value_depth;
  // K and V rows are read in place.  (A contiguous copy per head, which
  // keeps rows Hkv * D floats apart off a few L1 sets, measured slower:
  // the copy costs more than the conflicts.)
  const int64_t kv_head = h / p.group;
  const int64_t k_row = p.kv_heads * depth, v_row = p.kv_heads * dv;
  const float* k_head = p.k + (b * p.kv_len * p.kv_heads + kv_head) * depth;
  const float* v_head = p.v + (b * p.kv_len * p.kv_heads + kv_head) * dv;
  const int64_t offset = p.kv_len - p.q_len;  // causal: key j <= i + offset

  // Q^T, scaled; lanes past nq are zero (their columns are never written).
  // A full panel is gathered a vector of queries at a time.
  float* qt = buf.q;
  const float* q_rows = p.q + ((b * p.q_len + i0) * p.heads + h) * depth;
  const int64_t q_stride = p.heads * depth;
  const hn::RebindToSigned<DF> di;
  if (nq == width && width * q_stride <= INT32_MAX) {
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
    KqRows<kMaxTile>(k_head + j0 * k_row, k_row, depth, qt, st, n);
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
    VpRows<kMaxTile>(v_head + j0 * v_row, v_row, n, st, ot, dv);
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
    float* dst = p.out + ((b * p.q_len + i0 + i) * p.heads + h) * dv;
    const VF factor = hn::Set(d, inv[i]);
    int64_t c = 0;
    for (; c + lanes <= dv; c += lanes) {
      hn::StoreU(hn::Mul(hn::GatherIndex(d, ot + c * width + i, column), factor), d, dst + c);
    }
    for (; c < dv; ++c) dst[c] = ot[c * width + i] * inv[i];
  }
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
using ItemFn = void (*)(const att::Problem&, const att::Layout&, const att::Item&, float*,
                        const att::Partial*);
using QueriesFn = void (*)(const att::Problem&, int64_t, int64_t, int64_t, int64_t, float*,
                           const att::Layout&);

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

template <typename MaskT>
class Attention {
 public:
  Attention(const Attrs& attrs, std::string* error)
      : causal_(attrs.Bool("causal")),
        has_scale_(attrs.Has("scale")),
        scale_(static_cast<float>(attrs.Float("scale"))),
        panel_(FUSEKIT_SIMD_CHOOSE(AttentionPanel)),
        item_(FUSEKIT_SIMD_CHOOSE(AttentionItem)),
        queries_(FUSEKIT_SIMD_CHOOSE(AttentionQueries)) {
    if (!std::isfinite(scale_)) {
      *error = "attr 'scale' must be a finite number, got " + std::to_string(scale_);
    }
  }

  TfLiteStatus Prepare(OpContext& ctx, In<float> q, In<float> k, In<float> v,
                       Opt<MaskT> mask, Out<float> out) {
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
    const att::Problem p = Describe(q, k, v, mask, out);
    plan_ = MakePlan(p);
    // Reserve the scratch now rather than in the first Invoke.
    FUSEKIT_ENSURE(ctx, ctx.Scratch(plan_.Bytes(ctx.num_threads())) != nullptr,
                   "out of memory for %zu bytes of scratch", plan_.Bytes(ctx.num_threads()));
    return ctx.ResizeOutput(out, {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> q, In<float> k, In<float> v, Opt<MaskT> mask,
                      Out<float> out) {
    att::Problem p = Describe(q, k, v, mask, out);
    if (out.num_elements() == 0) return kTfLiteOk;
    if (p.kv_len == 0) {  // no key at all: every row is fully masked
      std::memset(p.out, 0, sizeof(float) * static_cast<size_t>(out.num_elements()));
      return kTfLiteOk;
    }
    const int threads = ctx.num_threads();
    auto* scratch = static_cast<float*>(ctx.Scratch(plan_.Bytes(threads)));
    FUSEKIT_ENSURE(ctx, scratch != nullptr, "out of memory for %zu bytes of scratch",
                   plan_.Bytes(threads));
    return plan_.decode ? Decode(ctx, p, scratch) : Prefill(ctx, p, scratch);
  }

 private:
  att::Problem Describe(const In<float>& q, const In<float>& k, const In<float>& v,
                        const Opt<MaskT>& mask, const Out<float>& out) const {
    att::Problem p{};
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
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.out = out.data();
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

  Plan MakePlan(const att::Problem& p) const {
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
      if (per_head <= att::kStreamRows) {
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

  TfLiteStatus Prefill(OpContext& ctx, const att::Problem& p, float* scratch) {
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

  TfLiteStatus Decode(OpContext& ctx, const att::Problem& p, float* scratch) {
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
    // Merge the splits of each row in split order.
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int64_t heads = p.batch * p.kv_heads;
    ctx.ParallelFor(heads * per_head, 16, [&](int64_t begin, int64_t end) {
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
        float* dst = p.out + ((b * p.q_len + i) * p.heads + h) * p.value_depth;
        std::fill(dst, dst + p.value_depth, 0.0f);
        if (max == kNegInf) continue;
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
        for (int64_t c = 0; c < p.value_depth; ++c) dst[c] *= inv;
      }
    });
    return kTfLiteOk;
  }

  bool causal_;
  bool has_scale_;
  float scale_;
  PanelFn panel_;
  ItemFn item_;
  QueriesFn queries_;
  Plan plan_;
};

}  // namespace

#define FUSEKIT_ATTENTION_OPERANDS \
  Inputs("q", "k", "v", "mask"), Outputs("out"), \
      AttrSchema(attr::Bool("causal", false), attr::Float("scale", 0.0))
FUSEKIT_REGISTER_KERNEL("fusekit_attention", Attention<float>, FUSEKIT_ATTENTION_OPERANDS);
FUSEKIT_REGISTER_KERNEL("fusekit_attention", Attention<bool>, FUSEKIT_ATTENTION_OPERANDS);
#undef FUSEKIT_ATTENTION_OPERANDS

}  // namespace fusekit

#endif  // HWY_ONCE
