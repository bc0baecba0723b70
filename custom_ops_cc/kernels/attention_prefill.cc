// fusekit_attention's prefill path (attention.cc describes the op): an
// item is one head and 2 SIMD vectors of queries, held transposed so that
// the vector lanes are queries.
#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_prefill.cc"
#define FUSEKIT_SIMD_MATH
#include "fusekit/simd_begin.h"
#include "kernels/attention_entry-inl.h"
#include "kernels/attention_microkernels-inl.h"

// ----------------------------------------------------------------- prefill
//
// Prefill items run transposed: the lanes of a vector are queries.  A
// block of 2 vectors of queries (one head) meets the keys block by block:
// S^T[j][queries] = K[j] . Q^T (K rows broadcast in place, Q^T packed once
// per item), the online softmax runs down the key axis with plain vector
// max/add (no horizontal reduction, no per-row scalar work), and
// O^T[c][queries] += V[j][c] * P^T[j] broadcasts V in place.  Neither K nor
// V is copied, and the only transpose is of the item's output.

// Keys per block of a prefill item (its S^T block: kKeysT x 2 vectors).
constexpr int64_t kKeysT = 128;

// A prefill block's S^T (kKeysT keys x one panel) fits the decode scores'
// buffer even at SVE's longest vectors (2048 bits: a panel of 128).
static_assert(kKeysT * 2 * hn::MaxLanes(DF()) <= att::kRows * att::kKeys,
              "S^T outgrows its buffer");

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
    if (p.softcap > 0.0f) SoftcapRow(st, n * width, p.softcap);
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

void AttentionQueriesF32(const att::Problem<float>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesT(p, b, h, i0, nq, scratch, l);
}
void AttentionQueriesF16(const att::Problem<F16>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesT(p, b, h, i0, nq, scratch, l);
}

#include "fusekit/simd_end.h"
