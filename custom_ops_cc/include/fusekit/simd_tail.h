// Masked loads and stores for the last, partial vector of a row, so kernels
// need no scalar tail loop.  Include inside `namespace HWY_NAMESPACE` of a
// kernel compiled with hwy/foreach_target.h (re-included per target).
//
// AVX-512 (any lane size) and AVX2 (32- and 64-bit lanes) have masked
// loads/stores that never touch the masked-off lanes (no fault past the end
// of a buffer, no write to a neighbour's bytes).  Highway's
// MaskedLoad/BlendedStore elsewhere -- other targets, and 16-bit lanes such
// as float16 on AVX2 -- load or store the whole vector, which can read past
// the end of a buffer or race with another thread writing the bytes after
// it; there the tail goes through a small stack buffer instead.

// No include guard: re-included for every SIMD target.

template <class D, typename T = hwy::HWY_NAMESPACE::TFromD<D>>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<D> LoadTail(D d, const T* HWY_RESTRICT p,
                                                   size_t count) {
  if constexpr (HWY_TARGET == HWY_AVX3 || (HWY_TARGET == HWY_AVX2 && sizeof(T) >= 4)) {
    return hwy::HWY_NAMESPACE::MaskedLoad(hwy::HWY_NAMESPACE::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T buffer[hwy::HWY_NAMESPACE::MaxLanes(d)] = {};
    for (size_t i = 0; i < count; ++i) buffer[i] = p[i];
    return hwy::HWY_NAMESPACE::Load(d, buffer);
  }
}

template <class D, typename T = hwy::HWY_NAMESPACE::TFromD<D>>
HWY_INLINE void StoreTail(hwy::HWY_NAMESPACE::VFromD<D> v, D d, T* HWY_RESTRICT p,
                          size_t count) {
  if constexpr (HWY_TARGET == HWY_AVX3 || (HWY_TARGET == HWY_AVX2 && sizeof(T) >= 4)) {
    hwy::HWY_NAMESPACE::BlendedStore(v, hwy::HWY_NAMESPACE::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T buffer[hwy::HWY_NAMESPACE::MaxLanes(d)];
    hwy::HWY_NAMESPACE::Store(v, d, buffer);
    for (size_t i = 0; i < count; ++i) p[i] = buffer[i];
  }
}
