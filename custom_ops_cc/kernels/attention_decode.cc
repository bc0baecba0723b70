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
      if (p.softcap > 0.0f) SoftcapRow(s, n, p.softcap);
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

#include "fusekit/simd_end.h"
