// Shared between fusekit_attention's per-SIMD-target code
// (attention_decode.cc, attention_prefill.cc, compiled once per target) and
// its kernel class (attention.cc, compiled once): the problem description,
// the work items and the scratch layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusekit {
namespace attention {

// Query rows per work item and keys per block of the online softmax.  A
// block's scores (kRows x kKeys floats, 32 KiB) and its K panels stay in
// L1/L2 while the two matmuls and the softmax pass over them.
constexpr int64_t kRows = 64;
constexpr int64_t kKeys = 256;
// Keys per split of a decode step (few query rows against a long cache):
// each split is an item of its own and the splits' partial softmax results
// are merged afterwards, in a fixed order (so the result does not depend on
// the thread count).
constexpr int64_t kSplitKeys = 512;
// Items with at most this many rows and no packed K read K and V in place
// (dot products per key) instead of packing them per block.
constexpr int64_t kStreamRows = 16;

// One attention problem, shapes as in the op: q [B, Sq, H, D],
// out [B, Sq, H, Dv] (or both [B, H, Sq, *]: q_layout), k and v in their
// layouts (k_layout, v_layout), all read through element strides: row i of
// head h of batch b of q starts at q[b * q_batch + i * q_row + h * q_head]
// (out: o_batch, o_row, o_head); K element (b, j, h, c) of batch b, key j, kv
// head h, column c is k[b * k_batch + j * k_row + h * k_head + c] (the
// depth axis is contiguous in every K layout), V element (b, j, h, c) is
// v[b * v_batch + j * v_row + h * v_head + c * v_col] (v_col is 1 except
// in the transposed [B, Hkv, Dv, Skv] layout, where v_row is 1).  T is
// the storage type of q, k, v and out (float, or Highway's float16_t:
// loads promote to float32 and stores demote, all arithmetic is float32);
// the additive mask is float32 whatever T is.
template <typename T>
struct Problem {
  int64_t batch, q_len, kv_len, heads, kv_heads, depth, value_depth;
  int64_t group;  // heads / kv_heads
  float scale;
  // > 0: scores = softcap * tanh(scores / softcap), after the scale and
  // before the mask (Gemma 2's logit soft-capping); 0: none.
  float softcap;
  bool causal;
  const T* q;
  const T* k;
  const T* v;
  T* out;
  int64_t q_batch, q_row, q_head;
  int64_t o_batch, o_row, o_head;
  int64_t k_batch, k_row, k_head;
  int64_t v_batch, v_row, v_head, v_col;
  // Mask broadcast to [B, H, Sq, Skv] by strides (0 on a broadcast dim):
  // at most one of the two pointers is set.
  const float* mask_add;
  const uint8_t* mask_keep;
  int64_t mask_stride[4];
};

// Packed layouts (per target: panel = 2 SIMD vectors of keys).
struct Layout {
  int64_t panel;        // keys per K panel
  int64_t query_panel;  // most queries of a prefill item (2 or 4 SIMD vectors)
  bool value_transposed;  // V is [B, Hkv, Dv, Skv] (v_col != 1)
  int64_t value_pad;    // Dv rounded up to a whole number of 2-vector chunks
  bool value_direct;    // V is read in place (Dv is already whole chunks)
};

// Rows of one decode item: for each kv head of kv_head.. (kv_head_count of
// batch b), query heads group_begin.. (group_count, relative to the kv
// head) times queries query_begin.. (query_count).  With per_head =
// group_count * query_count, row r is kv head kv_head + r / per_head, query
// head (that kv head) * group + group_begin + (r % per_head) / query_count,
// query query_begin + r % per_head % query_count.  Keys [key_begin, key_end).
struct Item {
  int64_t b, kv_head;
  int64_t kv_head_count;  // kv heads kv_head.. (decode items may take several)
  int64_t group_begin, group_count;
  int64_t query_begin, query_count;
  int64_t key_begin, key_end;
};

// Where an item's result goes: the output rows (normalized), or partial
// results (row max, row sum, unnormalized rows) merged later.
struct Partial {
  float* max;   // [rows]
  float* sum;   // [rows]
  float* rows;  // [rows][value_pad]
};

// Per-thread working memory in floats (see Buffers in
// attention_microkernels-inl.h).
inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
// A prefill item holds Q^T and O^T one query panel (2 or 4 vectors) wide:
// with 2048-bit SVE vectors (2 of them) that is 128 queries, more than kRows.
template <typename T>
inline int64_t QueryFloats(const Problem<T>& p, const Layout& l) {
  return RoundUp(Max(Max(kRows, l.panel), l.query_panel) * p.depth, 16);
}
inline int64_t OutFloats(const Layout& l) {
  return Max(Max(kRows, l.panel), l.query_panel) * l.value_pad;
}
// A decode block's K panels: kKeys keys rounded up to whole panels.
template <typename T>
inline int64_t KBlockFloats(const Problem<T>& p, const Layout& l) {
  return RoundUp(p.depth * RoundUp(kKeys, l.panel), 16);
}
// (A float16 prefill converts its K and V blocks into kblock and vblock.)
template <typename T>
inline int64_t ThreadFloats(const Problem<T>& p, const Layout& l) {
  return QueryFloats(p, l) + kRows * kKeys + OutFloats(l) + 2 * kRows + KBlockFloats(p, l) +
         kKeys * l.value_pad + 64;
}

}  // namespace attention
}  // namespace fusekit
