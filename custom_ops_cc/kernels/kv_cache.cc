// fusekit_kv_cache_update: a DYNAMIC_UPDATE_SLICE of one block of a KV cache
// that writes only the new rows, with the cache updated in place.
//
// fusekit_kv_cache_update(cache, update, start) -> (updated_cache, block)
//   attrs: offset (elements), block_shape (ints), view_shape (ints,
//   optional: the shape the block output has, same element count; a
//   reshape of the block folded into the op, so its readers read the
//   cache in place rather than a reshaped copy).
//   block = the block_shape-shaped, row-major run of cache's elements
//   starting at element `offset` (e.g. cache[0, layer, 0] of a keras-hub
//   cache [1, layers, 2, L, kv_heads, head_dim]); block' =
//   DYNAMIC_UPDATE_SLICE(block, update, start) (start clamped to
//   [0, block_dim - update_dim] per axis, as that op does);
//   updated_cache = cache with block replaced by block'; block = block'.
//
// On the interpreters (delegate and op-resolver paths) both outputs are
// views of the cache input's memory (OpContext::AliasOutput): the kernel
// writes the update's rows into the cache input's buffer and nothing else,
// so a decode step moves a few KB instead of copying the cache.  The cache
// INPUT is therefore changed by the op: a model may use it only where
// nothing reads that tensor after the op except through its outputs (what
// fusekit's kv_cache_in_place pass proves before it inserts the op).  Where
// outputs are buffers of their own (LiteRT's CompiledModel) the op copies
// the cache to updated_cache and the block to block, which is the same
// result computed functionally.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace fusekit {
namespace {

template <typename T, typename P>
class KvCacheUpdate {
 public:
  KvCacheUpdate(const Attrs& attrs, std::string* error) {
    const int64_t offset = attrs.Int("offset");
    if (offset < 0) {
      *error = "attr 'offset' must be >= 0, got " + std::to_string(offset);
      return;
    }
    offset_ = offset;
    const std::vector<int64_t> shape = attrs.Ints("block_shape");
    if (shape.empty()) {
      *error = "attr 'block_shape' must list at least one dimension";
      return;
    }
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0 || d > INT32_MAX || __builtin_mul_overflow(n, d, &n)) {
        *error = "attr 'block_shape' has a negative or too large dimension";
        return;
      }
      block_shape_.push_back(static_cast<int>(d));
    }
    block_elements_ = n;
    view_shape_ = block_shape_;
    if (attrs.Has("view_shape")) {
      const std::vector<int64_t> view = attrs.Ints("view_shape");
      int64_t m = 1;
      view_shape_.clear();
      for (int64_t d : view) {
        if (d < 0 || d > INT32_MAX || __builtin_mul_overflow(m, d, &m)) {
          *error = "attr 'view_shape' has a negative or too large dimension";
          return;
        }
        view_shape_.push_back(static_cast<int>(d));
      }
      if (m != n) {
        *error = "attr 'view_shape' has " + std::to_string(m) +
                 " elements, block_shape " + std::to_string(n);
        return;
      }
    }
  }

  TfLiteStatus Prepare(OpContext& ctx, In<T> cache, In<T> update, In<P> start,
                       Out<T> updated_cache, Out<T> block) {
    const int rank = static_cast<int>(block_shape_.size());
    FUSEKIT_ENSURE_EQ(ctx, update.rank(), rank, "update must have block_shape's rank");
    for (int d = 0; d < rank; ++d) {
      FUSEKIT_ENSURE_LE(ctx, update.dim(d), block_shape_[d],
                        "update dim %d must fit in the block", d);
    }
    FUSEKIT_ENSURE(ctx, start.rank() == 1 && start.dim(0) == rank,
                   "start must be [%d] (one index per block axis), got rank %d with %d "
                   "indices",
                   rank, start.rank(), start.dim(0));
    // (Written without offset_ + block_elements_: a fuzzed offset near
    // INT64_MAX would overflow it.)
    FUSEKIT_ENSURE(ctx,
                   block_elements_ <= cache.num_elements() &&
                       offset_ <= cache.num_elements() - block_elements_,
                   "the block (offset %lld, %lld elements) does not fit in the cache of "
                   "%lld elements",
                   static_cast<long long>(offset_), static_cast<long long>(block_elements_),
                   static_cast<long long>(cache.num_elements()));
    FUSEKIT_ENSURE_OK(ctx.ResizeOutput(updated_cache, cache.shape()));
    FUSEKIT_ENSURE_OK(ctx.ResizeOutput(block, view_shape_));
    ctx.AliasOutput(updated_cache, cache, 0);
    ctx.AliasOutput(block, cache, static_cast<size_t>(offset_) * sizeof(T));
    return kTfLiteOk;
  }

  TfLiteStatus Invoke(OpContext& ctx, In<T> cache, In<T> update, In<P> start,
                      Out<T> updated_cache, Out<T> block) {
    (void)ctx;
    T* out = updated_cache.data();
    if (out != cache.data()) {
      // Outputs of their own: the functional result.
      std::memmove(out, cache.data(), sizeof(T) * static_cast<size_t>(cache.num_elements()));
    }
    T* target = out + offset_;
    WriteRows(update, start, target);
    if (block.data() != target) {
      std::memmove(block.data(), target, sizeof(T) * static_cast<size_t>(block_elements_));
    }
    return kTfLiteOk;
  }

 private:
  // DYNAMIC_UPDATE_SLICE of the update into the block at `target`, one
  // memcpy per contiguous run.
  void WriteRows(const In<T>& update, const In<P>& start, T* target) const {
    const int rank = static_cast<int>(block_shape_.size());
    if (update.num_elements() == 0) return;
    std::vector<int64_t> begin(rank);
    for (int d = 0; d < rank; ++d) {
      const int64_t hi = int64_t{block_shape_[d]} - update.dim(d);
      begin[d] = std::clamp<int64_t>(static_cast<int64_t>(start.data()[d]), 0, hi);
    }
    // The trailing axes the update covers whole join the innermost run.
    int inner = rank - 1;
    while (inner > 0 && update.dim(inner) == block_shape_[inner]) --inner;
    int64_t run = 1;
    for (int d = inner; d < rank; ++d) run *= update.dim(d);
    std::vector<int64_t> stride(rank, 1);
    for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * block_shape_[d + 1];
    int64_t base = 0;
    for (int d = 0; d < rank; ++d) base += begin[d] * stride[d];
    const T* source = update.data();
    std::vector<int> index(inner, 0);
    const int64_t runs = update.num_elements() / run;
    for (int64_t r = 0; r < runs; ++r) {
      int64_t at = base;
      for (int d = 0; d < inner; ++d) at += index[d] * stride[d];
      // memmove: a malformed graph may feed a view of the cache as update.
      std::memmove(target + at, source + r * run, sizeof(T) * static_cast<size_t>(run));
      for (int d = inner - 1; d >= 0; --d) {
        if (++index[d] < update.dim(d)) break;
        index[d] = 0;
      }
    }
  }

  int64_t offset_ = 0;
  std::vector<int> block_shape_;
  std::vector<int> view_shape_;
  int64_t block_elements_ = 0;
};

}  // namespace

// Aliases: a template argument list would split the macro's arguments.
using KvCacheF32I32 = KvCacheUpdate<float, int32_t>;
using KvCacheF32I64 = KvCacheUpdate<float, int64_t>;
using KvCacheF16I32 = KvCacheUpdate<Half, int32_t>;
using KvCacheF16I64 = KvCacheUpdate<Half, int64_t>;

#define FUSEKIT_KV_CACHE_UPDATE(Class)                                                \
  FUSEKIT_REGISTER_KERNEL("fusekit_kv_cache_update", Class,                           \
                          Inputs("cache", "update", "start"),                         \
                          Outputs("updated_cache", "block"),                          \
                          AttrSchema(attr::Required(attr::Int("offset", 0)),          \
                                     attr::Required(attr::Ints("block_shape")),   \
                                     attr::Ints("view_shape")))
FUSEKIT_KV_CACHE_UPDATE(KvCacheF32I32);
FUSEKIT_KV_CACHE_UPDATE(KvCacheF32I64);
FUSEKIT_KV_CACHE_UPDATE(KvCacheF16I32);
FUSEKIT_KV_CACHE_UPDATE(KvCacheF16I64);

}  // namespace fusekit
