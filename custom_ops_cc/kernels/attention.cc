// fusekit_attention: out = softmax(q @ k^T * scale + mask) @ v per head.
// Inputs: q [B, Sq, H, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv], all
// float32 or all float16, optional mask (float32 additive or bool keep)
// broadcastable to [B, H, Sq, Skv].  Attrs: causal (bool, bottom-right
// aligned), scale (float, absent: 1/sqrt(D)), softcap (float, absent or 0:
// none; else scores = softcap * tanh(scores / softcap), after the scale and
// before the mask), q_layout ("bshd", the default: q [B, Sq, H, D] and
// out [B, Sq, H, Dv]; "bhsd": q [B, H, Sq, D] and out [B, H, Sq, Dv]),
// k_layout ("bshd", the default: [B, Skv, Hkv, D];
// "bhsd": [B, Hkv, Skv, D]) and v_layout ("bshd", the default; "bhsd":
// [B, Hkv, Skv, Dv]; "bhds": [B, Hkv, Dv, Skv]), the layouts KV caches
// keep (litert-torch's Hugging Face exporter: K "bhsd", V "bhds"), read
// in place through strides.  q_slice, k_slice, v_slice (ints [axis, begin,
// size], absent: the whole input): the operand is that part of its input,
// read in place (one packed qkv tensor given as all three inputs: timm's
// [B, S, 3, H, D], with the axis dropped from a rank-5 input, or a fused
// grouped-query projection [B, S, H + 2 Hkv, D]).  q_shape, k_shape,
// v_shape (ints, absent or empty: the input's own dims): the input read as
// a tensor of these dims (row-major, the same number of elements; then
// sliced as above), so that a RESHAPE of a producer's result (a Linear's
// [N, 3 H D] rows as timm's [B, S, 3, H, D]) is no copy.  Output
// [B, Sq, H, Dv] of q's dtype, written row-major into an output tensor of
// dims out_shape when given (the same number of elements: the reshape a
// consumer wanted, for free).  mask_layout ("bhqk", the default: the mask
// broadcasts to [B, H, Sq, Skv]; "bhkq": to [B, H, Skv, Sq], its last two
// axes swapped, so that a bias differing per query is read a vector of
// queries at a time rather than gathered; the fusion stores a constant
// bias so).  Query head h reads kv head h / (H / Hkv).
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
// Prefill (AttentionQueries): an item is one head and 4 SIMD vectors of
// queries on AVX-512 (2 elsewhere; a head's last item only as many
// vectors as its queries fill), held transposed so that the vector lanes
// are queries.  Q.K^T broadcasts K elements (read in place) against
// Q^T, P.V broadcasts V elements (in place) against P^T, both
// register-tiled microkernels (6 x 4-vector tiles of accumulators on
// AVX-512; MR x 2 vectors elsewhere, MR = 8 with 32 vector registers, 6
// with 16), and the softmax runs down the key axis with vector max/add
// only.  Causal blocks above the diagonal are never computed, and a mask
// the same for every query (a padding mask) is read once per key, its
// fully dropped key blocks skipped.  Between query rows and query lanes
// (Q^T, a bias per query with its keys contiguous, the output) AVX-512 and
// AVX2 turn lanes x lanes tiles in registers; such a bias is laid into the
// scores before Q.K^T accumulates onto it.
//
// Decode (AttentionItem, Sq <= 4): an item is every query head of one kv
// head, so K and V stream from memory once, with software prefetch.  The
// scores are register tiles of 4 keys x up to 4 query rows (one lane
// reduction per 4 scores of a row, not one per score); a transposed V's
// rows are read once per tile of rows.  Long caches are split into at most
// kSplitKeys-key pieces of equal size whose partial results are merged
// afterwards in a fixed order.
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
#include <utility>

#include "kernels/attention.h"
#include "kernels/declared_dims.h"

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

// A K or V layout: which axis of the tensor holds the batch, the keys
// (sequence), the kv heads and the head's columns.
struct KvLayout {
  const char* name;
  int batch, seq, heads, depth;
  const char* dims;  // the axes in order, for errors
};
constexpr KvLayout kBshd{"bshd", 0, 1, 2, 3, "[batch, seq, kv_heads, head_dim]"};
constexpr KvLayout kBhsd{"bhsd", 0, 2, 1, 3, "[batch, kv_heads, seq, head_dim]"};
constexpr KvLayout kBhds{"bhds", 0, 3, 1, 2, "[batch, kv_heads, head_dim, seq]"};

// The layout named by attr `key` among `allowed` (absent: the first,
// "bshd"); sets *error otherwise.
template <size_t N>
KvLayout ParseLayout(const Attrs& attrs, const char* key, const KvLayout (&allowed)[N],
                     std::string* error) {
  if (!attrs.Has(key)) return allowed[0];
  const std::string name = attrs.String(key);
  std::string names;
  for (const KvLayout& layout : allowed) {
    if (name == layout.name) return layout;
    names += std::string(names.empty() ? "" : ", ") + "'" + layout.name + "' " + layout.dims;
  }
  *error = std::string("attr '") + key + "' must be one of " + names + ", got '" + name + "'";
  return allowed[0];
}

constexpr KvLayout kQLayouts[] = {
    {"bshd", 0, 1, 2, 3, "[batch, seq, heads, head_dim]"},
    {"bhsd", 0, 2, 1, 3, "[batch, heads, seq, head_dim]"}};
constexpr KvLayout kKLayouts[] = {kBshd, kBhsd};
constexpr KvLayout kVLayouts[] = {kBshd, kBhsd, kBhds};

// Element strides of a contiguous rank-4 tensor of dims `dim`.
inline void Strides(const int64_t (&dim)[4], int64_t (&stride)[4]) {
  stride[3] = 1;
  for (int i = 2; i >= 0; --i) stride[i] = stride[i + 1] * dim[i + 1];
}
inline void Strides(const Tensor& t, int64_t (&stride)[4]) {
  const int64_t dim[4] = {t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
  Strides(dim, stride);
}

// An operand read in place from part of its input (attrs q_slice, k_slice,
// v_slice = [axis, begin, size]; absent or empty: none): the elements [begin, begin + size) along
// `axis` of the input; a rank-5 input (q, k and v packed on an axis of their
// own, as timm's [B, S, 3, H, D]) loses that axis (size 1).  Absent: the
// whole rank-4 input.  The operand as a rank-4 tensor: its dims, its
// elements' strides in the input and the offset of its first element.
struct Slice {
  bool present = false;
  int64_t axis = 0, begin = 0, size = 0;
};
struct View {
  int64_t dim[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
  int64_t offset = 0;
  int dim_int(int i) const { return static_cast<int>(dim[i]); }
};

// The slice attr `key` ([axis, begin, size]); sets *error when malformed.
inline Slice ParseSlice(const Attrs& attrs, const char* key, std::string* error) {
  Slice s;
  if (!attrs.Has(key)) return s;
  const std::vector<int64_t> v = attrs.Ints(key);
  if (v.empty()) return s;  // (an empty list is no slice, as absent)
  if (v.size() != 3 || v[1] < 0 || v[2] < 1) {
    *error = std::string("attr '") + key +
             "' must be [axis, begin, size] with begin >= 0 and size >= 1";
    return s;
  }
  s.present = true;
  s.axis = v[0];
  s.begin = v[1];
  s.size = v[2];
  return s;
}

// The dims an input is read as: its shape attr, else its own; an empty
// string, or why the attr does not fit the input.
inline std::string InputDims(const Tensor& t, const std::vector<int64_t>& shape, const char* name,
                             std::vector<int64_t>* dims) {
  dims->clear();
  if (shape.empty()) {
    for (int i = 0; i < t.rank(); ++i) dims->push_back(t.dim(i));
    return "";
  }
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count != t.num_elements()) {
    return std::string(name) + "_shape holds " + std::to_string(count) + " elements, " + name +
           "'s input " + std::to_string(t.num_elements());
  }
  *dims = shape;
  return "";
}

// The operand `name` of an input of dims `dims` under slice `s`; an empty
// string, or why the input cannot hold it.
inline std::string MakeView(const std::vector<int64_t>& dims_in, const Slice& s, const char* name,
                            View* view) {
  const int rank = static_cast<int>(dims_in.size());
  struct {
    const std::vector<int64_t>& d;
    int64_t dim(int i) const { return d[static_cast<size_t>(i)]; }
  } t{dims_in};
  if (!s.present) {
    if (rank != 4) return "";  // (the caller's rank check names the layout)
    int64_t dims[4] = {t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
    for (int i = 0; i < 4; ++i) view->dim[i] = dims[i];
    Strides(dims, view->stride);
    view->offset = 0;
    return "";
  }
  const std::string attr = std::string(name) + "_slice";
  if (rank != 4 && rank != 5) {
    return "with " + attr + ", " + name + "'s input must have rank 4 or 5, got rank " +
           std::to_string(rank);
  }
  const int64_t axis = s.axis < 0 ? s.axis + rank : s.axis;
  if (axis < 0 || axis >= rank) {
    return attr + "'s axis " + std::to_string(s.axis) + " is out of range for " + name +
           "'s rank-" + std::to_string(rank) + " input";
  }
  const int64_t extent = t.dim(static_cast<int>(axis));
  if (s.begin + s.size > extent) {
    return attr + " [" + std::to_string(s.axis) + ", " + std::to_string(s.begin) + ", " +
           std::to_string(s.size) + "] reaches past " + name + "'s input axis " +
           std::to_string(axis) + " of size " + std::to_string(extent);
  }
  if (rank == 5 && s.size != 1) {
    return attr + "'s size must be 1 on a rank-5 input (the axis is dropped), got " +
           std::to_string(s.size);
  }
  if (rank == 5 && axis == 4) {
    return attr + " may not slice the last axis of a rank-5 input (the head's columns would "
           "not be contiguous)";
  }
  int64_t stride[5];
  stride[rank - 1] = 1;
  for (int i = rank - 2; i >= 0; --i) stride[i] = stride[i + 1] * t.dim(i + 1);
  view->offset = s.begin * stride[axis];
  for (int i = 0, o = 0; i < rank; ++i) {
    if (rank == 5 && i == axis) continue;
    view->dim[o] = i == axis ? s.size : t.dim(i);
    view->stride[o] = stride[i];
    ++o;
  }
  return "";
}

// Attr mask_layout: true for "bhkq" (keys before queries), false for
// "bhqk" or absent; sets *error otherwise.
inline bool ParseMaskLayout(const Attrs& attrs, std::string* error) {
  if (!attrs.Has("mask_layout")) return false;
  const std::string name = attrs.String("mask_layout");
  if (name.empty() || name == "bhqk") return false;
  if (name == "bhkq") return true;
  *error = "attr 'mask_layout' must be 'bhqk' [B, H, Sq, Skv] or 'bhkq' [B, H, Skv, Sq], got '" +
           name + "'";
  return false;
}

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
        q_layout_(ParseLayout(attrs, "q_layout", kQLayouts, error)),
        k_layout_(ParseLayout(attrs, "k_layout", kKLayouts, error)),
        v_layout_(ParseLayout(attrs, "v_layout", kVLayouts, error)),
        q_slice_(ParseSlice(attrs, "q_slice", error)),
        k_slice_(ParseSlice(attrs, "k_slice", error)),
        v_slice_(ParseSlice(attrs, "v_slice", error)),
        q_shape_(ParseDeclaredDims(attrs, "q_shape", error)),
        k_shape_(ParseDeclaredDims(attrs, "k_shape", error)),
        v_shape_(ParseDeclaredDims(attrs, "v_shape", error)),
        out_shape_(ParseDeclaredDims(attrs, "out_shape", error)),
        mask_keys_major_(ParseMaskLayout(attrs, error)),
        panel_(FUSEKIT_SIMD_CHOOSE(AttentionPanel)),
        query_panel_(FUSEKIT_SIMD_CHOOSE(AttentionQueryPanel)),
        item_(Storage<T>::Item()),
        queries_(Storage<T>::Queries()),
        store_half_(FUSEKIT_SIMD_CHOOSE(AttentionStoreHalf)) {
    // (The SDK refuses a scale or softcap that is not finite, or a negative
    // softcap; an absent softcap reads 0: no capping.)
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
    const KvLayout& ql = q_layout_;
    View qv, kv, vv;
    int ranks[3] = {0, 0, 0};
    const std::string why = MakeViews(q, k, v, &qv, &kv, &vv, ranks);
    FUSEKIT_ENSURE(ctx, why.empty(), "%s", why.c_str());
    FUSEKIT_ENSURE(ctx, q_slice_.present || ranks[0] == 4, "q must have rank 4 %s%s, got rank %d",
                   ql.dims, std::string(ql.name) == "bshd" ? "" : " (q_layout 'bhsd')", ranks[0]);
    const int q_len = qv.dim_int(ql.seq), heads = qv.dim_int(ql.heads);
    const int depth = qv.dim_int(ql.depth);
    const KvLayout& kl = k_layout_;
    const KvLayout& vl = v_layout_;
    FUSEKIT_ENSURE(ctx, k_slice_.present || ranks[1] == 4,
                   "k must have rank 4 %s (k_layout '%s'), got rank %d", kl.dims, kl.name,
                   ranks[1]);
    FUSEKIT_ENSURE(ctx, v_slice_.present || ranks[2] == 4,
                   "v must have rank 4 %s (v_layout '%s'), got rank %d", vl.dims, vl.name,
                   ranks[2]);
    // The layouts' names in the errors below: a k or v of another layout
    // than declared fails one of these checks.
    const int kv_len = kv.dim_int(kl.seq), kv_heads = kv.dim_int(kl.heads);
    FUSEKIT_ENSURE(ctx,
                   kv.dim_int(kl.batch) == qv.dim_int(0) && vv.dim_int(vl.batch) == qv.dim_int(0),
                   "q, k and v must have one batch size, got %d, %d and %d", qv.dim_int(0),
                   kv.dim_int(kl.batch), vv.dim_int(vl.batch));
    FUSEKIT_ENSURE(ctx, kv.dim_int(kl.depth) == depth,
                   "k's head_dim (%d) must equal q's (%d) (k is %s: k_layout '%s')",
                   kv.dim_int(kl.depth), depth, kl.dims, kl.name);
    FUSEKIT_ENSURE(ctx, depth >= 1, "head_dim must be >= 1, got %d", depth);
    FUSEKIT_ENSURE(ctx, vv.dim_int(vl.seq) == kv_len,
                   "k and v must have one sequence length, got %d and %d (k is %s: k_layout "
                   "'%s'; v is %s: v_layout '%s')",
                   kv_len, vv.dim_int(vl.seq), kl.dims, kl.name, vl.dims, vl.name);
    FUSEKIT_ENSURE(ctx, vv.dim_int(vl.heads) == kv_heads,
                   "k and v must have one number of heads, got %d and %d (k is %s: k_layout "
                   "'%s'; v is %s: v_layout '%s')",
                   kv_heads, vv.dim_int(vl.heads), kl.dims, kl.name, vl.dims, vl.name);
    FUSEKIT_ENSURE(ctx, kv_heads >= 1 && heads % kv_heads == 0,
                   "q's heads (%d) must be a multiple of k's and v's heads (%d) (k is %s: "
                   "k_layout '%s')",
                   heads, kv_heads, kl.dims, kl.name);
    if (mask.present()) {
      FUSEKIT_ENSURE(ctx, mask.rank() <= 4,
                     "mask must have rank <= 4 (broadcastable to [B, H, Sq, Skv]), got rank %d",
                     mask.rank());
      // The scores' dims in the mask's axis order.
      int scores[4] = {qv.dim_int(0), heads, q_len, kv_len};
      if (mask_keys_major_) std::swap(scores[2], scores[3]);
      for (int i = 0; i < mask.rank(); ++i) {
        const int want = scores[4 - mask.rank() + i];
        const int got = mask.dim(i);
        FUSEKIT_ENSURE(ctx, got == 1 || got == want,
                       "mask dim %d is %d, must be 1 or %d to broadcast to the scores "
                       "%s = [%d, %d, %d, %d]",
                       i, got, want, mask_keys_major_ ? "[B, H, Skv, Sq]" : "[B, H, Sq, Skv]",
                       scores[0], scores[1], scores[2], scores[3]);
      }
    }
    const Problem p = Describe(q, k, v, mask, out);
    plan_ = MakePlan(p);
    // Reserve the scratch now rather than in the first Invoke.
    const ScratchPlan scratch(plan_, ctx.num_threads());
    FUSEKIT_ENSURE(ctx, ctx.Scratch(scratch.layout) != nullptr,
                   "out of memory for %zu bytes of scratch", scratch.layout.bytes());
    // out has q's layout.
    int out_dims[4] = {qv.dim_int(0), qv.dim_int(1), qv.dim_int(2), qv.dim_int(3)};
    out_dims[ql.depth] = vv.dim_int(vl.depth);
    return ResizeDeclared(ctx, out, {out_dims[0], out_dims[1], out_dims[2], out_dims[3]},
                          out_shape_, "out_shape");
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
  // The three operands' views of their inputs (q_slice, k_slice, v_slice);
  // an empty string, or why an input cannot hold its operand.
  // ranks (optional): the three inputs' ranks as read (their shape attrs).
  std::string MakeViews(const In<T>& q, const In<T>& k, const In<T>& v, View* qv, View* kv,
                        View* vv, int* ranks = nullptr) const {
    std::vector<int64_t> qd, kd, vd;
    std::string why = InputDims(q, q_shape_, "q", &qd);
    if (why.empty()) why = InputDims(k, k_shape_, "k", &kd);
    if (why.empty()) why = InputDims(v, v_shape_, "v", &vd);
    if (why.empty()) why = MakeView(qd, q_slice_, "q", qv);
    if (why.empty()) why = MakeView(kd, k_slice_, "k", kv);
    if (why.empty()) why = MakeView(vd, v_slice_, "v", vv);
    if (ranks != nullptr) {
      ranks[0] = static_cast<int>(qd.size());
      ranks[1] = static_cast<int>(kd.size());
      ranks[2] = static_cast<int>(vd.size());
    }
    return why.empty() ? why : "fusekit_attention: " + why;
  }

  Problem Describe(const In<T>& q, const In<T>& k, const In<T>& v, const Opt<MaskT>& mask,
                   const Out<T>& out) const {
    Problem p{};
    View qv, kv, vv;
    MakeViews(q, k, v, &qv, &kv, &vv);  // (checked in Prepare)
    p.batch = qv.dim[0];
    p.q_len = qv.dim[q_layout_.seq];
    p.heads = qv.dim[q_layout_.heads];
    p.depth = qv.dim[q_layout_.depth];
    p.kv_len = kv.dim[k_layout_.seq];
    p.kv_heads = kv.dim[k_layout_.heads];
    p.value_depth = vv.dim[v_layout_.depth];
    const int64_t* qs = qv.stride;
    const int64_t* ks = kv.stride;
    const int64_t* vs = vv.stride;
    int64_t os[4];
    // out: q's layout with Dv columns, contiguous.
    int64_t out_dims[4] = {qv.dim[0], qv.dim[1], qv.dim[2], qv.dim[3]};
    out_dims[q_layout_.depth] = p.value_depth;
    Strides(out_dims, os);
    p.q_batch = qs[0];
    p.q_row = qs[q_layout_.seq];
    p.q_head = qs[q_layout_.heads];
    p.o_batch = os[0];
    p.o_row = os[q_layout_.seq];
    p.o_head = os[q_layout_.heads];
    p.k_batch = ks[k_layout_.batch];
    p.k_row = ks[k_layout_.seq];
    p.k_head = ks[k_layout_.heads];
    p.v_batch = vs[v_layout_.batch];
    p.v_row = vs[v_layout_.seq];
    p.v_head = vs[v_layout_.heads];
    p.v_col = vs[v_layout_.depth];
    p.group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;
    p.scale = has_scale_ ? scale_ : static_cast<float>(1.0 / std::sqrt(double(p.depth)));
    p.softcap = softcap_;
    p.causal = causal_;
    p.q = reinterpret_cast<const S*>(q.data()) + qv.offset;
    p.k = reinterpret_cast<const S*>(k.data()) + kv.offset;
    p.v = reinterpret_cast<const S*>(v.data()) + vv.offset;
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
      // Key-major: memory axis 2 is the keys', 3 the queries'.
      if (mask_keys_major_) std::swap(p.mask_stride[2], p.mask_stride[3]);
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
    l.query_panel = query_panel_();
    l.value_pad = att::RoundUp(std::max<int64_t>(p.value_depth, 1), l.panel);
    l.value_transposed = p.v_col != 1;
    plan.decode = p.q_len <= kDecodeQueries && p.group * p.q_len <= att::kRows;
    // The decode path's packed kernels (more than kStreamRows rows) read V
    // in place when Dv fills whole 2-vector chunks, else a padded copy.
    l.value_direct = plan.decode && p.value_depth % l.panel == 0;
    plan.thread_floats = att::ThreadFloats(p, l);
    if (plan.decode) {
      plan.splits = std::max<int64_t>(1, (p.kv_len + att::kSplitKeys - 1) / att::kSplitKeys);
      // Streamed items take as many kv heads as their rows allow when a
      // key's rows of consecutive kv heads are one stretch of memory (the
      // [B, Skv, Hkv, D] layouts).  In the cache layouts each kv head is a
      // stream (or, V transposed, Dv streams) of its own: an item of one
      // kv head keeps fewer streams in flight (measured 3.3x faster at
      // Skv 4096 with V transposed, whose rows 16 KiB apart alias in the
      // caches).
      const int64_t per_head = p.group * p.q_len;
      const bool heads_adjacent = p.k_head == p.depth && p.v_head == p.value_depth;
      // No query rows (Sq = 0) is an empty output: nothing to share out.
      if (per_head > 0 && per_head <= att::kStreamRows && heads_adjacent) {
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

  TfLiteStatus Prefill(OpContext& ctx, const Problem& full, const ScratchPlan& mem,
                       void* scratch) {
    const att::Layout& l = plan_.layout;
    // Keys past the last one any row keeps (a prefill into a longer cache:
    // 128 tokens of 512) weigh exactly 0 in every row and are not read.
    // Causal rows see keys up to i + Skv - Sq: their offset needs all of Skv.
    Problem p = full;
    if (!p.causal) p.kv_len = LiveKeys(full);
    // Items of at most one panel of queries (2 or 4 vectors) of one head;
    // consecutive items share the head's K and V in cache.  A head's
    // vectors of queries are dealt out evenly over its items (ViT's 197
    // queries, 13 vectors of 16: 4 + 3 + 3 + 3, not 4 + 4 + 4 + 1): an
    // item of one vector broadcasts each K and V element for a single FMA
    // and costs 1.5x a 4-vector item per query lane.
    const int64_t lanes = l.panel / 2;  // (a K panel is 2 vectors)
    const int64_t vectors = (p.q_len + lanes - 1) / lanes;
    const int64_t max_vectors = l.query_panel / lanes;
    if (vectors == 0) return kTfLiteOk;
    const int64_t blocks = (vectors + max_vectors - 1) / max_vectors;
    const int64_t per_block = vectors / blocks, wider = vectors % blocks;
    const int64_t items = p.batch * p.heads * blocks;
    // Causal items differ in cost; the pool hands out items dynamically.
    ctx.ParallelFor(items, 1, [&](int64_t begin, int64_t end, int worker) {
      float* mine = mem.worker(scratch, worker);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t blk = t % blocks, bh = t / blocks;
        // The first `wider` items take one vector more.
        const int64_t v0 = blk * per_block + std::min(blk, wider);
        const int64_t nv = per_block + (blk < wider ? 1 : 0);
        const int64_t i0 = v0 * lanes;
        queries_(p, bh / p.heads, bh % p.heads, i0, std::min(nv * lanes, p.q_len - i0), mine,
                 l);
      }
    });
    return kTfLiteOk;
  }

  // Mask values at or below this drop a key: exp(score + mask - row max)
  // is exactly 0 in float32 for every score within 9,800 of the row's
  // largest kept score (litert-torch fills masks with -1e4 or lower,
  // runtimes with -1e9, -FLT_MAX or -inf).
  static constexpr float kDroppedMask = -1.0e4f;

  // One past the last key that some query row of the mask keeps; kv_len
  // without a per-key mask, or when a row keeps no key at all (such a row's
  // result is defined over every key: left to the kernel as it is).
  static int64_t LiveKeys(const Problem& p) {
    const int64_t* st = p.mask_stride;
    if (st[3] == 0 || (p.mask_add == nullptr && p.mask_keep == nullptr)) return p.kv_len;
    const int64_t nb = st[0] ? p.batch : 1, nh = st[1] ? p.heads : 1, nq = st[2] ? p.q_len : 1;
    int64_t live = 0;
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t row = b * st[0] + h * st[1] + i * st[2];
          int64_t j = p.kv_len;
          if (p.mask_add != nullptr) {
            // (NaN compares false: kept.)
            while (j > live && p.mask_add[row + (j - 1) * st[3]] <= kDroppedMask) --j;
          } else {
            while (j > live && p.mask_keep[row + (j - 1) * st[3]] == 0) --j;
          }
          if (j == live && !RowKeepsBefore(p, row, live)) return p.kv_len;
          live = std::max(live, j);
          if (live == p.kv_len) return live;  // (no row can change it now)
        }
      }
    }
    return live;
  }

  // Whether the mask row keeps any of keys [0, end).
  static bool RowKeepsBefore(const Problem& p, int64_t row, int64_t end) {
    const int64_t s = p.mask_stride[3];
    for (int64_t j = 0; j < end; ++j) {
      if (p.mask_add != nullptr ? !(p.mask_add[row + j * s] <= kDroppedMask)
                                : p.mask_keep[row + j * s] != 0) {
        return true;
      }
    }
    return false;
  }

  TfLiteStatus Decode(OpContext& ctx, const Problem& p, const ScratchPlan& mem, void* scratch) {
    const att::Layout& l = plan_.layout;
    // Keys past the last one any row keeps (a cache's unfilled tail) are
    // neither read nor split over: a step's cost follows the filled length,
    // not the allocated one.  (At most plan_.splits: the scratch fits.)
    const int64_t live = LiveKeys(p);
    const int64_t splits = std::max<int64_t>(1, (live + att::kSplitKeys - 1) / att::kSplitKeys);
    // The live keys shared evenly between the splits (513 keys: 257 + 256,
    // not 512 + 1), so that threads taking splits get equal work.
    const int64_t split_keys = (live + splits - 1) / splits;
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
        it.key_begin = std::min(live, split * split_keys);
        it.key_end = std::min(live, it.key_begin + split_keys);
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
        S* out = p.out + b * p.o_batch + i * p.o_row + h * p.o_head;
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
  KvLayout q_layout_;
  KvLayout k_layout_;
  KvLayout v_layout_;
  Slice q_slice_;
  Slice k_slice_;
  Slice v_slice_;
  std::vector<int64_t> q_shape_;
  std::vector<int64_t> k_shape_;
  std::vector<int64_t> v_shape_;
  std::vector<int64_t> out_shape_;
  bool mask_keys_major_;  // mask_layout 'bhkq'
  PanelFn panel_;
  PanelFn query_panel_;
  typename Storage<T>::ItemFn item_;
  typename Storage<T>::QueriesFn queries_;
  void (*store_half_)(const float*, int64_t, float, hwy::float16_t*);
  Plan plan_;
};

}  // namespace

#define FUSEKIT_ATTENTION_OPERANDS \
  Inputs("q", "k", "v", "mask"), Outputs("out"), \
      AttrSchema(attr::Bool("causal", false), attr::Float("scale"),    \
                 attr::Float("softcap").Min(0), attr::String("q_layout"),          \
                 attr::String("k_layout"), attr::String("v_layout"),          \
                 attr::Ints("q_slice"), attr::Ints("k_slice"), attr::Ints("v_slice"), \
                 attr::Ints("q_shape"), attr::Ints("k_shape"), attr::Ints("v_shape"), \
                 attr::Ints("out_shape"), attr::String("mask_layout"))
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
