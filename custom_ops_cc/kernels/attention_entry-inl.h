// fusekit_attention's entry points, one set per SIMD target: defined in
// attention_decode.cc (AttentionItem*), attention_prefill.cc
// (AttentionQueries*) and attention.cc (AttentionPanel, AttentionStoreHalf),
// chosen at run time in attention.cc.
// Included inside namespace fusekit::HWY_NAMESPACE, after
// fusekit/simd_begin.h (Highway's per-target include guard: no #pragma
// once, re-included for every SIMD target).

#if defined(FUSEKIT_KERNELS_ATTENTION_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_KERNELS_ATTENTION_ENTRY_INL_H_
#undef FUSEKIT_KERNELS_ATTENTION_ENTRY_INL_H_
#else
#define FUSEKIT_KERNELS_ATTENTION_ENTRY_INL_H_
#endif

// Keys per K panel (2 SIMD vectors).
int64_t AttentionPanel();
int64_t AttentionQueryPanel();
// out[0, n) = row[0, n) * factor rounded to float16 (the decode merge).
void AttentionStoreHalf(const float* row, int64_t n, float factor, hwy::float16_t* out);
// One decode item (attention_decode.cc).
void AttentionItemF32(const ::fusekit::attention::Problem<float>& p,
                      const ::fusekit::attention::Layout& l,
                      const ::fusekit::attention::Item& it, float* scratch,
                      const ::fusekit::attention::Partial* partial);
void AttentionItemF16(const ::fusekit::attention::Problem<hwy::float16_t>& p,
                      const ::fusekit::attention::Layout& l,
                      const ::fusekit::attention::Item& it, float* scratch,
                      const ::fusekit::attention::Partial* partial);
// One prefill item (attention_prefill.cc).
void AttentionQueriesF32(const ::fusekit::attention::Problem<float>& p, int64_t b, int64_t h,
                         int64_t i0, int64_t nq, float* scratch,
                         const ::fusekit::attention::Layout& l);
void AttentionQueriesF16(const ::fusekit::attention::Problem<hwy::float16_t>& p, int64_t b,
                         int64_t h, int64_t i0, int64_t nq, float* scratch,
                         const ::fusekit::attention::Layout& l);

#endif  // FUSEKIT_KERNELS_ATTENTION_ENTRY_INL_H_
