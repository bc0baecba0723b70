// fusekit_attention's decode path (attention.cc describes the op): few
// query rows per kv head against a long cache.  An item is every query head
// of one kv head (or several kv heads), so K and V stream from memory once;
// long caches are split into kSplitKeys pieces merged in attention.cc.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_decode.cc"
#define FUSEKIT_SIMD_MATH
#include "fusekit/simd_begin.h"
#include "kernels/attention_entry-inl.h"
#include "kernels/attention_microkernels-inl.h"

constexpr int64_t kPvKeys = 64;
// Keys per step of a streamed decode item's P.V.
constexpr int64_t kDecodePvKeys = 32;

// Keys [j0, j0 + n) of one (b, kv head) into panels [D][panel] (zeros past n).
template <typename T>
void AttentionPackK(const att::Problem<T>& p, int64_t b, int64_t kv_head, int64_t j0,
                    int64_t n, float* HWY_RESTRICT kp) {
  const int64_t panel = PanelKeys();
  const int64_t depth = p.depth;
  const int64_t row_stride = p.k_row;
  const T* base = p.k + b * p.k_batch + kv_head * p.k_head + j0 * row_stride;
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

// Rows j0.. (n of them) of V for one (b, kv head), padded to value_pad
// (V rows in place: not the transposed layout).
template <typename T>
void AttentionPackV(const att::Problem<T>& p, int64_t value_pad, int64_t b, int64_t kv_head,
                    int64_t j0, int64_t n, float* HWY_RESTRICT vp) {
  const int64_t dv = p.value_depth;
  for (int64_t j = 0; j < n; ++j) {
    const T* src = p.v + b * p.v_batch + kv_head * p.v_head + (j0 + j) * p.v_row;
    float* dst = vp + j * value_pad;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(dst, src, sizeof(float) * dv);
    } else {
      ConvertRow(src, dv, 1.0f, dst);
    }
    std::memset(dst + dv, 0, sizeof(float) * (value_pad - dv));
  }
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

// A decode item reads the rows of its kv heads, Hkv * D elements apart in
// the [B, Skv, Hkv, D] layout; when the item has fewer heads than the
// tensor, each row starts a new stretch (a new page once
// Hkv * D * sizeof(T) >= 4096), where the hardware prefetchers stop, so the
// item asks for the rows it reads a few rows ahead itself.  (A prefetch
// past the end of a tensor is harmless: it never faults.)
constexpr int64_t kPrefetchRows = 8;
template <typename T>
HWY_INLINE void PrefetchRow(const T* row, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line
  for (int64_t c = 0; c < count; c += kLine) __builtin_prefetch(row + c, 0, 3);
}
// The `count` elements of `heads` heads `head_stride` apart from `row` (one
// stretch when the heads are adjacent).
template <typename T>
HWY_INLINE void PrefetchHeads(const T* row, int64_t heads, int64_t head_stride, int64_t count) {
  if (head_stride == count) {
    PrefetchRow(row, heads * count);
    return;
  }
  for (int64_t g = 0; g < heads; ++g) PrefetchRow(row + g * head_stride, count);
}

// Few query rows per kv head against keys read in place (a decode step):
// key row j of every kv head of the item is loaded once and dotted with
// that head's query rows, so K streams from memory once, in address order
// (the heads' rows are one stretch in [B, Skv, Hkv, D], one stream per
// head in [B, Hkv, Skv, D]), with no transposed copy.  Row r belongs to
// the item's head r / per_head (K rows of head g start k_head_stride
// after head 0's); q rows are q_stride apart.  s[r][j] for r < rows,
// j < n, or s[r][j] += the same with kAccumulate.  One lane reduction per
// score: the scores of scalable vectors (SVE), whose lanes do not come in
// a fixed number of 128-bit blocks; DecodeScores below is the fixed-width
// targets' register-tiled version.
template <bool kAccumulate, typename T>
void DotScores(const float* HWY_RESTRICT q, int64_t q_stride, int64_t rows, int64_t per_head,
               int64_t depth, const T* HWY_RESTRICT k, int64_t k_stride, int64_t k_head_stride,
               int64_t n, float* HWY_RESTRICT s, int64_t s_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t heads = rows / per_head;
  auto put = [&](float* at, VF sum) {
    const float x = hn::GetLane(hn::SumOfLanes(d, sum));
    if constexpr (kAccumulate) {
      *at += x;
    } else {
      *at = x;
    }
  };
  for (int64_t j = 0; j < n; ++j) {
    const T* HWY_RESTRICT k_row = k + j * k_stride;
    PrefetchHeads(k_row + kPrefetchRows * k_stride, heads, k_head_stride, depth);
    for (int64_t g = 0; g < heads; ++g) {
      const T* HWY_RESTRICT kr = k_row + g * k_head_stride;
      int64_t r = g * per_head;
      const int64_t r_end = r + per_head;
      for (; r + 4 <= r_end; r += 4) {
        const float* q0 = q + r * q_stride;
        const float* q1 = q0 + q_stride;
        const float* q2 = q1 + q_stride;
        const float* q3 = q2 + q_stride;
        VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        int64_t c = 0;
        for (; c + lanes <= depth; c += lanes) {
          const VF kv = LoadF(d, kr + c);
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), kv, a0);
          a1 = hn::MulAdd(hn::LoadU(d, q1 + c), kv, a1);
          a2 = hn::MulAdd(hn::LoadU(d, q2 + c), kv, a2);
          a3 = hn::MulAdd(hn::LoadU(d, q3 + c), kv, a3);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          const VF kv = LoadTailF(d, kr + c, rest);
          a0 = hn::MulAdd(LoadTail(d, q0 + c, rest), kv, a0);
          a1 = hn::MulAdd(LoadTail(d, q1 + c, rest), kv, a1);
          a2 = hn::MulAdd(LoadTail(d, q2 + c, rest), kv, a2);
          a3 = hn::MulAdd(LoadTail(d, q3 + c, rest), kv, a3);
        }
        put(s + r * s_stride + j, a0);
        put(s + (r + 1) * s_stride + j, a1);
        put(s + (r + 2) * s_stride + j, a2);
        put(s + (r + 3) * s_stride + j, a3);
      }
      for (; r < r_end; ++r) {
        const float* q0 = q + r * q_stride;
        VF a0 = hn::Zero(d);
        int64_t c = 0;
        for (; c + lanes <= depth; c += lanes) {
          a0 = hn::MulAdd(hn::LoadU(d, q0 + c), LoadF(d, kr + c), a0);
        }
        if (c < depth) {
          const size_t rest = static_cast<size_t>(depth - c);
          a0 = hn::MulAdd(LoadTail(d, q0 + c, rest), LoadTailF(d, kr + c, rest), a0);
        }
        put(s + r * s_stride + j, a0);
      }
    }
  }
}

// ------------------------------------------------ decode dot products
//
// A decode item has few query rows per kv head (group x queries), so its
// cost is reading K and V once; the arithmetic must stay below that.  The
// two kernels below keep several independent accumulators in registers
// and reduce across lanes once per 4 keys (scores) or once per block of
// keys (P.V^T), not once per key and row.

// This file is compiled once per SIMD target (foreach_target): the macro
// must not carry over from an earlier target to one without the kernels.
#undef FUSEKIT_DECODE_REDUCE4
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR
// Fixed-width vectors (x86, NEON): lanes come in 128-bit blocks of 4.
#define FUSEKIT_DECODE_REDUCE4 1
using D4 = hn::Full128<float>;

// The 4-lane vector of block-wise partial sums of v (every 128-bit block
// added up).
template <class D>
HWY_INLINE hn::Vec<D4> SumBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return SumBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}

// {sum of a0's lanes, a1's, a2's, a3's} in one 4-lane vector: two rounds of
// interleave-and-add within 128-bit blocks, then the blocks summed (13
// vector ops on AVX-512 for 4 sums, where 4 separate reductions take 32).
HWY_INLINE hn::Vec<D4> Reduce4(VF a0, VF a1, VF a2, VF a3) {
  const DF d;
  const hn::Repartition<uint64_t, DF> d64;
  // Per block: {a0[0]+a0[2], a1[0]+a1[2], a0[1]+a0[3], a1[1]+a1[3]}.
  const VF t01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const VF t23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  // Per block: {a0, a1, a2, a3} partial sums.
  const VF sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                          hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
  return SumBlocks(d, sums);
}

// Rows of a decode tile: MR rows x 4 keys of accumulators plus MR query
// vectors fit in 16 vector registers (AVX2) with MR = 3, in 32 with 4.
#if HWY_TARGET == HWY_AVX3 || HWY_ARCH_ARM_A64
constexpr int kDecodeRows = 4;
#else
constexpr int kDecodeRows = 3;
#endif

// Scores of MR query rows (q rows q_stride apart) against 4 K rows
// k0..k3 (the same row repeated past the last key): s[r][x] for x < count.
template <int MR, typename T>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT q, int64_t q_stride, int64_t depth,
                          const T* HWY_RESTRICT k0, const T* HWY_RESTRICT k1,
                          const T* HWY_RESTRICT k2, const T* HWY_RESTRICT k3, int64_t count,
                          float* HWY_RESTRICT s, int64_t s_stride) {
  static_assert(MR >= 1 && MR <= 4, "a decode tile has 1 to 4 rows");
  const DF d;
  const D4 d4;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full = depth / lanes * lanes;
  const size_t rest = static_cast<size_t>(depth - full);
  // Named accumulators (SVE-style sizeless vectors cannot be array
  // elements); rows past MR are discarded at compile time.
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  VF c0 = a0, c1 = a0, c2 = a0, c3 = a0, e0 = a0, e1 = a0, e2 = a0, e3 = a0;
  auto step = [&](int64_t c, auto load_q, VF x0, VF x1, VF x2, VF x3) {
    const VF qa = load_q(q + c);
    a0 = hn::MulAdd(qa, x0, a0);
    a1 = hn::MulAdd(qa, x1, a1);
    a2 = hn::MulAdd(qa, x2, a2);
    a3 = hn::MulAdd(qa, x3, a3);
    if constexpr (MR > 1) {
      const VF qb = load_q(q + q_stride + c);
      b0 = hn::MulAdd(qb, x0, b0);
      b1 = hn::MulAdd(qb, x1, b1);
      b2 = hn::MulAdd(qb, x2, b2);
      b3 = hn::MulAdd(qb, x3, b3);
    }
    if constexpr (MR > 2) {
      const VF qc = load_q(q + 2 * q_stride + c);
      c0 = hn::MulAdd(qc, x0, c0);
      c1 = hn::MulAdd(qc, x1, c1);
      c2 = hn::MulAdd(qc, x2, c2);
      c3 = hn::MulAdd(qc, x3, c3);
    }
    if constexpr (MR > 3) {
      const VF qe = load_q(q + 3 * q_stride + c);
      e0 = hn::MulAdd(qe, x0, e0);
      e1 = hn::MulAdd(qe, x1, e1);
      e2 = hn::MulAdd(qe, x2, e2);
      e3 = hn::MulAdd(qe, x3, e3);
    }
  };
  auto load_full = [&](const float* at) { return hn::LoadU(d, at); };
  for (int64_t c = 0; c < full; c += lanes) {
    step(c, load_full, LoadF(d, k0 + c), LoadF(d, k1 + c), LoadF(d, k2 + c), LoadF(d, k3 + c));
  }
  if (rest != 0) {
    auto load_rest = [&](const float* at) { return LoadTail(d, at, rest); };
    step(full, load_rest, LoadTailF(d, k0 + full, rest), LoadTailF(d, k1 + full, rest),
         LoadTailF(d, k2 + full, rest), LoadTailF(d, k3 + full, rest));
  }
  auto put = [&](int r, hn::Vec<D4> sums) {
    float* HWY_RESTRICT at = s + r * s_stride;
    if (count == 4) {
      hn::StoreU(sums, d4, at);
      return;
    }
    HWY_ALIGN float tmp[4];
    hn::Store(sums, d4, tmp);
    for (int64_t x = 0; x < count; ++x) at[x] = tmp[x];
  };
  put(0, Reduce4(a0, a1, a2, a3));
  if constexpr (MR > 1) put(1, Reduce4(b0, b1, b2, b3));
  if constexpr (MR > 2) put(2, Reduce4(c0, c1, c2, c3));
  if constexpr (MR > 3) put(3, Reduce4(e0, e1, e2, e3));
}

// s[r][j] = q[r] . k[j] for the item's rows and keys [0, n), K rows read in
// place (as DotScores<false>).  Register tiles of up to kDecodeRows rows x
// 4 keys: each K vector loaded feeds every row of the tile, each q vector
// 4 keys, and one Reduce4 gives 4 scores of a row.  Keys go in address
// order, every kv head of the item per group of 4 keys.
template <typename T>
void DecodeScores(const float* HWY_RESTRICT q, int64_t q_stride, int64_t rows, int64_t per_head,
                  int64_t depth, const T* HWY_RESTRICT k, int64_t k_stride,
                  int64_t k_head_stride, int64_t n, float* HWY_RESTRICT s, int64_t s_stride) {
  const int64_t heads = rows / per_head;
  // The item's rows are one stretch of memory (one kv head of
  // [B, Hkv, Skv, D], or every kv head of [B, Skv, Hkv, D]): the 4 rows
  // kPrefetchRows ahead are one stretch to ask for too.  (Measured: without
  // software prefetch a long cache streams ~10% slower.)
  const bool contiguous = k_stride == (heads == 1 ? depth : heads * depth) &&
                          (heads == 1 || k_head_stride == depth);
  for (int64_t j = 0; j < n; j += 4) {
    const int64_t count = n - j < 4 ? n - j : 4;
    if (contiguous) {
      PrefetchRow(k + (j + kPrefetchRows) * k_stride, 4 * k_stride);
    } else {
      for (int64_t x = 0; x < 4; ++x) {
        PrefetchHeads(k + (j + x + kPrefetchRows) * k_stride, heads, k_head_stride, depth);
      }
    }
    for (int64_t g = 0; g < heads; ++g) {
      // Past the last key, the last key again (its scores are not stored).
      const T* HWY_RESTRICT k0 = k + j * k_stride + g * k_head_stride;
      const T* HWY_RESTRICT k1 = count > 1 ? k0 + k_stride : k0;
      const T* HWY_RESTRICT k2 = count > 2 ? k1 + k_stride : k1;
      const T* HWY_RESTRICT k3 = count > 3 ? k2 + k_stride : k2;
      int64_t r = g * per_head;
      const int64_t r_end = r + per_head;
      for (; r + kDecodeRows <= r_end; r += kDecodeRows) {
        ScoreTile<kDecodeRows>(q + r * q_stride, q_stride, depth, k0, k1, k2, k3, count,
                               s + r * s_stride + j, s_stride);
      }
      const float* qr = q + r * q_stride;
      float* sr = s + r * s_stride + j;
      switch (r_end - r) {
        case 3:
          ScoreTile<3>(qr, q_stride, depth, k0, k1, k2, k3, count, sr, s_stride);
          break;
        case 2:
          ScoreTile<2>(qr, q_stride, depth, k0, k1, k2, k3, count, sr, s_stride);
          break;
        case 1:
          ScoreTile<1>(qr, q_stride, depth, k0, k1, k2, k3, count, sr, s_stride);
          break;
        default:
          break;
      }
    }
  }
}
#endif  // fixed-width vectors

// o[r][0] += P[r] . v[0, n) for MR weight rows (p_stride apart) and one
// V^T row v, two key vectors at a time (2 x MR independent accumulators).
template <int MR, typename T>
HWY_INLINE void ValuesTile(const float* HWY_RESTRICT p, int64_t p_stride, int64_t n,
                           const T* HWY_RESTRICT v, float* HWY_RESTRICT o, int64_t o_stride) {
  static_assert(MR >= 1 && MR <= 4, "a decode tile has 1 to 4 rows");
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full2 = n / (2 * lanes) * (2 * lanes);
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t j = 0;
  for (; j < full2; j += 2 * lanes) {
    const VF x = LoadF(d, v + j);
    const VF y = LoadF(d, v + j + lanes);
    a0 = hn::MulAdd(hn::LoadU(d, p + j), x, a0);
    b0 = hn::MulAdd(hn::LoadU(d, p + j + lanes), y, b0);
    if constexpr (MR > 1) {
      a1 = hn::MulAdd(hn::LoadU(d, p + p_stride + j), x, a1);
      b1 = hn::MulAdd(hn::LoadU(d, p + p_stride + j + lanes), y, b1);
    }
    if constexpr (MR > 2) {
      a2 = hn::MulAdd(hn::LoadU(d, p + 2 * p_stride + j), x, a2);
      b2 = hn::MulAdd(hn::LoadU(d, p + 2 * p_stride + j + lanes), y, b2);
    }
    if constexpr (MR > 3) {
      a3 = hn::MulAdd(hn::LoadU(d, p + 3 * p_stride + j), x, a3);
      b3 = hn::MulAdd(hn::LoadU(d, p + 3 * p_stride + j + lanes), y, b3);
    }
  }
  for (; j < n; j += lanes) {
    const size_t cnt = static_cast<size_t>(n - j < lanes ? n - j : lanes);
    const VF x = LoadTailF(d, v + j, cnt);
    a0 = hn::MulAdd(LoadTail(d, p + j, cnt), x, a0);
    if constexpr (MR > 1) a1 = hn::MulAdd(LoadTail(d, p + p_stride + j, cnt), x, a1);
    if constexpr (MR > 2) a2 = hn::MulAdd(LoadTail(d, p + 2 * p_stride + j, cnt), x, a2);
    if constexpr (MR > 3) a3 = hn::MulAdd(LoadTail(d, p + 3 * p_stride + j, cnt), x, a3);
  }
  a0 = hn::Add(a0, b0);
  a1 = hn::Add(a1, b1);
  a2 = hn::Add(a2, b2);
  a3 = hn::Add(a3, b3);
#ifdef FUSEKIT_DECODE_REDUCE4
  HWY_ALIGN float sums[4];
  hn::Store(Reduce4(a0, a1, a2, a3), D4(), sums);
#else
  const float sums[4] = {hn::GetLane(hn::SumOfLanes(d, a0)), hn::GetLane(hn::SumOfLanes(d, a1)),
                         hn::GetLane(hn::SumOfLanes(d, a2)), hn::GetLane(hn::SumOfLanes(d, a3))};
#endif
  for (int x = 0; x < MR; ++x) o[x * o_stride] += sums[x];
}

// o[r][c] += P[r] . V^T[c][0, n) for the item's rows and value columns
// c < dv, V^T rows (n keys each, contiguous) read in place: the transposed
// [B, Hkv, Dv, Skv] layout's P.V.  Each V^T row of a kv head is read once
// and feeds up to 4 of its query rows per pass; one reduction per row and
// column per block of keys.
template <typename T>
void DecodeValuesT(const float* HWY_RESTRICT p, int64_t p_stride, int64_t rows,
                   int64_t per_head, int64_t n, const T* HWY_RESTRICT vt, int64_t vt_stride,
                   int64_t vt_head_stride, int64_t dv, float* HWY_RESTRICT o, int64_t o_stride) {
  const int64_t heads = rows / per_head;
  for (int64_t g = 0; g < heads; ++g) {
    const T* HWY_RESTRICT head = vt + g * vt_head_stride;
    for (int64_t c = 0; c < dv; ++c) {
      const T* HWY_RESTRICT v = head + c * vt_stride;
      // The V^T row kPrefetchRows columns ahead (each a stretch of its own).
      PrefetchRow(v + kPrefetchRows * vt_stride, n);
      int64_t r = g * per_head;
      const int64_t r_end = r + per_head;
      for (; r + 4 <= r_end; r += 4) {
        ValuesTile<4>(p + r * p_stride, p_stride, n, v, o + r * o_stride + c, o_stride);
      }
      const float* pr = p + r * p_stride;
      float* orow = o + r * o_stride + c;
      switch (r_end - r) {
        case 3:
          ValuesTile<3>(pr, p_stride, n, v, orow, o_stride);
          break;
        case 2:
          ValuesTile<2>(pr, p_stride, n, v, orow, o_stride);
          break;
        case 1:
          ValuesTile<1>(pr, p_stride, n, v, orow, o_stride);
          break;
        default:
          break;
      }
    }
  }
}

// o[r][0, dv) += sum_j p[r][j] * v[j][0, dv) with V rows read in place,
// each once, in address order: the decode step's P.V (row r reads the V of
// the item's head r / per_head, v_head_stride after head 0's; o rows are
// value_pad floats apart).
template <typename T>
void StreamPv(const float* HWY_RESTRICT p, int64_t p_stride, int64_t rows, int64_t per_head,
              int64_t n, const T* HWY_RESTRICT v, int64_t v_stride, int64_t v_head_stride,
              int64_t dv, float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < n; ++j) {
    const T* HWY_RESTRICT v_row = v + j * v_stride;
    PrefetchHeads(v_row + kPrefetchRows * v_stride, rows / per_head, v_head_stride, dv);
    for (int64_t r = 0; r < rows; ++r) {
      const T* HWY_RESTRICT vr = v_row + (r / per_head) * v_head_stride;
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
    const T* src = p.q + it.b * p.q_batch + query_of(r) * p.q_row + head_of(r) * p.q_head;
    ConvertRow(src, depth, p.scale, buf.q + r * depth);
    buf.max[r] = kNegInf;
    buf.sum[r] = 0.0f;
  }
  std::memset(buf.o, 0, sizeof(float) * rows * vpad);

  int64_t key_end = it.key_end;
  const int64_t last_query = it.query_begin + it.query_count - 1;
  if (p.causal && last_query + offset + 1 < key_end) key_end = last_query + offset + 1;
  const int64_t panel = l.panel;
  const int64_t v_row = p.v_row;
  const T* v_head = p.v + it.b * p.v_batch + it.kv_head * p.v_head;
  const int64_t k_row = p.k_row;
  const T* k_head = p.k + it.b * p.k_batch + it.kv_head * p.k_head;
  // Few rows per kv head: read K and V in place, once (see DotScores).
  // Otherwise the item has one kv head and packs its K blocks.
  const bool stream = per_head <= att::kStreamRows;

  // Blocks of equal size (257 keys: 129 + 128, not 256 + 1): a block's
  // fixed costs (a reduction per row and value column of V^T, the softmax
  // update) are paid for as many keys as possible.
  const int64_t span = key_end > it.key_begin ? key_end - it.key_begin : 0;
  const int64_t blocks = (span + att::kKeys - 1) / att::kKeys;
  const int64_t block = blocks > 0 ? (span + blocks - 1) / blocks : att::kKeys;
  for (int64_t j0 = it.key_begin; j0 < key_end; j0 += block) {
    const int64_t n = key_end - j0 < block ? key_end - j0 : block;
    if (stream) {
#ifdef FUSEKIT_DECODE_REDUCE4
      DecodeScores(buf.q, depth, rows, per_head, depth, k_head + j0 * k_row, k_row, p.k_head, n,
                   buf.s, att::kKeys);
#else
      DotScores<false>(buf.q, depth, rows, per_head, depth, k_head + j0 * k_row, k_row, p.k_head,
                       n, buf.s, att::kKeys);
#endif
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
    bool kept = false;  // any row keeps a key of the block
    for (int64_t r = 0; r < rows; ++r) {
      float* s = buf.s + r * att::kKeys;
      const int64_t i = query_of(r);
      if (p.softcap > 0.0f) SoftcapRow(s, n, p.softcap);
      MaskRow(p, it.b, head_of(r), i, j0, n, s);
      if (p.causal) {
        const int64_t first_dropped = i + offset + 1 - j0;
        for (int64_t c = first_dropped < 0 ? 0 : first_dropped; c < n; ++c) s[c] = kNegInf;
      }
      const float block_max = RowMax(s, n);
      kept = kept || block_max != kNegInf;
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
    // A block whose keys every row drops (a cache's unwritten tail) adds
    // nothing: its V is not read.
    if (!kept) continue;
    if (l.value_transposed) {
      // V^T rows in place: o[r][c] += P[r] . V^T[c][j0, j0 + n), each
      // block of a V^T row (n contiguous keys) read once per item and
      // dotted with the rows of its head (the weight rows stay in L1).
      DecodeValuesT(buf.s, att::kKeys, rows, per_head, n, v_head + j0, p.v_col, p.v_head, dv,
                    buf.o, vpad);
      continue;
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
          PrefetchHeads(next + j * v_row, it.kv_head_count, p.v_head, dv);
        }
        for (int64_t g = 0; g < it.kv_head_count; ++g) {
          const T* vg = v_head + (j0 + js) * v_row + g * p.v_head;
          for (int64_t c = 0; c < dv; c += panel) {
            PvRows<kMaxTile>(buf.s + g * per_head * att::kKeys + js, att::kKeys, m, vg + c,
                             v_row, buf.o + g * per_head * vpad + c, vpad, per_head);
          }
        }
      }
      continue;
    }
    if (stream) {
      StreamPv(buf.s, att::kKeys, rows, per_head, n, v_head + j0 * v_row, v_row, p.v_head, dv,
               buf.o, vpad);
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
    T* dst = p.out + it.b * p.o_batch + query_of(r) * p.o_row + head_of(r) * p.o_head;
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

#include "fusekit/simd_end.h"
