// TensorFlow Lite's GenAI custom ops, so models written for them run with
// fusekit's kernels alone (no GenAIOpsRegisterer needed):
//
// odml.update_external_kv_cache(k_cache, v_cache, position, k_slice, v_slice)
//     -> (k_cache', v_cache'): caches [1, L, Hkv, D] float32, position [S]
//     int32 (or int64, as TensorFlow's older releases declared it), slices
//     [1, S, Hkv, D].  The caches are copied to the outputs (unless the
//     runtime gave them one buffer), then slice row i is written at row
//     position[i], for i in order until a position smaller than the one
//     before (what the runtime's own kernel does: a smaller value ends the
//     valid positions).  A position outside [0, L) is an error here.
//
// odml.scaled_dot_product_attention(q, k, v, mask) -> out: q [B, Sq, H, D],
//     k and v [B, Skv, Hkv, D] (H a multiple of Hkv: repeated kv heads),
//     mask float32 added to the scores, attr scale (<= 0 or absent:
//     1/sqrt(D)).  out = softmax(q k^T * scale + mask) v, computed by
//     fusekit_attention's kernel (this op forwards to it).
//
// The runtime's own odml.scaled_dot_product_attention kernel (ai-edge-litert
// 2.3) scales q in place, and with grouped kv heads (1 < Hkv < H) its
// result is not the attention the op describes (measured); this kernel
// computes the described attention in every case (see docs/composites.md).
// odml.update_kv_cache, which keeps its cache in the interpreter's resource
// variables, is not provided.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flatbuffers/flexbuffers.h"
#include "fusekit/kernel_sdk.h"

namespace fusekit {
namespace {

template <typename P>
class ExternalKvCache {
 public:
  ExternalKvCache(const Attrs&, std::string*) {}

  TfLiteStatus Prepare(OpContext& ctx, In<float> k_cache, In<float> v_cache, In<P> position,
                       In<float> k_slice, In<float> v_slice, Out<float> k_out,
                       Out<float> v_out) {
    FUSEKIT_ENSURE(ctx, k_cache.rank() == 4 && k_slice.rank() == 4,
                   "k_cache and k_slice must have rank 4 [1, seq, kv_heads, head_dim], got "
                   "ranks %d and %d",
                   k_cache.rank(), k_slice.rank());
    FUSEKIT_ENSURE(ctx, v_cache.shape() == k_cache.shape(),
                   "v_cache must have k_cache's shape");
    FUSEKIT_ENSURE(ctx, v_slice.shape() == k_slice.shape(),
                   "v_slice must have k_slice's shape");
    FUSEKIT_ENSURE(ctx, k_cache.dim(0) == 1 && k_slice.dim(0) == 1,
                   "batch must be 1 (as in the runtime's own kernel), got %d and %d",
                   k_cache.dim(0), k_slice.dim(0));
    FUSEKIT_ENSURE(ctx, k_slice.dim(2) == k_cache.dim(2) && k_slice.dim(3) == k_cache.dim(3),
                   "slices [1, %d, %d, %d] must have the cache's heads and head_dim [1, %d, %d, "
                   "%d]",
                   k_slice.dim(1), k_slice.dim(2), k_slice.dim(3), k_cache.dim(1),
                   k_cache.dim(2), k_cache.dim(3));
    FUSEKIT_ENSURE(ctx, position.rank() == 1 && position.dim(0) == k_slice.dim(1),
                   "position must be [%d] (one per slice row), got rank %d", k_slice.dim(1),
                   position.rank());
    FUSEKIT_ENSURE_OK(ctx.ResizeOutput(k_out, k_cache.shape()));
    return ctx.ResizeOutput(v_out, v_cache.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> k_cache, In<float> v_cache, In<P> position,
                      In<float> k_slice, In<float> v_slice, Out<float> k_out,
                      Out<float> v_out) {
    const int64_t length = k_cache.dim(1);
    const int64_t row = int64_t{k_cache.dim(2)} * k_cache.dim(3);
    const size_t cache_bytes = sizeof(float) * static_cast<size_t>(length * row);
    // The same buffer when the runtime aliases them: nothing to copy.
    if (k_out.data() != k_cache.data()) std::memmove(k_out.data(), k_cache.data(), cache_bytes);
    if (v_out.data() != v_cache.data()) std::memmove(v_out.data(), v_cache.data(), cache_bytes);
    const P* pos = position.data();
    int64_t last = -1;
    for (int64_t i = 0; i < position.dim(0); ++i) {
      const int64_t p = static_cast<int64_t>(pos[i]);
      if (p < last) break;
      // -1 passes the "smaller than the one before" test (the runtime's
      // kernel then writes before the cache): refused here.
      FUSEKIT_ENSURE(ctx, p >= 0 && p < length,
                     "position[%lld] = %lld is outside the cache [0, %lld)",
                     static_cast<long long>(i), static_cast<long long>(p),
                     static_cast<long long>(length));
      last = p;
      std::memcpy(k_out.data() + p * row, k_slice.data() + i * row, sizeof(float) * row);
      std::memcpy(v_out.data() + p * row, v_slice.data() + i * row, sizeof(float) * row);
    }
    return kTfLiteOk;
  }
};

// The GenAI SDPA op as a forward to fusekit_attention's float32 kernel
// with an additive mask: the same node, the same operand positions.
class GenAiAttention {
 public:
  GenAiAttention(const Attrs& attrs, std::string* error) {
    const double scale = attrs.Float("scale");
    if (!std::isfinite(scale)) {
      *error = "attr 'scale' must be a finite number";
      return;
    }
    const KernelDef* def = FindKernel("fusekit_attention");
    if (def == nullptr) {
      *error = "fusekit_attention is not in this library";
      return;
    }
    for (const KernelVariant& v : def->variants) {
      if (v.input_types.size() == 4 && v.input_types[0] == kTfLiteFloat32 &&
          v.input_types[3] == kTfLiteFloat32) {
        variant_ = &v;
      }
    }
    if (variant_ == nullptr) {
      *error = "fusekit_attention has no float32 variant with a float mask";
      return;
    }
    // Attention's attrs: the scale when the op gives one (> 0), else none
    // (fusekit_attention then takes 1/sqrt(D), as this op does).
    flexbuffers::Builder fbb;
    fbb.Map([&]() {
      if (scale > 0) fbb.Float("scale", static_cast<float>(scale));
    });
    fbb.Finish();
    const std::vector<uint8_t>& bytes = fbb.GetBuffer();
    Attrs inner(bytes.data(), bytes.size());
    if (!inner.Validate(&def->attrs)) {
      *error = inner.error();
      return;
    }
    kernel_ = variant_->create(inner, error);
  }
  ~GenAiAttention() {
    if (kernel_ != nullptr) variant_->destroy(kernel_);
  }
  GenAiAttention(const GenAiAttention&) = delete;
  GenAiAttention& operator=(const GenAiAttention&) = delete;

  TfLiteStatus Prepare(OpContext& ctx, In<float> q, In<float> k, In<float> v, In<float> mask,
                       Out<float>) {
    FUSEKIT_ENSURE(ctx, q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && mask.rank() == 4,
                   "q, k, v and mask must have rank 4, got ranks %d, %d, %d and %d", q.rank(),
                   k.rank(), v.rank(), mask.rank());
    return variant_->prepare(kernel_, ctx);
  }
  TfLiteStatus Invoke(OpContext& ctx, In<float>, In<float>, In<float>, In<float>, Out<float>) {
    return variant_->invoke(kernel_, ctx);
  }

 private:
  const KernelVariant* variant_ = nullptr;
  void* kernel_ = nullptr;
};

}  // namespace

#define FUSEKIT_EXTERNAL_KV_CACHE_OPERANDS                                      \
  Inputs("k_cache", "v_cache", "position", "k_slice", "v_slice"),               \
      Outputs("updated_k_cache", "updated_v_cache")
FUSEKIT_REGISTER_KERNEL("odml.update_external_kv_cache", ExternalKvCache<int32_t>,
                        FUSEKIT_EXTERNAL_KV_CACHE_OPERANDS);
FUSEKIT_REGISTER_KERNEL("odml.update_external_kv_cache", ExternalKvCache<int64_t>,
                        FUSEKIT_EXTERNAL_KV_CACHE_OPERANDS);
FUSEKIT_REGISTER_KERNEL("odml.scaled_dot_product_attention", GenAiAttention,
                        Inputs("q", "k", "v", "mask"), Outputs("out"),
                        AttrSchema(attr::Float("scale", 0.0)));

}  // namespace fusekit
