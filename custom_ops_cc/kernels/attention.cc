// fusekit_attention: out = softmax(q @ k^T * scale + mask) @ v per head.
// Inputs: q [B, Sq, H, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv], all
// float32 or all float16, optional mask (float32 additive or bool keep)
// broadcastable to [B, H, Sq, Skv].  Attrs: causal (bool, bottom-right
// aligned), scale (float, absent: 1/sqrt(D)), softcap (float, absent or 0:
// none; else scores = softcap * tanh(scores / softcap), after the scale and
// before the mask).  Output [B, Sq, H, Dv] of q's dtype.  Query head h
// reads kv head h / (H / Hkv).
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
//
// Sources: this file has the schema, Prepare (checks and the plan), the
// dispatch of items to threads and the decode merge; attention_prefill.cc
// and attention_decode.cc the two paths; attention_microkernels-inl.h
// their shared register tiles, softmax pieces and scratch carving;
// attention_f16-inl.h the float16 loads and stores; attention_entry-inl.h
// the per-target entry points this file dispatches to.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
#define FUSEKIT_SIMD_MATH
#include "fusekit/simd_begin.h"
#include "kernels/attention_entry-inl.h"
#include "kernels/attention_f16-inl.h"
#include "kernels/attention_microkernels-inl.h"

int64_t AttentionPanel() { return PanelKeys(); }

// out[0, n) = row[0, n) * factor rounded to float16 (the decode merge).
void AttentionStoreHalf(const float* row, int64_t n, float factor, F16* out) {
  ConvertRow(row, n, factor, out);
}

#include "fusekit/simd_end.h"

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
  int64_t thread_floats = 0;   // one worker's buffers (att::ThreadFloats)
  int64_t partial_floats = 0;  // decode with splits: partial results
};

// The scratch of one Invoke: the decode splits' partial results, then each
// worker's buffers.
struct ScratchPlan {
  ScratchLayout layout;
  ScratchArray<float> partials;
  ScratchArray<float> worker;
  ScratchPlan(const Plan& plan, int threads)
      : partials(layout.Add<float>(plan.partial_floats)),
        worker(layout.Add<float>(plan.thread_floats, threads)) {}
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
        softcap_(static_cast<float>(attrs.Float("softcap"))),
        panel_(FUSEKIT_SIMD_CHOOSE(AttentionPanel)),
        item_(Storage<T>::Item()),
        queries_(Storage<T>::Queries()),
        store_half_(FUSEKIT_SIMD_CHOOSE(AttentionStoreHalf)) {
    if (!std::isfinite(scale_)) {
      *error = "attr 'scale' must be a finite number, got " + std::to_string(scale_);
    }
    if (!std::isfinite(softcap_) || softcap_ < 0.0f) {
      *error = "attr 'softcap' must be a finite number > 0 (0 or absent: no capping), got " +
               std::to_string(softcap_);
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
    const ScratchPlan scratch(plan_, ctx.num_threads());
    FUSEKIT_ENSURE(ctx, ctx.Scratch(scratch.layout) != nullptr,
                   "out of memory for %zu bytes of scratch", scratch.layout.bytes());
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
    const ScratchPlan mem(plan_, ctx.num_threads());
    void* scratch = ctx.Scratch(mem.layout);
    FUSEKIT_ENSURE(ctx, scratch != nullptr, "out of memory for %zu bytes of scratch",
                   mem.layout.bytes());
    return plan_.decode ? Decode(ctx, p, mem, scratch) : Prefill(ctx, p, mem, scratch);
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
    p.softcap = softcap_;
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
    plan.thread_floats = att::ThreadFloats(p, l);
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
        plan.partial_floats =
            p.batch * groups * plan.splits * plan.decode_heads * per_head * (l.value_pad + 2);
      }
    }
    return plan;
  }

  TfLiteStatus Prefill(OpContext& ctx, const Problem& p, const ScratchPlan& mem, void* scratch) {
    const att::Layout& l = plan_.layout;
    // Items of one panel of queries (2 vectors) of one head; consecutive
    // items share the head's K and V in cache.
    const int64_t width = l.panel;
    const int64_t blocks = (p.q_len + width - 1) / width;
    const int64_t items = p.batch * p.heads * blocks;
    // Causal items differ in cost; the pool hands out items dynamically.
    ctx.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int worker) {
      float* mine = mem.worker(scratch, worker);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t blk = t % blocks, bh = t / blocks;
        const int64_t i0 = blk * width;
        queries_(p, bh / p.heads, bh % p.heads, i0, std::min(width, p.q_len - i0), mine, l);
      }
    });
    return kTfLiteOk;
  }

  TfLiteStatus Decode(OpContext& ctx, const Problem& p, const ScratchPlan& mem, void* scratch) {
    const att::Layout& l = plan_.layout;
    const int64_t splits = plan_.splits;
    const int64_t per_head = p.group * p.q_len;  // rows of one kv head
    const int64_t group_heads = plan_.decode_heads;  // kv heads per item
    const int64_t groups = (p.kv_heads + group_heads - 1) / group_heads;
    const int64_t item_rows = group_heads * per_head;
    float* partials = mem.partials(scratch);
    const int64_t row_floats = l.value_pad + 2;
    const int64_t items = p.batch * groups * splits;
    ctx.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int worker) {
      float* mine = mem.worker(scratch, worker);
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
      float* row = mem.worker(scratch, worker);
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
  float softcap_;
  PanelFn panel_;
  typename Storage<T>::ItemFn item_;
  typename Storage<T>::QueriesFn queries_;
  void (*store_half_)(const float*, int64_t, float, hwy::float16_t*);
  Plan plan_;
};

}  // namespace

#define FUSEKIT_ATTENTION_OPERANDS \
  Inputs("q", "k", "v", "mask"), Outputs("out"), \
      AttrSchema(attr::Bool("causal", false), attr::Float("scale", 0.0), \
                 attr::Float("softcap", 0.0))
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
